// Plan & account: who you are, your plan and user type, the plans table, upgrades with the
// prorated amount shown before paying, the individual/enterprise rule when it blocks, the quota
// package catalogue with its prices, and the order history with each paid order's invoice.
import { ApiError, get, newIdempotencyKey, post, put, session } from "./api.js";
import { busy, errorBox, field, h, select } from "./dom.js";
import { RESOURCES, amount, date, dateTime, money, num, resourceName, titleCase } from "./format.js";

/** What an order bought, in words. */
function orderWhat(order) {
  if (order.kind === "plan_upgrade") return `Upgrade ${titleCase(order.previous_plan || "free")} → ${titleCase(order.plan)}`;
  // Made by the platform at each period's start (the plan's full monthly price), never by a click.
  if (order.kind === "plan_renewal") return `${titleCase(order.plan)} plan renewal`;
  const p = order.package || {};
  return `${resourceName(p.resource)} package: ${amount(p.resource, p.amount)}`;
}

/** The printable invoice (Accept: text/html) in a new tab. The session travels in a header, not
 *  a cookie, so a plain link cannot carry it: the tab opens at the click (no popup blocker), then
 *  gets the page fetched with the session (server-rendered, escaped; its styles are console assets). */
async function openInvoice(order) {
  const tab = window.open("", "_blank");
  const headers = { Accept: "text/html", Authorization: `Bearer ${session.token}` };
  const response = await fetch(`/api/billing/orders/${order.id}/invoice`, { headers, credentials: "omit", cache: "no-store" });
  if (!response.ok) {
    if (tab) tab.close();
    const err = ((await response.json().catch(() => null)) || {}).error || {};
    throw new ApiError(response.status, err.code || `http_${response.status}`, err.message || "The invoice could not be loaded.", err.details, err.request_id);
  }
  const html = await response.text();
  if (!tab) throw new ApiError(0, "popup_blocked", "Allow pop-ups for this site to open the invoice.");
  tab.document.open();
  tab.document.write(html);
  tab.document.close();
}

const ORDER = ["free", "basic", "professional", "enterprise"];
const BILLING_WRITERS = new Set(["owner", "billing"]); // the roles with billing:write (docs/api.md)

/** The 409 user_type_plan_mismatch explained, with the way out offered right there. */
function mismatchHelp(err, account, onChangeType) {
  const change = h("button", { type: "button", class: "primary" }, "Change my user type to enterprise");
  change.addEventListener("click", () => onChangeType("enterprise", change));
  return h(
    "div",
    { class: "error explain", role: "alert", id: "plan-mismatch" },
    h("h3", {}, "The Enterprise plan is for enterprise accounts"),
    h("p", {}, err.message),
    h(
      "p",
      {},
      `Your account's user type is ${account.user_type}. Individual accounts can choose Free, Basic or Professional; `,
      "the Enterprise plan needs the enterprise user type. Change the user type (for a company account), then upgrade again.",
    ),
    h("div", { class: "actions" }, change),
  );
}

export async function render(container, ctx) {
  const accountSlot = h("div");
  const planSlot = h("div");
  const tableSlot = h("div");
  const checkout = h("div", { id: "checkout", "aria-live": "polite" });
  const packagesSlot = h("div");
  const historySlot = h("div");
  const errors = h("div");
  let account = ctx.account;
  let plans = [];
  let subscription = null;

  async function changeUserType(type, button) {
    errors.replaceChildren();
    try {
      await busy(button, () => put("/api/account/user-type", { user_type: type }));
      ctx.toast(`Your user type is now ${type}.`);
      checkout.replaceChildren();
      await load();
    } catch (err) {
      errors.append(errorBox(err));
    }
  }

  /** Only owners and billing members may change the user type (`billing:write`). */
  function userTypeForm() {
    const roles = account.role ? [account.role] : account.roles || [];
    if (!roles.some((r) => BILLING_WRITERS.has(r))) {
      return h("p", { class: "muted" }, `Your role is ${titleCase(account.role || "viewer")}: only owners and billing members can change the user type.`);
    }
    const type = select("user_type", [["individual", "Individual"], ["enterprise", "Enterprise"]], account.user_type);
    const save = h("button", { type: "submit", class: "secondary" }, "Save user type");
    const form = h("form", { class: "row", "aria-label": "User type" }, field("User type", type), h("div", { class: "actions" }, save));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      changeUserType(type.value, save);
    });
    return form;
  }

  function accountCard() {
    return h(
      "section",
      { class: "card", "aria-labelledby": "account-title" },
      h("h2", { id: "account-title" }, "Account"),
      h(
        "dl",
        { class: "facts" },
        // The id a platform service names in usage events (`account_id`); a script learns it from GET /api/account.
        h("div", { class: "wide" }, h("dt", {}, "Account ID"), h("dd", {}, h("code", { id: "account-id" }, account.id))),
        h("div", {}, h("dt", {}, "Name"), h("dd", {}, account.name)),
        h("div", {}, h("dt", {}, "Email"), h("dd", {}, account.email)),
        h("div", {}, h("dt", {}, "User type"), h("dd", { id: "user-type" }, titleCase(account.user_type))),
        h("div", {}, h("dt", {}, "Roles"), h("dd", {}, (account.roles || []).join(", "))),
      ),
      userTypeForm(),
    );
  }

  /** Changing the password ends every session, this one too: back to sign-in afterwards. */
  function passwordCard() {
    const current = h("input", { type: "password", name: "current_password", autocomplete: "current-password", required: true, maxlength: "1024" });
    const fresh = h("input", { type: "password", name: "new_password", autocomplete: "new-password", required: true, minlength: "8", maxlength: "1024" });
    const save = h("button", { type: "submit", class: "secondary" }, "Change password");
    const problems = h("div", { "aria-live": "polite" });
    const form = h(
      "form",
      { "aria-label": "Change password", id: "password-form" },
      field("Current password", current),
      field("New password", fresh, "At least 8 characters. Every session ends, this one too: you sign in again."),
      problems,
      h("div", { class: "actions" }, save),
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      problems.replaceChildren();
      try {
        await busy(save, () => put("/api/account/password", { current_password: current.value, new_password: fresh.value }));
      } catch (err) {
        problems.append(errorBox(err));
        return;
      }
      session.clear();
      window.dispatchEvent(new CustomEvent("tollgate:signed-out", { detail: { toast: "Password changed. Sign in with the new password." } }));
    });
    return h("section", { class: "card", "aria-labelledby": "password-title" }, h("h2", { id: "password-title" }, "Password"), form);
  }

  function planCard() {
    return h(
      "section",
      { class: "card current-plan", "aria-labelledby": "current-title" },
      h("h2", { id: "current-title" }, "Current plan"),
      h("p", { class: "stat-value", id: "current-plan" }, titleCase(subscription.plan)),
      h("p", { class: "muted" }, `${titleCase(subscription.user_type)} account · period ${date(subscription.period.start)} – ${date(new Date(new Date(subscription.period.end).getTime() - 1).toISOString())}`),
    );
  }

  async function pay(order, button, idempotencyKey) {
    try {
      await busy(button, () => post(`/api/billing/orders/${order.id}/pay`, undefined, { idempotencyKey }));
      checkout.replaceChildren();
      ctx.toast("Paid. Your new plan and quotas apply now.");
      await load();
    } catch (err) {
      checkout.append(errorBox(err));
    }
  }

  function showOrder(order, tier) {
    const payButton = h("button", { type: "button", class: "primary" }, `Pay ${money(order.amount, order.currency)}`);
    const cancel = h("button", { type: "button", class: "secondary" }, "Cancel");
    // One key per order shown: paying again after a lost answer replays the first payment.
    const payKey = newIdempotencyKey();
    payButton.addEventListener("click", () => pay(order, payButton, payKey));
    cancel.addEventListener("click", () => checkout.replaceChildren());
    checkout.replaceChildren(
      h(
        "section",
        { class: "card order", "aria-labelledby": "order-title" },
        h("h2", { id: "order-title" }, `Upgrade to ${titleCase(tier)}`),
        h("p", {}, "Amount due now: ", h("strong", { class: "amount", id: "order-amount" }, money(order.amount, order.currency))),
        h("p", { class: "muted" }, "This is the price difference prorated over the rest of this period. Your new quotas apply as soon as you pay."),
        h("div", { class: "actions" }, cancel, payButton),
      ),
    );
    payButton.focus();
  }

  async function choose(tier, button) {
    errors.replaceChildren();
    checkout.replaceChildren();
    const upgrade = ORDER.indexOf(tier) > ORDER.indexOf(subscription.plan);
    try {
      if (upgrade) {
        const idempotencyKey = newIdempotencyKey(); // this click: a retry of it makes no second order
        const order = await busy(button, () => post("/api/billing/orders", { kind: "plan_upgrade", plan: tier }, { idempotencyKey }));
        showOrder(order, tier);
      } else {
        await busy(button, () => post("/api/billing/subscription/switch", { plan: tier }));
        ctx.toast(`Switched to ${titleCase(tier)}.`);
        await load();
      }
    } catch (err) {
      if (err.code === "user_type_plan_mismatch") checkout.replaceChildren(mismatchHelp(err, account, changeUserType));
      else if (err.code === "payment_required" && err.details && err.details.order) showOrder(err.details.order, tier);
      else checkout.append(errorBox(err));
    }
  }

  function plansTable() {
    const resources = Object.keys(RESOURCES);
    const head = h("tr", {}, h("th", { scope: "col" }, "Plan"), h("th", { scope: "col" }, "Price / month"), resources.map((r) => h("th", { scope: "col" }, RESOURCES[r])), h("th", { scope: "col" }, "Rate limit"), h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Action")));
    const rows = plans.map((p) => {
      const current = p.tier === subscription.plan;
      const higher = ORDER.indexOf(p.tier) > ORDER.indexOf(subscription.plan);
      let action;
      if (current) action = h("span", { class: "status status-enabled" }, "Current plan");
      else {
        action = h("button", { type: "button", class: higher ? "primary small" : "secondary small", "aria-label": `${higher ? "Upgrade" : "Switch"} to ${titleCase(p.tier)}` }, higher ? "Upgrade" : "Switch");
        action.addEventListener("click", () => choose(p.tier, action));
      }
      const note = p.tier === "enterprise" && account.user_type === "individual" ? h("small", { class: "hint" }, "Enterprise accounts only") : null;
      return h(
        "tr",
        { class: current ? "current" : "", dataset: { tier: p.tier } },
        h("th", { scope: "row", "data-label": "Plan" }, h("span", {}, titleCase(p.tier), note)),
        h("td", { "data-label": "Price / month", class: "num" }, money(p.monthly_price, p.currency)),
        resources.map((r) => h("td", { "data-label": RESOURCES[r], class: "num" }, amount(r, p.quotas[r]))),
        h("td", { "data-label": "Rate limit" }, `${num(p.rate_limit.per_second)}/s (burst ${num(p.rate_limit.burst)}), ${num(p.rate_limit.per_minute)}/min`),
        h("td", { class: "row-actions" }, action),
      );
    });
    return h(
      "section",
      { class: "card", "aria-labelledby": "plans-title" },
      h("h2", { id: "plans-title" }, "Plans"),
      h("div", { class: "table-wrap" }, h("table", { class: "responsive plans", id: "plans-table" }, h("thead", {}, head), h("tbody", {}, rows))),
    );
  }

  function packagesCard(catalogue) {
    const rows = catalogue.items.map((p) =>
      h(
        "tr",
        { dataset: { resource: p.resource } },
        h("th", { scope: "row", "data-label": "Resource" }, resourceName(p.resource)),
        h("td", { "data-label": "Package", class: "num" }, amount(p.resource, p.unit)),
        h("td", { "data-label": "Price", class: "num" }, money(p.unit_price, catalogue.currency)),
        h("td", { class: "row-actions" }, h("a", { class: "button secondary small", href: `/console/quota?buy=${encodeURIComponent(p.resource)}`, "aria-label": `Buy ${resourceName(p.resource)}` }, "Buy")),
      ),
    );
    return h(
      "section",
      { class: "card", "aria-labelledby": "packages-title" },
      h("h2", { id: "packages-title" }, "Quota packages"),
      h("p", { class: "muted" }, "Extra quota for this period, sold in whole packages. You see the order's amount before paying."),
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { class: "responsive", id: "packages-table" },
          h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Resource"), h("th", { scope: "col" }, "Package"), h("th", { scope: "col" }, "Price per package"), h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Action")))),
          h("tbody", {}, rows),
        ),
      ),
    );
  }

  /** The order history, newest first; "Show more" follows the cursor. */
  function historyCard(first) {
    const body = h("tbody");
    const problems = h("div", { "aria-live": "polite" });
    const more = h("button", { type: "button", class: "secondary small" }, "Show more");
    let cursor = null;
    function add(page) {
      for (const order of page.items) {
        let invoice = h("span", { class: "muted" }, "After payment");
        if (order.status === "paid") {
          invoice = h("button", { type: "button", class: "secondary small", "aria-label": `Invoice of ${orderWhat(order)}` }, "Invoice");
          invoice.addEventListener("click", () => {
            problems.replaceChildren();
            openInvoice(order).catch((err) => problems.append(errorBox(err)));
          });
        }
        body.append(
          h(
            "tr",
            { dataset: { order: order.id, status: order.status } },
            h("td", { "data-label": "Date" }, dateTime(order.created_at)),
            h("th", { scope: "row", "data-label": "Order" }, orderWhat(order)),
            h("td", { "data-label": "Amount", class: "num" }, money(order.amount, order.currency)),
            h("td", { "data-label": "Status" }, h("span", { class: `status ${order.status === "paid" ? "status-enabled" : "status-expired"}` }, titleCase(order.status))),
            h("td", { class: "row-actions" }, invoice),
          ),
        );
      }
      cursor = page.next_cursor;
      more.hidden = !cursor;
    }
    more.addEventListener("click", async () => {
      problems.replaceChildren();
      try {
        add(await busy(more, () => get("/api/billing/orders", { limit: 20, cursor })));
      } catch (err) {
        problems.append(errorBox(err));
      }
    });
    add(first);
    const empty = first.items.length ? null : h("p", { class: "muted", id: "no-orders" }, "No orders yet.");
    return h(
      "section",
      { class: "card", "aria-labelledby": "orders-title" },
      h("h2", { id: "orders-title" }, "Orders"),
      empty,
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { class: "responsive", id: "orders-table", hidden: !first.items.length },
          h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Date"), h("th", { scope: "col" }, "Order"), h("th", { scope: "col" }, "Amount"), h("th", { scope: "col" }, "Status"), h("th", { scope: "col" }, "Invoice"))),
          body,
        ),
      ),
      problems,
      h("div", { class: "actions" }, more),
    );
  }

  async function load() {
    errors.replaceChildren();
    try {
      const [acc, sub, catalogue, packages, orders] = await Promise.all([
        ctx.reloadAccount(),
        get("/api/billing/subscription"),
        get("/api/billing/plans"),
        get("/api/billing/packages"),
        get("/api/billing/orders", { limit: 20 }),
      ]);
      account = acc;
      subscription = sub;
      plans = catalogue.items;
      accountSlot.replaceChildren(accountCard());
      planSlot.replaceChildren(planCard());
      tableSlot.replaceChildren(plansTable());
      packagesSlot.replaceChildren(packagesCard(packages));
      historySlot.replaceChildren(historyCard(orders));
    } catch (err) {
      errors.append(errorBox(err));
    }
  }

  container.append(
    h("h1", {}, "Plan & account"),
    errors,
    h("div", { class: "two-col" }, planSlot, accountSlot),
    checkout,
    tableSlot,
    packagesSlot,
    historySlot,
    passwordCard(),
  );
  await load();
}
