// (v4) One key's view: its own rules (allowed models, routes, addresses, rate limit, limits), set
// and cleared with PATCH /api/api-keys/{id}. The whole view is the element #key-view; its rules
// form is #key-rules-form and #key-usage is where the key's usage against its limits goes.
import { patch } from "./api.js";
import { busy, errorBox, field, h, select } from "./dom.js";
import { RESOURCES } from "./format.js";

const PERIODS = [
  ["day", "Per day"],
  ["week", "Per week"],
  ["month", "Per month"],
  ["once", "Once (never refills)"],
];

const lines = (text) => text.split("\n").map((l) => l.trim()).filter(Boolean);

function listField(label, name, values, hint) {
  const area = h("textarea", { name, id: `key-${name.replaceAll("_", "-")}`, rows: 3, spellcheck: "false" });
  area.value = values.join("\n");
  return [area, field(label, area, hint)];
}

function limitRow(limit, onRemove) {
  const resource = select("resource", Object.entries(RESOURCES), limit.resource || "ai_tokens");
  resource.setAttribute("aria-label", "Resource");
  const period = select("period", PERIODS, limit.period || "month");
  period.setAttribute("aria-label", "Period");
  const amount = h("input", { type: "number", name: "amount", min: 1, step: 1, required: true, "aria-label": "Amount" });
  amount.value = limit.amount ?? "";
  const remove = h("button", { type: "button", class: "secondary small" }, "Remove");
  const row = h("div", { class: "row key-limit" }, resource, amount, period, remove);
  remove.addEventListener("click", () => onRemove(row));
  row.value = () => ({ resource: resource.value, amount: Number(amount.value), period: period.value });
  return row;
}

/** The view of `key`; `onSaved(updated)` after a PATCH the server accepted, `onClose()` to leave. */
export function keyView(key, { onSaved, onClose }) {
  const [models, modelsField] = listField("Allowed models", "allowed_models", key.allowed_models || [], "One per line: provider/model or provider/*. Empty: every model.");
  const [routes, routesField] = listField("Allowed routes", "allowed_routes", key.allowed_routes || [], "One per line: METHOD /path or METHOD /prefix/* (* only at the end). Empty: every route.");
  const [ips, ipsField] = listField("Allowed addresses", "allowed_ips", key.allowed_ips || [], "One per line: an IPv4 or IPv6 address or CIDR. Empty: any address.");

  const rate = key.rate_limit || {};
  const rateInput = (name, label, step) => {
    const input = h("input", { type: "number", name, id: `key-rate-${name.replaceAll("_", "-")}`, min: 0, step });
    input.value = rate[name] ?? "";
    return [input, field(label, input)];
  };
  const [perSecond, perSecondField] = rateInput("per_second", "Requests per second", "any");
  const [burst, burstField] = rateInput("burst", "Burst", 1);
  const [perMinute, perMinuteField] = rateInput("per_minute", "Requests per minute", 1);

  const limits = h("div", { id: "key-limits" });
  const removeRow = (row) => row.remove();
  for (const limit of key.limits || []) limits.append(limitRow(limit, removeRow));
  const addLimit = h("button", { type: "button", class: "secondary small", id: "key-add-limit" }, "Add limit");
  addLimit.addEventListener("click", () => {
    const row = limitRow({}, removeRow);
    limits.append(row);
    row.querySelector("input").focus();
  });

  const errors = h("div", { id: "key-rules-errors" });
  const save = h("button", { type: "submit", class: "primary" }, "Save rules");
  const close = h("button", { type: "button", class: "secondary" }, "Close");
  close.addEventListener("click", onClose);
  const form = h(
    "form",
    { id: "key-rules-form", class: "key-rules" },
    modelsField,
    routesField,
    ipsField,
    h(
      "fieldset",
      {},
      h("legend", {}, "Rate limit of this key"),
      h("small", { class: "hint" }, "At most your plan's. Leave all three empty to use the plan's."),
      h("div", { class: "row" }, perSecondField, burstField, perMinuteField),
    ),
    h("fieldset", {}, h("legend", {}, "Limits"), h("small", { class: "hint" }, "How much this key may use per period, counted apart from the account's quota."), limits, addLimit),
    errors,
    h("div", { class: "actions" }, close, save),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errors.replaceChildren();
    const numbers = [perSecond, burst, perMinute].map((i) => i.value.trim());
    const orNull = (list) => (list.length ? list : null); // null clears the rule
    const body = {
      allowed_models: orNull(lines(models.value)),
      allowed_routes: orNull(lines(routes.value)),
      allowed_ips: orNull(lines(ips.value)),
      limits: orNull([...limits.querySelectorAll(".key-limit")].map((row) => row.value())),
      rate_limit: numbers.every((n) => n === "")
        ? null
        : { per_second: Number(numbers[0]), burst: Number(numbers[1]), per_minute: Number(numbers[2]) },
    };
    try {
      const updated = await busy(save, () => patch(`/api/api-keys/${key.id}`, body));
      onSaved(updated);
    } catch (err) {
      errors.append(errorBox(err)); // a 422 names each bad field
    }
  });

  return h(
    "section",
    { id: "key-view", class: "card", "aria-labelledby": "key-view-title", dataset: { keyId: key.id } },
    h("h2", { id: "key-view-title", tabindex: "-1" }, `Key “${key.name}”`),
    h("p", { class: "muted" }, h("code", {}, key.masked_key), " — what this key may do, narrower than your account."),
    h("div", { id: "key-usage" }),
    form,
  );
}
