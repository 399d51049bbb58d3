"""The web console at /console: static pages that call only the public API (issue 7).

No build step and nothing from a CDN: plain HTML, CSS and ES modules in `static/`, served by
these routes in every mode. The pages hold a console session (sessionStorage) and talk to the
same public endpoints any client would use.
"""

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from services.edge import not_found

STATIC = Path(__file__).resolve().parent / "static"
# Client-side routes: each serves the same page, so links in e-mails and notifications work.
PAGES = frozenset({"signin", "register", "keys", "quota", "usage", "alerts", "plan", "members", "audit"})

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}

# Same-origin only: no inline script, no third-party hosts (there are none to reach anyway).
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
    ),
    # frame-ancestors above keeps other sites from framing the console (clickjacking of its buttons:
    # pay, delete a key); browsers that predate it read only this header.
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Assets change with the code; revalidate (ETag) rather than serve a stale page.
    "Cache-Control": "no-cache",
}


def _assets() -> dict[str, Path]:
    """The whitelist of servable files: exactly what ships in static/ (no path traversal)."""
    return {p.name: p for p in STATIC.iterdir() if p.is_file() and p.suffix in _MEDIA_TYPES}


def router() -> APIRouter:
    assets = _assets()
    api = APIRouter(include_in_schema=False)

    @api.get("/console")
    async def console_page() -> FileResponse:
        return FileResponse(assets["index.html"], media_type=_MEDIA_TYPES[".html"], headers=_HEADERS)

    @api.get("/console/")
    async def console_slash() -> RedirectResponse:
        return RedirectResponse("/console", status_code=308)

    @api.get("/console/{page}")
    async def console_route(page: str) -> FileResponse:
        if page not in PAGES:
            raise not_found("console page")
        return FileResponse(assets["index.html"], media_type=_MEDIA_TYPES[".html"], headers=_HEADERS)

    @api.get("/console/assets/{name}")
    async def console_asset(name: str) -> FileResponse:
        path = assets.get(name)
        if path is None:
            raise not_found("console file")
        return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers=_HEADERS)

    return api
