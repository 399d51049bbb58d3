"""The GEO list's JSON (services/geo/api.py): one serialising pass from the store's rows, the
contract's GeoProjectList byte for byte as FastAPI serialised it from the response model."""

import dataclasses
from datetime import UTC, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from contracts.keys_api import GeoProject, GeoProjectList
from services.geo import api as geo_api
from services.geo.store import ProjectRow


def test_the_listing_has_the_contracts_fields_in_its_order() -> None:
    assert [f.name for f in dataclasses.fields(ProjectRow)] == list(GeoProject.model_fields)


def _as_fastapi_serialises(rows: list[ProjectRow]) -> bytes:
    """What the route answered before: the contract's model from the rows, serialised as FastAPI
    serialises a response model (pydantic's JSON, by alias)."""
    document = GeoProjectList(items=[GeoProject.model_validate(r, from_attributes=True) for r in rows])
    return GeoProjectList.__pydantic_serializer__.to_json(GeoProjectList.model_validate(document), by_alias=True)


rows_strategy = st.lists(
    st.builds(
        ProjectRow,
        st.uuids(),
        st.text(max_size=40),
        st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))])),
    ),
    max_size=5,
)


@given(rows_strategy)
def test_the_listing_is_the_contracts_json_byte_for_byte(rows: list[ProjectRow]) -> None:
    answer = geo_api._LISTING.dump_json(geo_api._Listing(rows))
    assert answer == _as_fastapi_serialises(rows)
