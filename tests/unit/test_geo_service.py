"""GEO projects' use cases on fakes: creation within the geo_projects total, deletion frees one."""

import json
import uuid

import pytest

from contracts.domain_errors import Forbidden, NotFound
from services.geo.domain import ProjectsExhausted
from services.geo.service import GeoService
from tests.unit.fakes import FakeClock, FakeGeoStore, FakeOutbox, FakeQuota


class World:
    def __init__(self) -> None:
        self.store = FakeGeoStore()
        self.outbox = FakeOutbox()
        self.quota = FakeQuota(default=2)
        self.clock = FakeClock()
        self.service = GeoService(self.store, self.outbox, self.quota, self.clock, "https://console.test/")
        self.account = uuid.uuid4()

    def deltas(self) -> list[int]:
        return [json.loads(value or b"{}")["quantity"] for topic, _, value in self.outbox.events if topic == "usage.v1"]


@pytest.fixture
def world() -> World:
    return World()


async def test_projects_are_created_within_the_total_each_with_a_usage_delta(world):
    first = await world.service.create_project(world.account, "a")
    world.clock.advance(seconds=1)
    second = await world.service.create_project(world.account, "b")
    assert [p.name for p in await world.service.list_projects(world.account)] == ["a", "b"]
    assert second.created_at == world.clock.now and first.id != second.id
    assert world.deltas() == [1, 1] and world.outbox.wakes == 2
    assert world.store.locks == [world.account, world.account]  # each creation under the account's lock
    assert await world.service.list_projects(uuid.uuid4()) == []  # another account sees none


async def test_the_one_past_the_total_is_refused_with_the_details(world):
    for name in ("a", "b"):
        await world.service.create_project(world.account, name)
    with pytest.raises(ProjectsExhausted) as refused:
        await world.service.create_project(world.account, "c")
    error = refused.value
    assert isinstance(error, Forbidden) and error.code == "insufficient_quota"
    assert error.details == {
        "resource": "geo_projects",
        "used": 2,
        "total": 2,
        "period_end": "2026-12-01T00:00:00Z",
        "scope": "account",
        "links": {
            "upgrade_plan": "https://console.test/plan",
            "buy_quota_package": "https://console.test/quota?buy=geo_projects",
        },
    }
    assert len(await world.service.list_projects(world.account)) == 2 and world.deltas() == [1, 1]
    world.quota.totals[world.account] = 3  # a package bought: one more fits
    await world.service.create_project(world.account, "c")


async def test_deleting_frees_one_place_and_another_accounts_project_is_not_found(world):
    kept = await world.service.create_project(world.account, "a")
    gone = await world.service.create_project(world.account, "b")
    with pytest.raises(NotFound):
        await world.service.delete_project(uuid.uuid4(), gone.id)
    await world.service.delete_project(world.account, gone.id)
    assert [p.id for p in await world.service.list_projects(world.account)] == [kept.id]
    assert world.deltas() == [1, 1, -1]
    with pytest.raises(NotFound):
        await world.service.delete_project(world.account, gone.id)
    await world.service.create_project(world.account, "c")  # the freed place is usable again
    assert world.deltas() == [1, 1, -1, 1]
