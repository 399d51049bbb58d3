"""`POST /v1/chat/completions`, OpenAI-compatible (plain JSON and SSE streaming), on a fake model.

Each call: the caller's key is admitted by Tollgate (the middleware verifies it, or reads the
verdict the nginx snippet in front already got); `prompt + max_tokens` of `ai_tokens` is reserved
before the model is called, so concurrent calls can never spend more than the quota; the answer
streams; the reservation settles with the real usage (`prompt_tokens`, `completion_tokens`),
under the provider and model actually called."""

import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ai_gateway import fake_model
from tollgate_client import AsyncTollgate, TollgateError, TollgateMiddleware, Verdict

AI_TOKENS = "ai_tokens"
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class GatewaySettings:
    tollgate_url: str
    service_token: str  # scopes keys:verify (unless behind the ingress) and usage:write
    trust_ingress: bool = False  # behind the shipped nginx/Caddy snippet: it verified the key already
    token_delay: float = 0.02  # the fake model's pace, seconds per token
    reservation_ttl: int = 600  # seconds: longer than any answer takes

    @classmethod
    def from_env(cls) -> "GatewaySettings":
        return cls(
            tollgate_url=os.environ.get("TOLLGATE_URL", "http://127.0.0.1:8080"),
            service_token=os.environ["TOLLGATE_SERVICE_TOKEN"],
            trust_ingress=os.environ.get("AI_GATEWAY_TRUST_INGRESS", "") in ("1", "true"),
            token_delay=float(os.environ.get("AI_GATEWAY_TOKEN_DELAY", "0.02")),
        )


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # temperature, top_p, ...: accepted, the fake ignores them

    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32768)
    stream: bool = False
    stream_options: StreamOptions | None = None


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None, details: Any = None) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        error["details"] = details
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def create_app(settings: GatewaySettings, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    tollgate = AsyncTollgate(settings.tollgate_url, settings.service_token, source="ai-gateway", transport=transport)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await tollgate.aclose()

    app = FastAPI(title="AI gateway (Tollgate example)", lifespan=lifespan)
    # One line protects every route: verify each call (gated on ai_tokens), or trust the ingress's.
    app.add_middleware(
        TollgateMiddleware,
        tollgate=None if settings.trust_ingress else tollgate,
        trust_ingress=settings.trust_ingress,
        resource=AI_TOKENS,
        # The model this gateway will actually call, whatever the caller names in the body or the
        # query: a key allowed only other models cannot get past verify by naming one of them.
        model=fake_model.QUALIFIED,
    )

    @app.exception_handler(TollgateError)
    async def tollgate_refused(_request: Request, error: TollgateError) -> JSONResponse:
        # Tollgate's own answer (a reservation over the quota: 403 insufficient_quota), passed on.
        headers = {"Retry-After": error.headers["retry-after"]} if "retry-after" in error.headers else None
        return _error(error.status, error.code, error.message, headers, error.details)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        details = [{"field": ".".join(map(str, e["loc"])), "message": e["msg"]} for e in error.errors()]
        return _error(422, "validation_error", "The request body is not a valid chat completion request.", details=details)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        verdict: Verdict = request.state.tollgate
        assert verdict.account_id is not None  # an admitted call always names its account
        messages = [(m.role, fake_model.text_of(m.content)) for m in body.messages]
        call = _Completion(messages, body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS)
        tokens = call.tokens(tollgate, verdict, settings)
        await anext(tokens)  # the reservation, made before any byte is answered (refused: 403 here)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(call.sse(tokens, include_usage), media_type="text/event-stream")
        text = "".join([token async for token in tokens])
        return JSONResponse(call.whole(text))

    return app


class _Completion:
    """One completion: the model called under a reservation, answered whole or as SSE chunks."""

    def __init__(self, messages: list[tuple[str, str]], max_tokens: int) -> None:
        self.messages, self.max_tokens = messages, max_tokens
        self.prompt_tokens = fake_model.prompt_tokens(messages)
        self.completion_tokens = 0
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    async def tokens(self, tollgate: AsyncTollgate, verdict: Verdict, settings: GatewaySettings) -> AsyncIterator[str]:
        """First yields "" once the reservation is made, then the model's tokens. Settles with what
        was produced, also when the caller hangs up mid-stream (the prompt and those tokens were served)."""
        assert verdict.account_id is not None
        amount = self.prompt_tokens + self.max_tokens
        # Held for the caller's key too: a key's own ai_tokens limit is judged like the account's
        # quota, so concurrent streams on one key cannot spend past it.
        key = verdict.api_key_id
        async with tollgate.reserve(verdict.account_id, AI_TOKENS, amount, ttl=settings.reservation_ttl, api_key_id=key) as hold:
            yield ""
            try:
                async for token in fake_model.complete(self.messages, self.max_tokens, settings.token_delay):
                    self.completion_tokens += 1
                    yield token
            finally:
                hold.settle(
                    self.prompt_tokens + self.completion_tokens,
                    input_tokens=self.prompt_tokens,
                    output_tokens=self.completion_tokens,
                    provider=fake_model.PROVIDER,
                    model=fake_model.MODEL,
                )

    @property
    def finish_reason(self) -> Literal["stop", "length"]:
        return "length" if self.completion_tokens >= self.max_tokens else "stop"

    def usage(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}

    def whole(self, text: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": fake_model.MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": self.finish_reason}],
            "usage": self.usage(),
        }

    def _chunk(self, delta: dict[str, str], finish: str | None) -> str:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": fake_model.MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {_json(chunk)}\n\n"

    async def sse(self, tokens: AsyncIterator[str], include_usage: bool) -> AsyncIterator[str]:
        yield self._chunk({"role": "assistant", "content": ""}, None)
        async for token in tokens:  # ends after the reservation is settled
            yield self._chunk({"content": token}, None)
        yield self._chunk({}, self.finish_reason)
        if include_usage:
            usage = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": fake_model.MODEL}
            yield f"data: {_json({**usage, 'choices': [], 'usage': self.usage()})}\n\n"
        yield "data: [DONE]\n\n"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
