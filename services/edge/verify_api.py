"""(v3) Protecting platform services outside Tollgate: verify (a service asks) and authorize (an
ingress asks). Both hand the call to `Edge.decide`, the code that guards Tollgate's own routes.

verify answers 200 for every decision, with the decision in the body. authorize answers an
ingress in its own language: 200 and the caller's identity in `X-Tollgate-*` headers for the
ingress to pass upstream, or the refusal a protected route would answer (status, body, headers).
nginx's `auth_request` passes only 401 and 403 on, so every refusal also carries its status and
body in `X-Tollgate-Status` and `X-Tollgate-Error`, from which the shipped nginx snippet answers
(deploy/ingress/nginx.conf)."""

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote
from uuid import UUID

import msgspec
from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import Response
from pydantic import ValidationError

from contracts.common import Resource, Role, ServiceScope, Tier
from contracts.edge_api import VerifiedKeyLimit, VerifiedQuota, VerifiedRateLimit, VerifyAnswer, VerifyRequest
from contracts.errors import ErrorBody, ErrorCode, ErrorDetail
from contracts.key_limits import LimitPeriod
from services.edge.calls import client_ip, forwarded_for, parse_networks
from services.edge.edge import Edge
from services.edge.errors import ApiError, request_id_of
from services.edge.openapi_security import INGRESS_SERVICE_TOKEN, SERVICE_TOKEN, accepts
from services.edge.service_tokens import ServicePrincipal
from services.edge.verdict import ServiceCall, Verdict
from services.runtime.platform.logs import Throttled

log = logging.getLogger(__name__)
VERIFY_PATH = "/api/edge/verify"
AUTHORIZE_PATH = "/api/edge/authorize"
ROLE_ORDER = tuple(Role)  # a user has one role; a key from before members may list several: the first


def _role(verdict: Verdict) -> Role | None:
    if verdict.principal is None or not verdict.principal.roles:
        return None
    return min(verdict.principal.roles, key=ROLE_ORDER.index)


def _error_body(verdict: Verdict, request_id: str) -> ErrorBody | None:
    refusal = verdict.refusal
    if refusal is None:
        return None
    detail = ErrorDetail(code=refusal.code, message=refusal.message, request_id=request_id, details=refusal.details)
    return ErrorBody(error=detail)


def _rate_limit(headers: dict[str, str], shapes: "_Shapes") -> Any:
    if "X-RateLimit-Limit" not in headers:
        return None  # refused before the rate limiter judged it (e.g. an unknown key)
    return shapes.rate_limit(
        limit=int(headers["X-RateLimit-Limit"]),
        remaining=int(headers["X-RateLimit-Remaining"]),
        reset=int(headers["X-RateLimit-Reset"]),
    )


# ---- verify's answer: the contract's model, or its msgspec mirror for the hot case -----------------
class _FastRateLimit(msgspec.Struct, gc=False):
    limit: int
    remaining: int
    reset: int


class _FastQuota(msgspec.Struct, gc=False):
    resource: Resource
    total: int
    used: int
    reserved: int
    remaining: int
    status: str


class _FastKeyLimit(msgspec.Struct, gc=False):
    resource: Resource
    period: LimitPeriod
    remaining: int


class _FastAnswer(msgspec.Struct):
    """VerifyAnswer's fields in its order, for an admitted call (`error` is null)."""

    valid: bool
    code: str
    status: int
    account_id: UUID | None
    api_key_id: UUID | None
    user_id: UUID | None
    role: Role | None
    plan: Tier | None
    rate_limit: _FastRateLimit | None
    retry_after: int | None
    quota: _FastQuota | None
    error: None
    key_limits: list[_FastKeyLimit]


@dataclass(frozen=True, slots=True)
class _Shapes:
    """What an answer is built of: the contract's models, or their mirrors (the same keyword arguments)."""

    answer: Callable[..., Any]
    rate_limit: Callable[..., Any]
    quota: Callable[..., Any]
    key_limit: Callable[..., Any]


_MODELS = _Shapes(VerifyAnswer, VerifiedRateLimit, VerifiedQuota, VerifiedKeyLimit)
_MIRRORS = _Shapes(_FastAnswer, _FastRateLimit, _FastQuota, _FastKeyLimit)
_ENCODE = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Standing:
    """Where the verified key's account and the key stand, read from this process's projections."""

    quota: tuple[Resource, int, int, int, bool] | None  # resource, total, used, reserved, exhausted
    key_limits: list[tuple[Resource, LimitPeriod, int]]  # each own limit: resource, period, remaining


def standing_of(edge: Edge, call: ServiceCall, verdict: Verdict) -> Standing:
    principal = verdict.principal
    quota = None
    if principal is not None and call.resource is not None:
        now = datetime.now(UTC)
        used, reserved, total = edge.quota.position(principal.account_id, call.resource, now)
        exhausted = edge.quota.is_blocked(principal.account_id, call.resource, now)
        quota = (call.resource, total, used, reserved, exhausted)
    key_limits = []
    if principal is not None and principal.api_key_id is not None:
        now = datetime.now(UTC)
        for standing in edge.key_standings(principal.api_key_id, now):
            limit = standing.limit
            key_limits.append((limit.resource, limit.period, standing.remaining))
    return Standing(quota, key_limits)


def _answer(verdict: Verdict, standing: Standing, request_id: str, shapes: _Shapes) -> Any:
    principal = verdict.principal
    quota = None
    if standing.quota is not None:
        resource, total, used, reserved, exhausted = standing.quota
        quota = shapes.quota(
            resource=resource,
            total=total,
            used=used,
            reserved=reserved,
            remaining=max(0, total - used - reserved),
            status="exhausted" if exhausted else "available",
        )
    key_limits = [shapes.key_limit(resource=r, period=p, remaining=left) for r, p, left in standing.key_limits]
    retry_after = verdict.headers.get("Retry-After")
    return shapes.answer(
        valid=verdict.refusal is None,
        code="valid" if verdict.refusal is None else verdict.refusal.code.value,
        status=verdict.status,
        account_id=principal.account_id if principal else None,
        api_key_id=principal.api_key_id if principal else None,
        user_id=principal.user_id if principal else None,
        role=_role(verdict),
        plan=verdict.plan,
        rate_limit=_rate_limit(verdict.headers, shapes),
        retry_after=int(retry_after) if retry_after is not None else None,
        quota=quota,
        error=_error_body(verdict, request_id),
        key_limits=key_limits,
    )


def answer_of(edge: Edge, call: ServiceCall, verdict: Verdict, request_id: str) -> VerifyAnswer:
    answer: VerifyAnswer = _answer(verdict, standing_of(edge, call, verdict), request_id, _MODELS)
    return answer


def answer_json(verdict: Verdict, standing: Standing, request_id: str) -> bytes:
    """`answer_of(...).model_dump_json()`'s very bytes. An admitted call's answer (the hot case: no
    error body, whose `details` may hold anything) is written by msgspec from mirrors of the
    contract's models, without building and validating them (tests/unit/test_verify_answer_json.py
    proves the bytes the same); any other answer, or one msgspec cannot write, by the model."""
    if verdict.refusal is None:
        try:
            return _ENCODE(_answer(verdict, standing, request_id, _MIRRORS))
        except (msgspec.EncodeError, UnicodeEncodeError, OverflowError):
            pass
    answer: VerifyAnswer = _answer(verdict, standing, request_id, _MODELS)
    return answer.model_dump_json().encode()


def service_call(body: VerifyRequest, service: ServicePrincipal) -> ServiceCall:
    """The call verify's body (or authorize's headers) describe, as the service holding `service` received it."""
    return ServiceCall(
        key=body.key,
        method=body.method,
        path=body.path,
        ip=body.ip,
        user_agent=body.user_agent,
        service=service.name,
        resource=body.resource,
        cost=body.cost,
        permission=body.permission,
        model=body.model,
    )


def bearer_token(authorization: str) -> str:
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def forwarded_request(headers: Mapping[str, str]) -> tuple[str, str]:
    """The method and URI of the request an ingress asks about: its X-Forwarded-* (Caddy,
    Traefik) or X-Original-* (nginx) headers (lower-case names)."""
    method = headers.get("x-forwarded-method") or headers.get("x-original-method") or ""
    return method, headers.get("x-forwarded-uri") or headers.get("x-original-uri") or ""


def _original_request(request: Request) -> tuple[str, str]:
    """`forwarded_request`, else (Envoy) this request's own method and the path after
    /api/edge/authorize, as the caller sent it: percent-encoded still, like the URI nginx and
    Caddy forward. The decoded path would turn a `%3F` into the `?` that ends the path judged
    (`POST /v1/chat/completions%3F/../../admin` judged as `/v1/chat/completions`)."""
    headers = request.headers
    forwarded = request.path_params.get("forwarded")
    if forwarded is not None and not (headers.get("x-forwarded-uri") or headers.get("x-original-uri")):
        query = request.url.query
        return request.method, _raw_forwarded(request.scope, forwarded) + ("?" + query if query else "")
    return forwarded_request(headers)


def _raw_forwarded(scope: Mapping[str, Any], forwarded: str) -> str:
    """The original path of Envoy's shape from the request's raw path (what follows
    `/api/edge/authorize`); from the decoded `forwarded`, encoded again, when the raw path does not
    spell the prefix plainly (an ASGI server without `raw_path`, or an encoded prefix)."""
    raw = scope.get("raw_path")
    prefix = (scope.get("root_path", "") + AUTHORIZE_PATH + "/").encode()
    if isinstance(raw, bytes) and raw.startswith(prefix):
        return "/" + raw[len(prefix) :].partition(b"?")[0].decode("latin-1")
    return quote("/" + forwarded, safe="/")


class Ingress:
    """authorize's two halves around `Edge.decide`, shared by its route and the fast path
    (verify_fast.py): the call an ingress's headers describe, and the answer in headers."""

    def __init__(self, edge: Edge) -> None:
        self._trusted = parse_networks(edge.settings.trusted_proxies)

    def described(self, headers: Mapping[str, str], method: str, uri: str, peer: str, hops: str) -> dict[str, Any]:
        """verify's body for the call (`VerifyRequest` judges it); `peer`: the ingress's address,
        `hops`: the whole X-Forwarded-For (`forwarded_for`: every line of it, not the first)."""
        return {
            "key": bearer_token(headers.get("authorization", "")),
            "method": method,
            "path": uri.partition("?")[0],
            "ip": client_ip(peer, hops, self._trusted),
            "user_agent": headers.get("user-agent", "")[:512],
            "resource": headers.get("x-tollgate-resource") or None,
            "cost": headers.get("x-tollgate-cost") or 0,
            "permission": headers.get("x-tollgate-permission") or None,
            "model": headers.get("x-tollgate-model") or None,
        }

    def answer(self, verdict: Verdict, request_id: str) -> Response:
        answer = dict(verdict.headers)
        if verdict.refusal is None:
            principal = verdict.principal
            assert principal is not None and principal.api_key_id is not None
            role = _role(verdict)
            answer.update(
                {
                    "X-Tollgate-Account": str(principal.account_id),
                    "X-Tollgate-Key": str(principal.api_key_id),
                    "X-Tollgate-User": str(principal.user_id or ""),
                    "X-Tollgate-Role": role.value if role else "",
                    "X-Tollgate-Plan": verdict.plan.value if verdict.plan else "",
                }
            )
            return Response(status_code=200, headers=answer)
        error = _error_body(verdict, request_id)
        assert error is not None
        return self.refused(verdict.status, error, answer)

    @staticmethod
    def refused(status: int, error: ErrorBody, headers: dict[str, str]) -> Response:
        """A refusal as every ingress passes it on: the status and the contract's body, and both again in
        `X-Tollgate-Status` and `X-Tollgate-Error` for nginx (which passes only 401 and 403 on)."""
        # ASCII JSON on one line: the same bytes are a header's value (nginx answers from it)
        text = json.dumps(error.model_dump(mode="json", exclude_none=True), separators=(",", ":"))
        headers = {**headers, "X-Tollgate-Status": str(status), "X-Tollgate-Error": text}
        return Response(text, status_code=status, headers=headers, media_type="application/json")


def verifier_of(edge: Edge) -> Callable[[Request], Awaitable[ServicePrincipal]]:
    """verify's credential: a live service token with keys:verify (`Edge.requires_service`). A
    missing one is 401 invalid_service_token, as a revoked one (API.md, "Not decisions"): on verify,
    `missing_credentials` is the decision for a caller who sent no key, never the service's own
    problem, just as authorize marks the ingress's."""
    service_only = edge.requires_service(ServiceScope.KEYS_VERIFY)

    async def verifier(request: Request) -> ServicePrincipal:
        if not bearer_token(request.headers.get("authorization", "")):
            raise ApiError(
                401,
                ErrorCode.INVALID_SERVICE_TOKEN,
                "Send the service's own token: Authorization: Bearer st-...",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await service_only(request)

    return accepts(verifier, SERVICE_TOKEN)


def build_router(edge: Edge) -> APIRouter:
    router = APIRouter(prefix="/api/edge", tags=["protecting services (v3)"])
    verifier = verifier_of(edge)
    ingress = Ingress(edge)
    ingress_log = Throttled(log)

    @router.post(
        "/verify",
        response_model=VerifyAnswer,
        summary="The edge's decision for a call another service received (200 for every decision)",
        description=(
            "A platform service that is not a Tollgate process admits its caller's `sk-` key here and gets exactly the "
            "decision a protected route gets: status, expiry, (v4) the key's allowed addresses, routes and models "
            "(403 `ip_not_allowed`, `route_not_allowed`, `model_not_allowed`: `model` is what the service will call; "
            "a key with allowed models is refused a call without one), role, rate limit (the key's own and the "
            "plan's: the narrower wins), quota gate and overload, in that order. "
            "`valid: true` is an admitted, metered call: it counts in `api_calls` and appears in `calls.v1` and the "
            "activity log with the service token's name. A refusal is logged like any refused call and counts nothing. "
            "`resource` + `cost` gate without counting (usage events count). Not decisions: a missing or revoked token "
            "is 401 `invalid_service_token`; a customer's credential or a token without `keys:verify` is 403; a bad "
            "body is 422."
        ),
    )
    async def verify(
        body: VerifyRequest, request: Request, service: Annotated[ServicePrincipal, Depends(verifier)]
    ) -> VerifyAnswer:
        call = service_call(body, service)
        request_id = request_id_of(request)
        return answer_of(edge, call, await edge.decide(call, request_id), request_id)

    async def ingress_service(
        request: Request, token: Annotated[str, Header(alias="X-Tollgate-Service-Token")] = ""
    ) -> ServicePrincipal:
        """The ingress's own token. Its problems are the ingress's, not the caller's: marked
        `X-Tollgate-Ingress-Error: 1` and logged as errors, so a misconfiguration shows."""
        try:
            if not token:
                raise ApiError(401, ErrorCode.INVALID_SERVICE_TOKEN, "Send the ingress's X-Tollgate-Service-Token.")
            return await edge.authenticate_service(token, ServiceScope.KEYS_VERIFY, datetime.now(UTC))
        except ApiError as problem:
            ingress_log.error(f"authorize: the ingress's service token was refused ({problem.code.value}); check the ingress")
            problem.headers = {**problem.headers, "X-Tollgate-Ingress-Error": "1"}
            raise

    accepts(ingress_service, INGRESS_SERVICE_TOKEN)

    @router.get(
        "/authorize",
        status_code=200,
        response_class=Response,
        summary="An ingress's auth subrequest (nginx auth_request, Caddy forward_auth, Traefik ForwardAuth, Envoy ext_authz)",
        description=(
            "The ingress sends its token as `X-Tollgate-Service-Token`, the caller's `Authorization` unchanged, the "
            "original request as `X-Forwarded-Method` + `X-Forwarded-Uri` (or `X-Original-Method` + `X-Original-URI`), "
            "the caller's address in `X-Forwarded-For` (believed through TRUSTED_PROXIES), and optionally "
            "`X-Tollgate-Resource`, `X-Tollgate-Cost`, `X-Tollgate-Permission` and (v4) `X-Tollgate-Model` (the "
            "`provider/model` the upstream will call; judged by the key's allowed models). Admitted: 200, empty, with "
            "`X-Tollgate-Account`, `-Key`, `-User`, `-Role`, `-Plan` and `X-RateLimit-*` for the upstream. Refused: "
            "the status, body and headers a protected route would answer, plus `X-Tollgate-Status` and "
            "`X-Tollgate-Error` (the body) for nginx, which passes only 401 and 403 from an auth subrequest."
        ),
        responses={200: {"description": "Admitted: the caller's identity in X-Tollgate-* headers."}},
    )
    async def authorize(request: Request, service: Annotated[ServicePrincipal, Depends(ingress_service)]) -> Response:
        method, uri = _original_request(request)
        client = request.scope.get("client")
        try:
            peer, hops = client[0] if client else "", forwarded_for(request.headers)
            body = VerifyRequest.model_validate(ingress.described(request.headers, method, uri, peer, hops))
        except ValidationError as invalid:
            details = [{"field": ".".join(map(str, e["loc"])), "message": e["msg"]} for e in invalid.errors()]
            message = "The forwarded request is not valid."
            detail = ErrorDetail(
                code=ErrorCode.VALIDATION_ERROR, message=message, request_id=request_id_of(request), details=details
            )
            # in nginx's headers too: its auth_request would make any status but 401 and 403 a 500
            return ingress.refused(422, ErrorBody(error=detail), {})
        call = service_call(body, service)
        request_id = request_id_of(request)
        return ingress.answer(await edge.decide(call, request_id), request_id)

    # One route per method, each with its own operationId: one route of several methods gives them
    # all the same id, taken from whichever method its set yields first (a different document per run).
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):  # (HEAD: no body for a refusal)
        router.add_api_route(
            "/authorize/{forwarded:path}",
            authorize,
            methods=[method],
            operation_id=f"authorize_forwarded_{method.lower()}",
            status_code=200,
            response_class=Response,
            summary="authorize for Envoy's ext_authz HTTP service: the original method, and the path after the prefix",
            description=(
                "Envoy sends the auth request with the original method, to `path_prefix` + the original path: "
                "`/api/edge/authorize/v1/chat` asks about `<method> /v1/chat`. Otherwise as `GET /api/edge/authorize`."
            ),
            responses={200: {"description": "Admitted: the caller's identity in X-Tollgate-* headers."}},
        )
    return router
