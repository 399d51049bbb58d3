"""CSV exports of the analytics (`Accept: text/csv`): rows are written as they are read, so a
month of a busy account is never held in memory, neither as rows nor as text."""

import csv
import io
from collections.abc import AsyncIterator, Iterable, Sequence

from fastapi import Request
from fastapi.responses import StreamingResponse

from contracts.metering_api import ActivityItem, ByKey, ProviderItem, TrendSeries

CSV = "text/csv"
# For the OpenAPI of a route that also answers in CSV.
CSV_RESPONSE: dict[int | str, dict[str, object]] = {
    200: {"content": {CSV: {"schema": {"type": "string"}}}, "description": "JSON, or CSV with `Accept: text/csv`"}
}


def wants_csv(request: Request) -> bool:
    return CSV in request.headers.get("accept", "").lower()


# A spreadsheet runs a cell that starts with one of these as a formula (`=HYPERLINK(...)` in a
# caller's User-Agent would become a live link): OWASP's CSV-injection rule prefixes such a text
# cell with a single quote, so that it is shown as the text it is. Numbers are left alone.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def cell(value: object) -> object:
    """None as an empty cell (an unpriced cost), booleans as true/false like the JSON, and a text
    that a spreadsheet would take for a formula as text."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def lines(rows: Iterable[Sequence[object]]) -> str:
    buffer = io.StringIO()
    # RFC 4180's CRLF: the writer quotes a field that holds any character of the line terminator,
    # so a lone CR in a caller's text is quoted too instead of splitting its row in two.
    writer = csv.writer(buffer, lineterminator="\r\n")
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


# ---- the analytics' columns ----------------------------------------------------------------------
TREND = ["key", "t", "input_tokens", "output_tokens", "total_tokens", "calls", "estimated_cost", "priced"]
PROVIDER = ["provider", "model", "api_key_id", "masked_key", "calls", "total_tokens", "estimated_cost", "priced"]
ACTIVITY = [
    "time",
    "api_key_id",
    "masked_key",
    "method",
    "path",
    "status",
    "ip",
    "user_agent",
    "latency_ms",
    "error_code",
    "count",
    "service",
    # (v4) after the v2/v3 columns, so that a reader of the older columns by position still reads them
    "kind",
    "model_not_allowed",
    "provider",
    "model",
    "resource",
    "quantity",
]


async def trend_rows(blocks: AsyncIterator[list[TrendSeries]]) -> AsyncIterator[list[Sequence[object]]]:
    async for series in blocks:
        yield [
            [s.key, p.t.isoformat(), p.input_tokens, p.output_tokens, p.total_tokens, p.calls, p.estimated_cost, p.priced]
            for s in series
            for p in s.points
        ]


async def provider_rows(blocks: AsyncIterator[list[ProviderItem]]) -> AsyncIterator[list[Sequence[object]]]:
    """Every column of the JSON items, with or without group_by=api_key (empty key cells without)."""
    async for items in blocks:
        yield [[getattr(item, c) for c in PROVIDER] for item in items]


async def activity_rows(blocks: AsyncIterator[list[ActivityItem]]) -> AsyncIterator[list[Sequence[object]]]:
    async for items in blocks:
        yield [[item.time.isoformat(), *(getattr(item, c) for c in ACTIVITY[1:])] for item in items]


# (v4) the by-key view: one row per key and limit; a key without limits is one row with its
# limit cells empty, so that every key of the view is in the file.
BY_KEY = ["api_key_id", "masked_key", "resource", "period", "window", "used", "amount", "remaining", "resets_at"]


async def by_key_rows(view: ByKey) -> AsyncIterator[list[Sequence[object]]]:
    rows: list[Sequence[object]] = []
    for item in view.items:
        key = [str(item.api_key_id), item.masked_key]
        if not item.limits:
            rows.append([*key, None, None, None, None, None, None, None])
        for limit in item.limits:
            resets = limit.model_dump(mode="json")["resets_at"]  # as the JSON writes it
            rows.append(
                [*key, limit.resource.value, limit.period.value, limit.window, limit.used, limit.amount, limit.remaining, resets]
            )
    yield rows
