"""CSV exports of the analytics (`Accept: text/csv`): rows are written as they are read, so a
month of a busy account is never held in memory, neither as rows nor as text."""

import csv
import io
from collections.abc import AsyncIterator, Iterable, Sequence

from fastapi import Request
from fastapi.responses import StreamingResponse

CSV = "text/csv"
# For the OpenAPI of a route that also answers in CSV.
CSV_RESPONSE: dict[int | str, dict[str, object]] = {
    200: {"content": {CSV: {"schema": {"type": "string"}}}, "description": "JSON, or CSV with `Accept: text/csv`"}
}


def wants_csv(request: Request) -> bool:
    return CSV in request.headers.get("accept", "").lower()


def cell(value: object) -> object:
    """None as an empty cell (an unpriced cost), booleans as true/false like the JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def lines(rows: Iterable[Sequence[object]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerows([cell(v) for v in row] for row in rows)
    return buffer.getvalue()


def response(header: Sequence[str], chunks: AsyncIterator[list[Sequence[object]]], filename: str) -> StreamingResponse:
    """A header line, then each chunk of rows as soon as it is produced."""

    async def body() -> AsyncIterator[str]:
        yield lines([header])
        async for rows in chunks:
            if rows:
                yield lines(rows)

    return StreamingResponse(
        body(), media_type=f"{CSV}; charset=utf-8", headers={"Content-Disposition": f'attachment; filename="{filename}"'}
    )
