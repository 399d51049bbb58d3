"""(v4) A route prefix never matches a path whose dot segments appear only once compatibility
folding (NFKC) and percent-decoding are applied in turn: the fullwidth U+FF05 U+FF12 U+FF45 fold
to `%2e`, which a further decoding makes `.`. The judge decoded first and folded last, so it
never decoded what the folding produced (fresh-eyes review 2, finding F4)."""

import pytest

from contracts.key_limits import KeyRules
from services.edge.key_rules import KeyGate

FULLWIDTH_PERCENT_2E = "%EF%BC%85%EF%BC%92%EF%BD%85"  # U+FF05 U+FF12 U+FF45 as UTF-8, percent-encoded
FULLWIDTH_PERCENT_2F = "%EF%BC%85%EF%BC%92%EF%BC%A6"  # U+FF05 U+FF12 U+FF26


@pytest.mark.parametrize(
    "path",
    [
        f"/v1/chat/{FULLWIDTH_PERCENT_2E * 2}/admin",
        f"/v1/chat/x{FULLWIDTH_PERCENT_2F}..{FULLWIDTH_PERCENT_2F}..{FULLWIDTH_PERCENT_2F}admin",
        "/v1/chat/\uff05\uff12\uff45\uff05\uff12\uff45/admin",  # (a service's verify may pass it decoded)
    ],
)
def test_folding_then_decoding_is_read_too(path: str) -> None:
    gate = KeyGate.of(KeyRules(allowed_routes=["POST /v1/chat/*"]))
    assert gate is not None
    refusal = gate.refusal("1.2.3.4", "POST", path, None, judges_model=False)
    assert refusal is not None and refusal[0].value == "route_not_allowed", path


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/chat/%EF%BC%85", "/v1/chat/a%2Eb", "/v1/chat/\uff56\uff11"])
def test_ordinary_paths_under_the_prefix_still_pass(path: str) -> None:
    gate = KeyGate.of(KeyRules(allowed_routes=["POST /v1/chat/*"]))
    assert gate is not None and gate.refusal("1.2.3.4", "POST", path, None, judges_model=False) is None
