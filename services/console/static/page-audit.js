// Audit log (v2): every console and operator write of the account, newest first, with filters
// and paging. Only owners and billing members may read it (audit:read); others are told why.
import { get } from "./api.js";
import { cursorPaged, field, h, select } from "./dom.js";
import { dateTime, titleCase } from "./format.js";

export const ACTIONS = [
  ["api_key.created", "API key created"],
  ["api_key.toggled", "API key enabled/disabled"],
  ["api_key.deleted", "API key deleted"],
  ["api_key.rotated", "API key rotated"],
  ["api_key.updated", "API key rules changed"],
  ["member.added", "Member added"],
  ["member.role_changed", "Member role changed"],
  ["member.removed", "Member removed"],
  ["session.logout", "Logged out"],
  ["order.created", "Order created"],
  ["order.paid", "Order paid"],
  ["plan.switched", "Plan switched"],
  ["user_type.changed", "User type changed"],
  ["password.changed", "Password changed"],
  ["alert_rule.created", "Alert rule created"],
  ["alert_rule.deleted", "Alert rule deleted"],
  ["service_token.created", "Service token created"],
  ["service_token.revoked", "Service token revoked"],
  ["account.roles_changed", "Account roles changed (operator)"],
  ["account.deleted", "Account deleted (restore)"],
];
const LABELS = new Map(ACTIONS);
const READERS = new Set(["owner", "billing"]);

/** Whether the signed-in user's role may read the audit log (the nav hides it otherwise). */
export function canRead(account) {
  const roles = account ? (account.role ? [account.role] : account.roles || []) : [];
  return roles.some((r) => READERS.has(r));
}

function actor(a) {
  if (a.operator) return "Operator";
  const who = a.email || a.user_id;
  return a.api_key_id ? h("span", {}, who, h("span", { class: "muted" }, " with API key "), h("code", {}, a.api_key_id.slice(0, 8))) : who;
}

function details(d) {
  const pairs = Object.entries(d || {});
  if (!pairs.length) return "–";
  return pairs.map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ");
}

export async function render(container, ctx) {
  const account = ctx.account || (await ctx.reloadAccount());
  container.append(h("h1", {}, "Audit log"));
  if (!canRead(account)) {
    container.append(
      h("p", { class: "muted", id: "audit-denied" }, `Your role is ${titleCase(account.role || "viewer")}: only owners and billing members can read the audit log.`),
    );
    return;
  }
  const action = select("action", [["", "All actions"], ...ACTIONS], "");
  action.id = "audit-action";
  const start = h("input", { type: "datetime-local", name: "start", id: "audit-start" });
  const end = h("input", { type: "datetime-local", name: "end", id: "audit-end" });
  const apply = h("button", { type: "submit", class: "primary" }, "Filter");
  const form = h("form", { class: "row filters", "aria-label": "Audit log filters" }, field("Action", action), field("From", start), field("To", end), h("div", { class: "actions" }, apply));
  const tbody = h("tbody");
  const errors = h("div");
  const more = h("button", { type: "button", class: "secondary", hidden: true }, "Load more");
  const empty = h("p", { class: "muted", hidden: true }, "No entries match these filters.");

  const params = () => ({
    action: action.value,
    start: start.value ? new Date(start.value).toISOString() : "",
    end: end.value ? new Date(end.value).toISOString() : "",
    limit: 25,
  });

  function line(item) {
    return h(
      "tr",
      { dataset: { action: item.action } },
      h("td", { "data-label": "Time" }, dateTime(item.time)),
      h("td", { "data-label": "Who" }, actor(item.actor)),
      h("td", { "data-label": "Action" }, LABELS.get(item.action) || item.action, h("br"), h("code", { class: "muted" }, item.action)),
      h("td", { "data-label": "Target" }, `${item.target.type} `, h("code", {}, item.target.id)),
      h("td", { "data-label": "IP" }, item.ip || "–"),
      h("td", { "data-label": "User agent", class: "ua" }, item.user_agent || "–"),
      h("td", { "data-label": "Details", class: "details" }, details(item.details)),
    );
  }

  const load = cursorPaged({ fetchPage: (cursor) => get("/api/audit-log", { ...params(), cursor }), line, tbody, more, empty, errors });

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    load();
  });
  more.addEventListener("click", () => load(true));

  container.append(
    h("p", { class: "lead" }, "Who changed what in this account, from which address: keys, members, orders, plans, alert rules, passwords and logouts. Entries cannot be changed or deleted."),
    h(
      "section",
      { class: "card", "aria-labelledby": "audit-title" },
      h("h2", { id: "audit-title" }, "Entries"),
      form,
      errors,
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { class: "responsive", id: "audit-table" },
          h("thead", {}, h("tr", {}, ["Time", "Who", "Action", "Target", "IP", "User agent", "Details"].map((t) => h("th", { scope: "col" }, t)))),
          tbody,
        ),
      ),
      empty,
      h("div", { class: "actions" }, more),
    ),
  );
  await load();
}
