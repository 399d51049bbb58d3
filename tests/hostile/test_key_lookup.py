"""Key lookup does not leak, through timing, how much of a guessed key is right.

Timing itself is not asserted (noisy on a shared machine; bench/key_lookup.py prints it). The
structure is: the edge turns the presented secret into its SHA-256 before anything else and
finds the key by that digest in a dict; a guess right in all but one character has a digest
unrelated to the real one. No code in services/ compares a secret, token, digest, password or
signature with == (only hmac.compare_digest)."""

import ast
import hashlib
import inspect
import re
import textwrap
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from starlette.requests import Request

from contracts.common import KeyStatus, Role
from contracts.credentials import hash_secret, new_api_key
from contracts.events import KeyState
from services.edge.edge import Edge
from services.edge.errors import ApiError
from services.edge.projections import KeyProjection
from services.runtime.platform.settings import Settings

SERVICES = Path(__file__).resolve().parents[2] / "services"
SENSITIVE = re.compile(r"secret|token|digest|password|hash|signature|\bsig\b|\bmac\b", re.IGNORECASE)


def _identifier(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript | ast.Call):
        return _identifier(node.value if isinstance(node, ast.Subscript) else node.func)
    return None


def test_no_secret_is_compared_with_equality_anywhere_in_services():
    found = []
    for path in sorted(SERVICES.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
                names = [_identifier(n) for n in (node.left, *node.comparators)]
                if any(n and SENSITIVE.search(n) for n in names):
                    found.append(f"{path.relative_to(SERVICES)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "use hmac.compare_digest or a hash lookup:\n" + "\n".join(found)


def test_the_presented_key_is_used_only_through_its_sha256():
    source = textwrap.dedent(inspect.getsource(Edge._authenticate_key))
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    secret = function.args.args[1].arg
    uses = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == secret]
    calls = [n for n in ast.walk(function) if isinstance(n, ast.Call) and _identifier(n.func) == "hash_secret"]
    assert len(uses) == 1 and len(calls) == 1 and calls[0].args[0] is uses[0], "the secret may only be hashed"
    assert hash_secret("sk-x") == hashlib.sha256(b"sk-x").hexdigest()
    assert "hashlib.sha256" in inspect.getsource(hash_secret)


def test_the_projection_is_a_dict_keyed_by_digest_and_a_near_miss_finds_nothing(monkeypatch):
    projection = KeyProjection()
    real = new_api_key()
    state = KeyState(
        time=datetime.now(UTC),
        account_id=uuid.uuid4(),
        key_id=uuid.uuid4(),
        hash=hash_secret(real),
        status=KeyStatus.ENABLED,
        roles=[Role.OWNER],
    )
    projection.apply(state)
    assert type(projection._by_hash) is dict and list(projection._by_hash) == [state.hash]

    edge = Edge(Settings())
    edge.assume_caught_up()  # fed by hand: what it holds is all there is
    edge.keys = projection
    looked_up: list[str] = []
    real_get = KeyProjection.get

    def spy(self: KeyProjection, digest: str):
        looked_up.append(digest)
        return real_get(self, digest)

    monkeypatch.setattr(KeyProjection, "get", spy)
    now = datetime.now(UTC)
    request = Request({"type": "http", "method": "GET", "path": "/api/geo/projects", "headers": []})
    assert edge._authenticate_key(real, now, request).api_key_id == state.key_id
    near_miss = real[:-1] + ("A" if real[-1] != "A" else "B")
    guesses = [near_miss, "sk-" + "A" * (len(real) - 3), real[:10]]
    for guess in guesses:
        with pytest.raises(ApiError) as refused:
            edge._authenticate_key(guess, now, request)
        assert refused.value.code == "invalid_api_key"
    assert looked_up == [hash_secret(s) for s in (real, *guesses)]
    assert all(re.fullmatch(r"[0-9a-f]{64}", d) for d in looked_up)  # never the secret itself
