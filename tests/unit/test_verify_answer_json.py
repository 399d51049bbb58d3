"""(issue 38) verify's answer as its fast path writes it (`answer_json`: msgspec mirrors for an
admitted call) against the contract's model's bytes (`VerifyAnswer.model_dump_json()`, what the
fast path wrote before), differentially over every shape a verdict and a standing can take."""

import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from contracts.common import Resource, Role, Tier
from contracts.errors import ErrorCode
from contracts.key_limits import LimitPeriod
from services.edge.errors import ApiError
from services.edge.principal import Principal
from services.edge.verdict import Verdict
from services.edge.verify_api import _MODELS, Standing, _answer, answer_json

big = st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**70), 2**70) | st.sampled_from([0, 1, 2**63 - 1, 2**64, -1])
principals = st.none() | st.builds(
    Principal,
    account_id=st.uuids(),
    roles=st.frozensets(st.sampled_from(list(Role))),
    api_key_id=st.none() | st.uuids(),
    user_id=st.none() | st.uuids(),
)
refusals = st.none() | st.builds(
    ApiError,
    st.sampled_from([401, 403, 429, 503]),
    st.sampled_from(list(ErrorCode)),
    st.text(max_size=50),
    details=st.none() | st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
)
rate_headers = st.none() | st.tuples(big, big, big)
standings = st.builds(
    Standing,
    quota=st.none() | st.tuples(st.sampled_from(list(Resource)), big, big, big, st.booleans()),
    key_limits=st.lists(st.tuples(st.sampled_from(list(Resource)), st.sampled_from(list(LimitPeriod)), big), max_size=4),
)


def _verdict(principal: Principal | None, refusal: ApiError | None, rate: Any, retry: int | None, plan: Tier | None) -> Verdict:
    headers: dict[str, str] = {}
    if rate is not None:
        headers |= {"X-RateLimit-Limit": str(rate[0]), "X-RateLimit-Remaining": str(rate[1]), "X-RateLimit-Reset": str(rate[2])}
    if retry is not None:
        headers["Retry-After"] = str(retry)
    return Verdict(principal, refusal, headers, plan)


@given(
    principal=principals,
    refusal=refusals,
    rate=rate_headers,
    retry=st.none() | big,
    plan=st.none() | st.sampled_from(list(Tier)),
    standing=standings,
    request_id=st.text(max_size=30),
)
def test_the_same_bytes_as_the_contracts_model(
    principal: Principal | None,
    refusal: ApiError | None,
    rate: Any,
    retry: int | None,
    plan: Tier | None,
    standing: Standing,
    request_id: str,
) -> None:
    verdict = _verdict(principal, refusal, rate, retry, plan)
    model = _answer(verdict, standing, request_id, _MODELS)
    assert answer_json(verdict, standing, request_id) == model.model_dump_json().encode()


def test_an_admitted_call_with_everything() -> None:
    principal = Principal(uuid.uuid4(), frozenset({Role.VIEWER, Role.OWNER}), api_key_id=uuid.uuid4(), user_id=uuid.uuid4())
    verdict = _verdict(principal, None, (500, 499, 1), None, Tier.ENTERPRISE)
    standing = Standing((Resource.AI_TOKENS, 10**12, 5, 2, False), [(Resource.API_CALLS, LimitPeriod.DAY, 7)])
    written = answer_json(verdict, standing, "r-1")
    assert written == _answer(verdict, standing, "r-1", _MODELS).model_dump_json().encode()
    assert written.startswith(b'{"valid":true,"code":"valid","status":200,')
    assert b'"role":"owner","plan":"enterprise"' in written
