"""The web console at /console: static pages that call only the public API (issue 7)."""

from fastapi import APIRouter


def router() -> APIRouter:
    return APIRouter(include_in_schema=False)
