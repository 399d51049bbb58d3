// Usage: range (today/week/month/custom), totals, daily average, change, cost, share by model,
// trend by hour/day/week compared by model, provider or key, per-provider table, activity log;
// all of it for one API key or all, exportable as CSV, with unpriced usage said as such.
import { download, get } from "./api.js";
import { busy, clear, cursorPaged, errorBox, field, h, select } from "./dom.js";
import { colour, donut, legend, lineChart } from "./charts.js";
import { browserZone, change, dateTime, dec, money, num, pct } from "./format.js";

const RANGES = [
  ["today", "Today"],
  ["week", "This week"],
  ["month", "This month"],
  ["custom", "Custom"],
];

const TREND_METRICS = [
  ["total_tokens", "Total tokens"],
  ["calls", "Model calls"],
  ["estimated_cost", "Estimated cost"],
];

/** Local calendar days (yyyy-mm-dd) -> RFC 3339 instants covering them in the browser's zone. */
function dayStart(day) {
  return new Date(`${day}T00:00:00`).toISOString();
}
function dayAfter(day) {
  const d = new Date(`${day}T00:00:00`);
  d.setDate(d.getDate() + 1);
  return d.toISOString();
}

function rangeParams(range) {
  const params = { range: range.range, tz: browserZone() };
  if (range.range === "custom") {
    params.start = dayStart(range.start);
    params.end = dayAfter(range.end);
  }
  if (range.apiKey) params.api_key_id = range.apiKey;
  return params;
}

/** An "Export CSV" button: the same rows as shown, streamed by the API as CSV and saved. */
function exportButton(label, path, params, filename, errors) {
  const button = h("button", { type: "button", class: "secondary", "aria-label": label }, "Export CSV");
  button.addEventListener("click", () =>
    busy(button, async () => {
      errors.replaceChildren();
      try {
        await download(path, params(), filename);
      } catch (err) {
        errors.append(errorBox(err));
      }
    }),
  );
  return button;
}

const unpriced = () => h("span", { class: "muted unpriced", title: "No price is known for this model: its cost is not estimated" }, "unpriced");
const cost = (value, currency) => (value === null ? unpriced() : money(value, currency));

function statCard(label, value, sub, changeValue, note) {
  const trend = changeValue === undefined ? null : h("p", { class: `change ${Number(changeValue) > 0 ? "up" : Number(changeValue) < 0 ? "down" : ""}` }, change(changeValue));
  return h("div", { class: "card stat" }, h("h3", {}, label), h("p", { class: "stat-value" }, value), sub ? h("p", { class: "muted" }, sub) : null, trend, note ? h("p", { class: "muted note" }, note) : null);
}

// The overview's `calls` are usage events (model calls the platform reported), not the API calls
// quota (API-key calls the edge admitted): two numbers that read alike, said apart where they show.
const MODEL_CALLS_NOTE = "AI usage events the platform reported. Not the API calls quota, which counts the calls your API keys made (Quota page).";

function rangeControls(state, onApply) {
  const today = new Date();
  const iso = (d) => `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")}`;
  const start = h("input", { type: "date", name: "start", value: state.start || iso(new Date(today.getFullYear(), today.getMonth(), 1)) });
  const end = h("input", { type: "date", name: "end", value: state.end || iso(today) });
  const custom = h("div", { class: "row custom-range", hidden: state.range !== "custom" }, field("From", start), field("To", end));
  const radios = RANGES.map(([value, label]) =>
    h("label", { class: "segment" }, h("input", { type: "radio", name: "range", value, checked: value === state.range }), h("span", {}, label)),
  );
  const apply = h("button", { type: "submit", class: "primary" }, "Show");
  // Which script burned the tokens? The usage of one key, or of all.
  const keyFilter = select("usage_key", [["", "All keys"]], state.apiKey || "");
  state.keyNames = new Map();
  get("/api/api-keys")
    .then((data) => {
      for (const k of data.items) state.keyNames.set(k.id, `${k.name} (${k.masked_key})`);
      keyFilter.replaceChildren(h("option", { value: "" }, "All keys"), ...data.items.map((k) => h("option", { value: k.id, selected: k.id === state.apiKey }, state.keyNames.get(k.id))));
    })
    .catch(() => {}); // without the list, usage of all keys is still shown
  const form = h("form", { class: "card range-form", "aria-label": "Time range" }, h("fieldset", { class: "segments" }, h("legend", {}, "Time range"), radios), custom, h("div", { class: "row" }, field("Show usage of", keyFilter)), h("div", { class: "actions" }, apply));
  form.addEventListener("change", (event) => {
    if (event.target === keyFilter) {
      state.apiKey = keyFilter.value;
      form.requestSubmit();
      return;
    }
    if (event.target.name !== "range") return;
    custom.hidden = event.target.value !== "custom";
    if (event.target.value !== "custom") form.requestSubmit();
  });
  // A change while a load runs (a range or key picked before the trend arrived) loads once more
  // after it, instead of stacking a second busy() that would leave "Show" disabled for good.
  let running = false;
  let again = false;
  async function load() {
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      do {
        again = false;
        await busy(apply, onApply);
      } while (again);
    } finally {
      running = false;
    }
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const chosen = form.querySelector("input[name=range]:checked").value;
    Object.assign(state, { range: chosen, start: start.value, end: end.value });
    load();
  });
  return form;
}

function overviewSection(data) {
  const cur = data.currency;
  const share = (data.models || []).map((m) => ({ label: `${m.provider} / ${m.model}`, value: m.total_tokens, share: m.share_pct, priced: m.priced !== false }));
  const shareBlock = share.length
    ? h(
        "div",
        { class: "share" },
        donut(share, { label: `Share of tokens by model: ${share.map((x) => `${x.label} ${pct(x.share)}`).join(", ")}` }),
        legend(share.map((x) => h("span", {}, `${x.label}: `, h("strong", {}, pct(x.share)), ` (${num(x.value)} tokens)`, x.priced ? null : [" · ", unpriced()]))),
      )
    : h("p", { class: "muted" }, "No model usage in this range.");
  return h(
    "div",
    { id: "usage-overview" },
    h(
      "div",
      { class: "stats" },
      statCard("Total tokens", num(data.total_tokens), `${num(data.input_tokens)} in · ${num(data.output_tokens)} out`, data.change_pct?.total_tokens),
      statCard("Model calls", num(data.calls), `previous period: ${num(data.previous?.calls)}${data.previous?.range ? " (same elapsed time)" : ""}`, data.change_pct?.calls, MODEL_CALLS_NOTE),
      statCard(
        "Estimated cost",
        money(data.estimated_cost, cur),
        data.unpriced_tokens
          ? `${num(data.unpriced_tokens)} tokens unpriced (not included) · previous period: ${money(data.previous?.estimated_cost, cur)}`
          : `previous period: ${money(data.previous?.estimated_cost, cur)}`,
        data.change_pct?.estimated_cost,
      ),
      statCard("Daily average", `${num(data.daily_average_tokens)} tokens`, `${dateTime(data.range.start)} – ${dateTime(data.range.end)}`),
    ),
    h("section", { class: "card", "aria-labelledby": "share-title" }, h("h2", { id: "share-title" }, "Share by model"), shareBlock),
  );
}

function trendSection(state) {
  const granularity = select("granularity", [["hour", "Hour"], ["day", "Day"], ["week", "Week"]], state.granularity);
  const groupBy = select("group_by", [["model", "Model"], ["provider", "Provider"], ["api_key", "API key"]], state.groupBy);
  const metric = select("metric", TREND_METRICS, state.metric);
  const chartSlot = h("div", { class: "chart" });
  const errors = h("div");
  const freshness = h("p", { class: "muted", id: "trend-as-of" });
  const params = () => ({ ...rangeParams(state), granularity: state.granularity, group_by: state.groupBy });
  const section = h(
    "section",
    { class: "card", "aria-labelledby": "trend-title" },
    h("h2", { id: "trend-title" }, "Trend"),
    h("div", { class: "row controls" }, field("Granularity", granularity), field("Compare by", groupBy), field("Measure", metric), h("div", { class: "actions" }, exportButton("Export trend as CSV", "/api/ai/usage/trend", params, "usage-trend.csv", errors))),
    errors,
    chartSlot,
    freshness,
  );
  const seriesName = (key) => (state.groupBy === "api_key" ? (key === "none" ? "no key" : state.keyNames?.get(key) || key) : key);
  const hidden = new Set();
  let last = null;

  function draw() {
    if (!last) return;
    const series = last.series.filter((x) => !hidden.has(x.key));
    const all = last.series;
    const fmtTime = (t) => {
      const d = new Date(t);
      return state.granularity === "hour" ? d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" }) : d.toLocaleDateString(undefined, { month: "short", day: "numeric" });
    };
    const shown = series.map((x) => ({ key: x.key, points: x.points.map((p) => ({ t: p.t, value: Number(p[state.metric]) })) }));
    const label = `${TREND_METRICS.find(([v]) => v === state.metric)[1]} per ${state.granularity} by ${state.groupBy}`;
    const toggles = all.map((x, i) => {
      const box = h("input", { type: "checkbox", checked: !hidden.has(x.key) });
      box.addEventListener("change", () => {
        if (box.checked) hidden.delete(x.key);
        else hidden.add(x.key);
        draw();
      });
      return h("label", { class: "toggle" }, box, h("span", { class: "swatch", style: { background: colour(i) }, "aria-hidden": "true" }), seriesName(x.key) || "(none)");
    });
    // Keep colours stable when series are hidden: draw with the index among all series.
    const indexed = all.map((x) => shown.find((y) => y.key === x.key) || { key: x.key, points: [] });
    // clear(), not replaceChildren(): the DOM turns a null child into the text "null", which
    // showed between the two "no usage" lines of an empty range.
    clear(
      chartSlot,
      all.length
        ? lineChart(indexed.map((x) => ({ ...x, points: x.points.length ? x.points : [] })), {
            label,
            format: state.metric === "estimated_cost" ? dec : num,
            formatTime: fmtTime,
            width: Math.max(300, Math.min(960, chartSlot.clientWidth || 720)),
          })
        : h("p", { class: "muted" }, "No usage in this range."),
      all.length ? h("fieldset", { class: "series-toggles" }, h("legend", {}, `Compare ${state.groupBy}s`), toggles) : null,
    );
  }

  async function load() {
    errors.replaceChildren();
    try {
      last = await get("/api/ai/usage/trend", params());
      const someUnpriced = last.series.some((x) => x.points.some((p) => p.priced === false));
      freshness.replaceChildren(
        last.as_of ? `Data as of ${dateTime(last.as_of)}` : "No usage recorded in this range yet.",
        ...(someUnpriced ? [" · ", unpriced(), ": some usage has no price, its cost is not in the estimated cost"] : []),
      );
      draw();
    } catch (err) {
      chartSlot.replaceChildren();
      errors.append(errorBox(err));
    }
  }
  granularity.addEventListener("change", () => { state.granularity = granularity.value; load(); });
  groupBy.addEventListener("change", () => { state.groupBy = groupBy.value; hidden.clear(); load(); });
  metric.addEventListener("change", () => { state.metric = metric.value; draw(); });
  return { section, load, draw };
}

function providerTable(items, currency, keyNames, perKey) {
  if (!items.length) return h("p", { class: "muted" }, "No provider usage in this range.");
  const keyName = (r) => (r.api_key_id ? keyNames?.get(r.api_key_id) || r.masked_key || r.api_key_id : "no key");
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "responsive", id: "provider-table" },
      h("thead", {}, h("tr", {}, ["Provider", "Model", ...(perKey ? ["Key"] : []), "Model calls", "Total tokens", "Estimated cost"].map((t) => h("th", { scope: "col" }, t)))),
      h(
        "tbody",
        {},
        items.map((r) =>
          h(
            "tr",
            {},
            h("td", { "data-label": "Provider" }, r.provider),
            h("td", { "data-label": "Model" }, r.model),
            perKey ? h("td", { "data-label": "Key" }, keyName(r)) : null,
            h("td", { "data-label": "Model calls", class: "num" }, num(r.calls)),
            h("td", { "data-label": "Total tokens", class: "num" }, num(r.total_tokens)),
            h("td", { "data-label": "Estimated cost", class: "num" }, cost(r.estimated_cost, r.currency || currency)),
          ),
        ),
      ),
    ),
  );
}

function activitySection() {
  const key = select("api_key_id", [["", "All keys"]], "");
  const ip = h("input", { type: "text", name: "ip", inputmode: "decimal", placeholder: "e.g. 203.0.113.7", autocomplete: "off" });
  const start = h("input", { type: "datetime-local", name: "start" });
  const end = h("input", { type: "datetime-local", name: "end" });
  // Refused calls (401 of the account's key, 403, 429) are logged too, with their error code.
  const outcome = select("outcome", [["", "All calls"], ["admitted", "Admitted"], ["refused", "Refused"]], "");
  const tbody = h("tbody");
  const errors = h("div");
  const more = h("button", { type: "button", class: "secondary", hidden: true }, "Load more");
  const empty = h("p", { class: "muted", hidden: true }, "No calls match these filters.");
  const apply = h("button", { type: "submit", class: "primary" }, "Filter");
  const form = h("form", { class: "row filters", "aria-label": "Activity filters" }, field("API key", key), field("IP address", ip), field("From", start), field("To", end), field("Outcome", outcome), h("div", { class: "actions" }, apply));
  const keyNames = new Map(); // api_key_id -> "name (sk-abcd...wxyz)" from the keys list

  const params = () => ({
    api_key_id: key.value,
    ip: ip.value.trim(),
    start: start.value ? new Date(start.value).toISOString() : "",
    end: end.value ? new Date(end.value).toISOString() : "",
    outcome: outcome.value,
    limit: 25,
  });

  // (v4) Usage its key's allowed models do not include: served and counted, listed with a badge.
  function flag(item) {
    if (!item.model_not_allowed) return "";
    const used = item.quantity == null ? "" : ` (${num(item.quantity)} ${item.resource || ""})`;
    return h("span", { class: "status status-flagged", title: `Served and counted${used}, but this key's allowed models do not include it` }, "Model not allowed");
  }

  function line(item) {
    const usage = item.kind === "usage";
    return h(
      "tr",
      usage ? { class: "flagged-usage" } : {},
      h("td", { "data-label": "Time" }, dateTime(item.time)),
      h("td", { "data-label": "Key" }, keyNames.get(item.api_key_id) || h("code", {}, item.masked_key || item.api_key_id || "–")),
      h("td", { "data-label": "Method" }, item.method),
      h("td", { "data-label": "Path", class: "path" }, item.path, " ", flag(item)),
      // (v3) the platform service that verified the call; "–": one of Tollgate's own routes
      h("td", { "data-label": "Service" }, item.service || "–"),
      h("td", { "data-label": "Status" }, h("span", { class: `http http-${String(item.status)[0]}xx` }, String(item.status))),
      // A flood of refusals may be folded into one row per key, code and second: "× count".
      h("td", { "data-label": "Error code", class: "error-code" }, item.error_code ? h("code", {}, item.error_code) : "–", (item.count || 1) > 1 ? ` × ${item.count}` : ""),
      h("td", { "data-label": "IP" }, usage ? "–" : item.ip),
      h("td", { "data-label": "User agent", class: "ua" }, usage ? "–" : item.user_agent),
      h("td", { "data-label": "Latency", class: "num" }, usage ? "–" : `${dec(item.latency_ms)} ms`),
    );
  }

  const load = cursorPaged({ fetchPage: (cursor) => get("/api/activity-log", { ...params(), cursor }), line, tbody, more, empty, errors });

  async function loadKeys() {
    try {
      const data = await get("/api/api-keys");
      for (const k of data.items) keyNames.set(k.id, `${k.name} (${k.masked_key})`);
      key.replaceChildren(h("option", { value: "" }, "All keys"), ...data.items.map((k) => h("option", { value: k.id }, keyNames.get(k.id))));
    } catch {
      // The filter still works without names (all keys).
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    busy(apply, () => load(false));
  });
  more.addEventListener("click", () => busy(more, () => load(true)));
  const section = h(
    "section",
    { class: "card", "aria-labelledby": "activity-title" },
    h("h2", { id: "activity-title" }, "Activity log"),
    form,
    errors,
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "responsive", id: "activity-table" },
        h("thead", {}, h("tr", {}, ["Time", "Key", "Method", "Path", "Service", "Status", "Error code", "IP", "User agent", "Latency"].map((t) => h("th", { scope: "col" }, t)))),
        tbody,
      ),
    ),
    empty,
    more,
  );
  return { section, load: async () => { await loadKeys(); await load(false); } };
}

export async function render(container, ctx) {
  const state = { range: ctx.params.get("range") || "today", start: "", end: "", granularity: "hour", groupBy: "model", metric: "total_tokens", apiKey: "", providerRows: "model" };
  const overviewSlot = h("div");
  const providerSlot = h("div");
  const errors = h("div");
  const trend = trendSection(state);
  const activity = activitySection();
  const providerParams = () => ({ ...rangeParams(state), group_by: state.providerRows === "api_key" ? "api_key" : "" });
  const providerErrors = h("div");
  const providerRows = select("provider_rows", [["model", "Per model"], ["api_key", "Per model and key"]], state.providerRows);
  providerRows.addEventListener("change", () => {
    state.providerRows = providerRows.value;
    loadAnalytics();
  });

  async function loadAnalytics() {
    errors.replaceChildren();
    if (state.range !== "today" && state.granularity === "hour") state.granularity = "day";
    trend.section.querySelector("select[name=granularity]").value = state.granularity;
    const params = rangeParams(state);
    const [overview, providers] = await Promise.allSettled([get("/api/ai/usage/overview", params), get("/api/ai/usage/by-provider", providerParams())]);
    if (overview.status === "fulfilled") overviewSlot.replaceChildren(overviewSection(overview.value));
    else overviewSlot.replaceChildren(errorBox(overview.reason));
    const currency = overview.status === "fulfilled" ? overview.value.currency : "";
    if (providers.status === "fulfilled") providerSlot.replaceChildren(providerTable(providers.value.items, currency, state.keyNames, state.providerRows === "api_key"));
    else providerSlot.replaceChildren(errorBox(providers.reason));
    await trend.load();
  }

  container.append(
    h("h1", {}, "Usage"),
    rangeControls(state, loadAnalytics),
    errors,
    overviewSlot,
    trend.section,
    h(
      "section",
      { class: "card", "aria-labelledby": "providers-title" },
      h("h2", { id: "providers-title" }, "By provider"),
      h("div", { class: "row controls" }, field("Rows", providerRows), h("div", { class: "actions" }, exportButton("Export by provider as CSV", "/api/ai/usage/by-provider", providerParams, "usage-by-provider.csv", providerErrors))),
      providerErrors,
      providerSlot,
    ),
    activity.section,
  );
  await Promise.all([loadAnalytics(), activity.load()]);
  let pending = 0;
  const onResize = () => {
    clearTimeout(pending);
    pending = setTimeout(trend.draw, 150);
  };
  window.addEventListener("resize", onResize);
  ctx.onCleanup(() => window.removeEventListener("resize", onResize));
}
