"""The screen: an API-key call's refusals that need no route, answered before the framework.

A 401 for the key, or a 429 from the rate limiter's copy of a refusal, is decided by the edge
alone (`Edge.screen`: the same checks, in the same order, as the route's dependency). Answered
from here, a flood of them skips Starlette's exception layer, the routing and FastAPI's dependency
solving, which cost a refused call more than the edge's own work (BENCHMARKS.md, "http_load",
round 11). It sits inside RequestMiddleware (the call's context and event, the response headers)
and the body limit (a 413 still comes first). While Redis judges the call that a key's refusal
copy let through, the key's other calls wait for that judgment and are screened again: a flood
would otherwise send every call that arrives during the round trip down the whole route to Redis.
"""

import asyncio

from starlette.types import ASGIApp, Receive, Scope, Send

from services.edge.edge import Edge
from services.edge.errors import api_error_response


class RefusalScreen:
    def __init__(self, app: ASGIApp, edge: Edge) -> None:
        self.app = app
        self.edge = edge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.edge.screen(scope)
            judging = self.edge.judging(scope) if refusal is None else None
            if judging is not None:  # the key's limit is being judged again: its answer decides this one too
                await asyncio.shield(judging)
                refusal = self.edge.screen(scope)
            if refusal is not None:
                await api_error_response(scope, refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)
