// Plan & account: who you are, your plan and user type, the plans table, upgrades with the
// prorated amount shown before paying, and the individual/enterprise rule when it blocks.
import { get, newIdempotencyKey, post, put, session } from "./api.js";
import { busy, errorBox, field, h, select } from "./dom.js";
import { RESOURCES, amount, date, money, num, titleCase } from "./format.js";

const ORDER = ["free", "basic", "professional", "enterprise"];

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

  function accountCard() {
    const type = select("user_type", [["individual", "Individual"], ["enterprise", "Enterprise"]], account.user_type);
    const save = h("button", { type: "submit", class: "secondary" }, "Save user type");
    const form = h("form", { class: "row", "aria-label": "User type" }, field("User type", type), h("div", { class: "actions" }, save));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      changeUserType(type.value, save);
    });
    return h(
      "section",
      { class: "card", "aria-labelledby": "account-title" },
      h("h2", { id: "account-title" }, "Account"),
      h(
        "dl",
        { class: "facts" },
        h("div", {}, h("dt", {}, "Name"), h("dd", {}, account.name)),
        h("div", {}, h("dt", {}, "Email"), h("dd", {}, account.email)),
        h("div", {}, h("dt", {}, "User type"), h("dd", { id: "user-type" }, titleCase(account.user_type))),
        h("div", {}, h("dt", {}, "Roles"), h("dd", {}, (account.roles || []).join(", "))),
      ),
      form,
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

  async function load() {
    errors.replaceChildren();
    try {
      const [acc, sub, catalogue] = await Promise.all([ctx.reloadAccount(), get("/api/billing/subscription"), get("/api/billing/plans")]);
      account = acc;
      subscription = sub;
      plans = catalogue.items;
      accountSlot.replaceChildren(accountCard());
      planSlot.replaceChildren(planCard());
      tableSlot.replaceChildren(plansTable());
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
    passwordCard(),
  );
  await load();
}
