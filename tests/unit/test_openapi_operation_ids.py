"""The OpenAPI document names every operation once, the same in every run: clients generated from
it (openapi-generator, orval) key their methods on operationId. A route of several methods gave
them one id, taken from whichever method its set yielded first (authorize's Envoy route)."""

import warnings
from collections import Counter

from services.runtime.host.app import create_app
from services.runtime.platform.settings import Settings


def test_every_operation_has_an_id_of_its_own_named_after_its_method() -> None:
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI warns of a duplicate id and keeps both
        document = create_app(("all",), settings, consumers=False).openapi()
    ids = [op["operationId"] for path in document["paths"].values() for op in path.values()]
    assert [i for i, n in Counter(ids).items() if n > 1] == []
    forwarded = document["paths"]["/api/edge/authorize/{forwarded}"]
    assert {m: op["operationId"] for m, op in forwarded.items()} == {
        m: f"authorize_forwarded_{m}" for m in ("get", "post", "put", "patch", "delete", "options")
    }
