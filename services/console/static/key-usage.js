// (v4) A key's usage against each of its own limits (the key object's `usage`): one bar per limit
// in the quota page's bands (< 70 green, 70..90 yellow, > 90 red). A red one says when the limit
// resets, or that a `once` limit never refills.
import { h } from "./dom.js";
import { amount, dateTime, pct, resourceName } from "./format.js";
import { bandOf } from "./page-quota.js";

const PERIODS = { day: "per day", week: "per week", month: "per month", once: "one-time" };

/** The share of the limit taken, in percent: what was used and what open reservations hold
 * (amount - remaining), so the bar is full exactly when the key's calls are refused. */
function takenPct(limit) {
  const total = Number(limit.amount);
  const taken = total - Number(limit.remaining);
  return total > 0 && Number.isFinite(taken) ? Math.min(100, Math.max(0, (taken / total) * 100)) : 0;
}

function resets(limit) {
  if (limit.period === "once" || !limit.resets_at) return "Never refills: one-time credits.";
  return `Resets ${dateTime(limit.resets_at)}.`;
}

function limitUsage(limit) {
  const rate = takenPct(limit);
  const band = bandOf(rate);
  const name = `${resourceName(limit.resource)} ${PERIODS[limit.period] || limit.period}`;
  const numbers = `${amount(limit.resource, limit.used)} of ${amount(limit.resource, limit.amount)} used, ${amount(limit.resource, limit.remaining)} left`;
  return h(
    "div",
    { class: "key-limit-usage", dataset: { resource: limit.resource, period: limit.period, band } },
    h("div", { class: "key-limit-head" }, h("span", {}, name), h("span", { class: "muted" }, numbers)),
    h(
      "div",
      {
        class: "bar",
        role: "progressbar",
        "aria-valuemin": "0",
        "aria-valuemax": "100",
        "aria-valuenow": String(Math.round(rate)),
        "aria-valuetext": `${pct(rate)} taken`,
        "aria-label": `${name} usage`,
        dataset: { band },
      },
      h("div", { class: `bar-fill band-${band}`, style: { width: `${rate}%` } }),
    ),
    band === "red" ? h("small", { class: "key-limit-resets band-text-red" }, resets(limit)) : null,
  );
}

/** The element showing `key.usage` (hidden and empty for a key without limits). */
export function keyUsage(key) {
  const usage = Array.isArray(key.usage) ? key.usage : [];
  return h("div", { class: "key-usage", hidden: usage.length === 0 }, usage.map(limitUsage));
}
