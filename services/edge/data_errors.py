"""A value the database refuses to store is the caller's bad input: 422 validation_error, not 500.

Postgres rejects e.g. a NUL character in a text (psycopg.DataError: "text fields cannot contain
NUL (0x00) bytes") or a number beyond a column's range, after every model validated the request.
Each value is bounded in the models where a bound is known; this catches the rest, so hostile
input can never turn into a 5xx. The transaction has been rolled back by then.
"""

import logging

import psycopg
from fastapi import FastAPI, Request
from fastapi.responses import Response

from contracts.errors import ErrorCode
from services.edge.errors import error_response

log = logging.getLogger(__name__)


def install_data_error_handler(app: FastAPI) -> None:
    @app.exception_handler(psycopg.DataError)
    async def _data_error(request: Request, exc: psycopg.DataError) -> Response:
        log.info("refused a value the database cannot store: %s", type(exc).__name__)
        return error_response(
            request,
            422,
            ErrorCode.VALIDATION_ERROR,
            "A value cannot be stored: e.g. a NUL character in a text, or a number out of range.",
        )
