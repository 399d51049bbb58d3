"""The screen: an API-key call's refusals that need no route, answered before the framework.

A 401 for the key, or a 429 from the rate limiter's copy of a refusal, is decided by the edge
alone (`Edge.screen`: the same checks, in the same order, as the route's dependency). Answered
from here, a flood of them skips Starlette's exception layer, the routing and FastAPI's dependency
solving, which cost a refused call more than the edge's own work (BENCHMARKS.md, "http_load",
round 11). It sits inside RequestMiddleware (the call's context and event, the response headers)
and the body limit (a 413 still comes first). While Redis judges the call that a key's refusal
copy let through, the key's other calls wait for that judgment and are screened again: a flood
would otherwise send every call that arrives during the round trip down the whole route to Redis.

Refusals yield to other tenants' served calls: while this process has calls past the screen in
flight that are not of the refused call's account, a refusal is answered after `REFUSAL_YIELD_S`. A
client that floods over one connection at a time (as HTTP/1.1 clients do) then gets at most ten
answers a second per connection while others are served, and cannot starve them of the cores; a
flood alone, or beside its own account's admitted calls, is answered at once (BENCHMARKS.md,
"http_load", rounds 16 and 18). An unknown key's refusal is nobody's: it yields to every served
call. The refusal is decided before the wait, so the wait changes only when it is heard.
"""

import asyncio
from collections import Counter
from uuid import UUID

from starlette.types import ASGIApp, Receive, Scope, Send

from services.edge.context import context_of
from services.edge.edge import Edge
from services.edge.errors import api_error_response

REFUSAL_YIELD_S = 0.1


class RefusalScreen:
    def __init__(self, app: ASGIApp, edge: Edge) -> None:
        self.app = app
        self.edge = edge
        self._serving = 0  # this process's HTTP calls past the screen, not yet answered
        self._serving_of: Counter[UUID] = Counter()  # those of them made with an API key, by its account

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.edge.screen(scope)
        judging = self.edge.judging(scope) if refusal is None else None
        if judging is not None:  # the key's limit is being judged again: its answer decides this one too
            await asyncio.shield(judging)
            refusal = self.edge.screen(scope)
        if refusal is not None:
            response = api_error_response(scope, refusal)
            account = _account(scope)
            if self._serving > (self._serving_of[account] if account is not None else 0):
                await asyncio.sleep(REFUSAL_YIELD_S)
            await response(scope, receive, send)
            return
        account = _account(scope)
        self._serving += 1
        if account is not None:
            self._serving_of[account] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._serving -= 1
            if account is not None:
                self._serving_of[account] -= 1
                if not self._serving_of[account]:
                    del self._serving_of[account]  # (a flood of accounts must not grow it)


def _account(scope: Scope) -> UUID | None:
    """The account of a screened call: its API key's, once the screen let it through or logged its
    refusal (a known key's); None for anything else (a session, an unknown key)."""
    context = context_of(scope)
    if context.principal is not None:
        return context.principal.account_id
    return context.call.account_id if context.call is not None else None
