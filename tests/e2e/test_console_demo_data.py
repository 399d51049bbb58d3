"""The usage page in a real browser against a real `tollgate serve`: the demo account seeded as
`tollgate up` seeds it (services/runtime/host/demo_data.py) shows drawn charts, today and this
week, and an account without usage shows its empty state; neither page has a literal `null`,
`undefined` or `NaN` anywhere (the empty trend panel printed `null` between its two "no usage"
lines). Screenshots go to artifacts/screenshots/."""

import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from services.runtime.host import demo_data
from services.runtime.platform.settings import Settings
from tests.e2e.console import WAIT_MS, open_console, open_page, poll, register, run_beside, service_token, shot, sign_in
from tests.support.apps import ServeProcess

PASSWORD = "demo-password-123"
LITERALS = re.compile(r"\b(null|undefined|NaN)\b")
TEXT_NODES = """() => {
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const texts = [];
  while (walker.nextNode()) texts.push(walker.currentNode.nodeValue);
  return texts;
}"""


def _seed(base: str, email: str, token: str) -> demo_data.Report:
    async def run() -> demo_data.Report:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            return await demo_data.seed(http, email=email, password=PASSWORD, service_token=token)

    return run_beside(run())


def _no_literals(page: Page, where: str) -> None:
    """No `null`/`undefined`/`NaN` in any text of the page (hidden text and SVG titles too) nor in
    the charts' geometry."""
    # text node by text node: the page's text run together would hide "...range.null" + "No usage..."
    texts: list[str] = page.evaluate(TEXT_NODES)
    found = [t for t in texts if LITERALS.search(t)]
    assert not found, f"{where}: {found} in the page's text"
    for chart in page.locator("svg").all():
        markup = chart.evaluate("el => el.outerHTML")
        assert not LITERALS.search(markup), f"{where}: a chart with {LITERALS.findall(markup)}"


def _drawn_trend(page: Page, where: str) -> None:
    """The trend is a chart with lines that rise above the baseline (not blank, not all zeros)."""
    lines = page.locator("#main .chart svg.line-chart polyline")
    expect(lines.first).to_be_visible(timeout=WAIT_MS)
    heights = {point.split(",")[1] for line in lines.all() for point in (line.get_attribute("points") or "").split()}
    assert len(heights) > 1, f"{where}: a flat trend {heights}"
    expect(page.get_by_text("No usage in this range.")).to_have_count(0)
    expect(page.locator("#usage-overview .donut path, #usage-overview .donut circle").first).to_be_attached()


@pytest.mark.integration
def test_the_seeded_demo_account_shows_drawn_charts_and_an_empty_account_no_null(
    server: ServeProcess, api: httpx.Client, browser: Browser, settings: Settings
) -> None:
    base = server.base_url
    token = service_token(api, settings, "demo platform service")
    demo = register(api, "demo", "Demo", password=PASSWORD)
    report = _seed(base, demo.email, token)
    assert report.new_usage_events > 0, report

    # wait until every event of the seven days is counted, then look
    planned = demo_data.planned_usage(demo.account_id, datetime.now(UTC))
    start = min(datetime.fromisoformat(e["time"]) for e in planned) - timedelta(hours=1)
    span = {"range": "custom", "start": start.isoformat(), "end": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}

    def counted() -> bool:
        overview = api.get("/api/ai/usage/overview", params=span, headers=demo.console).json()
        return int(overview["calls"]) >= report.usage_events

    poll(counted, "the demo usage in ClickHouse", timeout=60)

    page, page_errors = open_console(browser, base)
    sign_in(page, base, demo.email, PASSWORD)
    open_page(page, base, "usage", "Usage")
    expect(page.locator("#trend-as-of")).to_contain_text("Data as of", timeout=WAIT_MS)
    _drawn_trend(page, "today")
    # one row per model used today: all six by day, fewer in the quiet first hours (1-2 calls an hour)
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    today = {(e["provider"], e["model"]) for e in planned if datetime.fromisoformat(e["time"]) >= midnight}
    expect(page.locator("#provider-table tbody tr")).to_have_count(len(today), timeout=WAIT_MS)
    expect(page.locator("#activity-table tbody tr").first).to_be_visible(timeout=WAIT_MS)
    _no_literals(page, "the demo account's usage today")
    shot(page, "usage-demo-today")

    page.get_by_text("This week").click()
    expect(page.locator("select[name=granularity]")).to_have_value("day", timeout=WAIT_MS)
    expect(page.locator("#trend-as-of")).to_contain_text("Data as of", timeout=WAIT_MS)
    _drawn_trend(page, "this week")
    _no_literals(page, "the demo account's usage this week")
    shot(page, "usage-demo-week")

    # an account without any usage: the empty state, in words only
    empty = register(api, "empty", "Demo", password=PASSWORD)
    page.evaluate("sessionStorage.clear()")
    sign_in(page, base, empty.email, PASSWORD)
    open_page(page, base, "usage", "Usage")
    expect(page.locator("#trend-as-of")).to_have_text("No usage recorded in this range yet.", timeout=WAIT_MS)
    expect(page.get_by_text("No usage in this range.")).to_be_visible()
    _no_literals(page, "an account without usage")
    shot(page, "usage-empty")
    assert page_errors == []
    page.context.close()
