// Quota: every resource with total, used, remaining, rate and a band-coloured bar; period and
// reset date; upgrade or buy a package.
import { get, newIdempotencyKey, post } from "./api.js";
import { busy, errorBox, field, h, select } from "./dom.js";
import { RESOURCES, amount, date, dateTime, money, pct, resourceName } from "./format.js";

const BAND_WORDS = { green: "Plenty left", yellow: "Getting close", red: "Almost or fully used" };

/** The contract's bands: < 70 green, 70..90 yellow, > 90 red (used only if the API sent none). */
export function bandOf(rate) {
  if (rate > 90) return "red";
  if (rate >= 70) return "yellow";
  return "green";
}

function meter(item) {
  const band = item.band || bandOf(Number(item.usage_rate));
  const rate = Number(item.usage_rate);
  const fill = h("div", { class: `bar-fill band-${band}`, style: { width: `${Math.min(100, Math.max(0, rate))}%` } });
  return h(
    "div",
    {
      class: "bar",
      role: "progressbar",
      "aria-valuemin": "0",
      "aria-valuemax": "100",
      "aria-valuenow": String(Math.min(100, rate)),
      "aria-valuetext": `${pct(rate)} used, ${BAND_WORDS[band]}`,
      "aria-label": `${resourceName(item.resource)} usage`,
      dataset: { band },
    },
    fill,
  );
}

function resourceCard(item, onBuy) {
  const band = item.band || bandOf(Number(item.usage_rate));
  const exhausted = item.status === "exhausted";
  const buy = h("button", { type: "button", class: "secondary small", "aria-label": `Buy more ${resourceName(item.resource)}` }, "Buy more");
  buy.addEventListener("click", () => onBuy(item.resource));
  return h(
    "article",
    { class: `card quota-card band-${band}`, dataset: { resource: item.resource, band, status: item.status } },
    h("header", { class: "quota-head" }, h("h2", {}, resourceName(item.resource)), h("span", { class: `status status-${exhausted ? "exhausted" : "available"}` }, exhausted ? "Exhausted" : "Available")),
    meter(item),
    h(
      "dl",
      { class: "facts" },
      h("div", {}, h("dt", {}, "Used"), h("dd", {}, amount(item.resource, item.used))),
      h("div", {}, h("dt", {}, "Total"), h("dd", {}, amount(item.resource, item.total))),
      h("div", {}, h("dt", {}, "Remaining"), h("dd", {}, amount(item.resource, item.remaining))),
      h("div", {}, h("dt", {}, "Usage rate"), h("dd", { class: "rate" }, pct(item.usage_rate))),
    ),
    h("p", { class: `band-note band-text-${band}` }, BAND_WORDS[band]),
    h("div", { class: "actions" }, buy),
  );
}

function packageForm(ctx, reload) {
  const resource = select("resource", Object.entries(RESOURCES), "ai_tokens");
  const qty = h("input", { type: "number", name: "amount", min: 1, step: 1, required: true });
  const errors = h("div");
  const result = h("div", { "aria-live": "polite" });
  const order = h("button", { type: "submit", class: "primary" }, "See the price");
  const form = h(
    "form",
    { class: "card inline-form", id: "buy-package", "aria-labelledby": "pkg-title", hidden: true },
    h("h2", { id: "pkg-title" }, "Buy a quota package"),
    h("p", { class: "muted" }, "A package adds to this period's quota at once."),
    h("div", { class: "row" }, field("Resource", resource), field("Amount", qty, "Sold in whole packages; you see the price before paying.")),
    errors,
    h("div", { class: "actions" }, order),
    result,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errors.replaceChildren();
    result.replaceChildren();
    try {
      const orderKey = newIdempotencyKey(); // this submission: a retry of it makes no second order
      const created = await busy(order, () =>
        post("/api/billing/orders", { kind: "quota_package", package: { resource: resource.value, amount: Number(qty.value) } }, { idempotencyKey: orderKey }),
      );
      const payKey = newIdempotencyKey(); // one per order shown: paying again replays the first payment
      const pay = h("button", { type: "button", class: "primary" }, `Pay ${money(created.amount, created.currency)}`);
      pay.addEventListener("click", async () => {
        errors.replaceChildren();
        try {
          await busy(pay, () => post(`/api/billing/orders/${created.id}/pay`, undefined, { idempotencyKey: payKey }));
          ctx.toast("Package paid: the quota is added.");
          form.hidden = true;
          result.replaceChildren();
          await reload(created.package?.resource || resource.value);
        } catch (err) {
          errors.append(errorBox(err));
        }
      });
      result.append(h("p", {}, `${amount(resource.value, qty.value)} ${resourceName(resource.value)} for `, h("strong", {}, money(created.amount, created.currency)), "."), pay);
      pay.focus();
    } catch (err) {
      errors.append(errorBox(err));
    }
  });
  return { form, choose: (r) => { resource.value = r; } };
}

export async function render(container, ctx) {
  const summary = h("p", { class: "lead", id: "quota-period" });
  const grid = h("div", { class: "quota-grid" });
  const errors = h("div");
  let report = null;
  const pkg = packageForm(ctx, (resource) => loadUntilGrown(resource));
  const openPackage = (resource) => {
    if (resource && resource in RESOURCES) pkg.choose(resource);
    pkg.form.hidden = false;
    pkg.form.querySelector("select").focus();
  };
  const upgrade = h("a", { class: "button primary", href: "/console/plan" }, "Upgrade plan");
  const buy = h("button", { type: "button", class: "secondary" }, "Buy a package");
  buy.addEventListener("click", () => openPackage());

  async function load() {
    errors.replaceChildren();
    try {
      const data = await get("/api/billing/check-quota");
      report = data;
      const { start, end } = data.period;
      summary.replaceChildren(
        "Period ",
        h("strong", {}, `${date(start)} – ${date(new Date(new Date(end).getTime() - 1).toISOString())}`),
        `. Monthly quotas reset on ${dateTime(end)}.`,
      );
      grid.replaceChildren(...data.items.map((item) => resourceCard(item, openPackage)));
    } catch (err) {
      errors.append(errorBox(err));
    }
  }

  const totalOf = (data, resource) => Number(data?.items.find((i) => i.resource === resource)?.total ?? 0);

  /** A paid package reaches the counters through billing's event a moment later: refresh until it shows. */
  async function loadUntilGrown(resource) {
    const before = totalOf(report, resource);
    for (let attempt = 0; attempt < 20; attempt += 1) {
      await load();
      if (totalOf(report, resource) > before || errors.childElementCount) return;
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
  }

  container.append(
    h("div", { class: "page-head" }, h("h1", {}, "Quota"), h("div", { class: "actions" }, upgrade, buy)),
    summary,
    errors,
    pkg.form,
    grid,
    h("p", { class: "muted" }, "Bars are green below 70%, yellow from 70% to 90%, and red above 90%. GEO projects and storage are levels that carry over; the others start again each period. API calls counts the calls your API keys made that were admitted (the quota reads aside), not the model calls on the Usage page."),
  );
  await load();
  if (ctx.params.has("buy")) openPackage(ctx.params.get("buy") || undefined); // from a notification's quick link
  const timer = setInterval(() => { if (!document.hidden) load(); }, 30000);
  ctx.onCleanup(() => clearInterval(timer));
}
