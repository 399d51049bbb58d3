"""`tollgate_http_request_seconds`'s labels take values known in advance (docs/operations.md):
an unauthenticated caller choosing the method of each request (the HTTP parser accepts some
thirty: PROPFIND, MKCOL, LINK, PURGE...) gets each odd one counted as `other`, instead of a new
series per method and route on every process's /metrics."""

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from services.edge.middleware import RequestMiddleware

ODD_METHODS = ("PROPFIND", "MKCOL", "LINK", "PURGE", "SEARCH", "UNLOCK")


def _method_labels() -> set[str]:
    return {
        sample.labels["method"]
        for family in REGISTRY.collect()
        if family.name == "tollgate_http_request_seconds"
        for sample in family.samples
        if "method" in sample.labels
    }


def test_a_method_no_route_takes_is_counted_as_other():
    app = FastAPI()

    @app.get("/items/{item_id}")
    async def item(item_id: str) -> dict[str, str]:
        return {"id": item_id}

    client = TestClient(RequestMiddleware(app))
    for method in ODD_METHODS:
        assert client.request(method, "/items/1").status_code == 405
        assert client.request(method, "/nowhere").status_code == 404
    assert client.get("/items/1").status_code == 200
    labels = _method_labels()
    assert not labels & set(ODD_METHODS)
    assert {"GET", "other"} <= labels
