// Alerts: rules (metric, threshold, channels, recipients), each rule's delivery log, and the
// in-site notifications with their quick links to upgrade or buy a package (a quota alert) or to
// the key (the reminder to rotate a key older than 90 days). A webhook rule's
// signing secret is shown once, right after its creation. Slack and Teams rules post to the
// channel's incoming-webhook URL (the same URL field: a rule names one URL channel). (v4) A rule may
// watch one key's own limit instead of the account's quota ("For key"); the list shows its scope.
import { del, get, post } from "./api.js";
import { busy, confirmDialog, consoleLink, errorBox, field, h, select, shownOncePanel } from "./dom.js";
import { METRICS, dateTime } from "./format.js";

const CHANNELS = [
  ["in_site", "In-site"],
  ["email", "E-mail"],
  ["sms", "SMS"],
  ["webhook", "Webhook"],
  ["slack", "Slack"],
  ["teams", "Microsoft Teams"],
];

const splitList = (text) => text.split(/[\s,;]+/).map((x) => x.trim()).filter(Boolean);

function notificationItem(n, markRead) {
  const links = n.links || {};
  const read = n.read
    ? null
    : h(
        "button",
        { class: "button secondary small", type: "button", "aria-label": `Mark “${n.title}” as read`, onclick: (e) => markRead(n, e.currentTarget) },
        "Mark as read",
      );
  if (n.kind === "key_rotation_due") {
    return h(
      "li",
      { class: `notification rotation ${n.read ? "" : "unread"}`, dataset: { id: n.id, kind: n.kind } },
      h("h3", {}, n.title),
      h("p", {}, n.message),
      h("p", { class: "muted" }, `${dateTime(n.created_at)} · API key older than 90 days`),
      h(
        "p",
        { class: "actions" },
        h("a", { class: "button primary small", href: `/console/keys?key=${encodeURIComponent(n.api_key_id)}` }, "Open the key"),
        read,
      ),
    );
  }
  return h(
    "li",
    { class: `notification ${n.read ? "" : "unread"}`, dataset: { id: n.id, kind: n.kind || "quota_threshold" } },
    h("h3", {}, n.title),
    h("p", {}, n.message),
    h("p", { class: "muted" }, `${dateTime(n.created_at)} · ${METRICS[n.metric] || n.metric} at ${n.threshold_pct}%`),
    h(
      "p",
      { class: "actions" },
      links.upgrade_plan ? h("a", { class: "button primary small", href: consoleLink(links.upgrade_plan) }, "Upgrade plan") : null,
      links.buy_quota_package ? h("a", { class: "button secondary small", href: consoleLink(links.buy_quota_package) }, "Buy quota package") : null,
      read,
    ),
  );
}

/** The webhook's signing secret, on screen this once (the server never returns it again). */
function webhookSecretPanel(secret, onDone) {
  return shownOncePanel(
    {
      secret,
      inputLabel: "Webhook signing secret",
      inputId: "webhook-secret",
      copyLabel: "Copy secret",
      titleId: "webhook-secret-title",
      title: "Your webhook signing secret",
      warning: "Copy this secret now and store it with your receiver: it is shown only this once. Every delivery carries a Tollgate-Signature header (t=<unix>,v1=<HMAC-SHA256 of \"t.body\">) your receiver checks with it.",
    },
    onDone,
  );
}

function deliveriesTable(items) {
  if (!items.length) return h("p", { class: "muted" }, "No deliveries yet: the rule has not fired.");
  const row = (d) =>
    h(
      "tr",
      { dataset: { status: d.status } },
      h("td", { "data-label": "Time" }, dateTime(d.time)),
      h("td", { "data-label": "Channel" }, (CHANNELS.find(([v]) => v === d.channel) || [d.channel, d.channel])[1]),
      h("td", { "data-label": "Recipient" }, d.recipient.replace(/^(url|email|phone|account):/, "")),
      h("td", { "data-label": "Attempt" }, String(d.attempt)),
      h("td", { "data-label": "Status code" }, d.status_code == null ? "—" : String(d.status_code)),
      h("td", { "data-label": "Error" }, d.error || (d.attempt === 0 ? "Not tried yet" : "OK")),
      h("td", { "data-label": "Next attempt" }, d.next_attempt_at ? dateTime(d.next_attempt_at) : "—"),
      h("td", { "data-label": "Message" }, d.status),
    );
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "responsive", id: "deliveries-table" },
      h("thead", {}, h("tr", {}, ["Time", "Channel", "Recipient", "Attempt", "Status code", "Error", "Next attempt", "Message"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, items.map(row)),
    ),
  );
}

function recipientsText(rule) {
  const named = (rule.recipients || []).filter((r) => !r.user_id).map((r) => r.email || r.phone || r.url || JSON.stringify(r));
  if (rule.channels.includes("in_site")) named.unshift("your in-site inbox");
  return named.join(", ");
}

export async function render(container, ctx) {
  const notifications = h("ul", { class: "notifications", id: "notifications" });
  const noteErrors = h("div");
  const rulesBody = h("tbody");
  const rulesErrors = h("div");
  const noRules = h("p", { class: "muted", hidden: true }, "No rules yet.");
  const secretSlot = h("div");
  const deliveries = h("section", { class: "card", id: "deliveries", "aria-labelledby": "deliveries-title", hidden: true });

  async function showDeliveries(rule, button) {
    const title = h("h2", { id: "deliveries-title" }, `Deliveries: ${METRICS[rule.metric] || rule.metric} at ${rule.threshold_pct}%`);
    const reload = h("button", { type: "button", class: "secondary small" }, "Reload");
    reload.addEventListener("click", () => busy(reload, () => showDeliveries(rule)));
    const close = h("button", { type: "button", class: "secondary small" }, "Close");
    close.addEventListener("click", () => { deliveries.hidden = true; deliveries.replaceChildren(); });
    const head = h("div", { class: "page-head" }, title, h("span", { class: "actions" }, reload, close));
    const hint = h("p", { class: "hint" }, "One line per attempt. Webhook, Slack and Teams posts are retried with backoff for 24 hours until the receiver accepts them.");
    try {
      const load = () => get(`/api/ai/usage/alert/${encodeURIComponent(rule.id)}/deliveries`);
      const data = button ? await busy(button, load) : await load();
      deliveries.replaceChildren(head, hint, deliveriesTable(data.items));
    } catch (err) {
      deliveries.replaceChildren(head, errorBox(err));
    }
    deliveries.hidden = false;
  }

  async function loadNotifications() {
    noteErrors.replaceChildren();
    try {
      const data = await get("/api/notifications");
      const items = data.items.map((n) => notificationItem(n, markRead));
      notifications.replaceChildren(...(items.length ? items : [h("li", { class: "muted" }, "No notifications.")]));
      ctx.refreshUnread();
    } catch (err) {
      noteErrors.append(errorBox(err));
    }
  }

  async function markRead(n, button) {
    noteErrors.replaceChildren();
    try {
      await busy(button, () => post(`/api/notifications/${encodeURIComponent(n.id)}/read`));
      await loadNotifications(); // also refreshes the unread badge
    } catch (err) {
      noteErrors.append(errorBox(err));
    }
  }

  // (v4) The account's keys, for the "For key" choice and to name a rule's key by its mask.
  const keyNames = new Map(); // api_key_id -> "name (sk-abcd...wxyz)"
  const keyLabel = (id) => keyNames.get(id) || h("code", {}, id);
  async function loadKeys() {
    try {
      const data = await get("/api/api-keys");
      for (const k of data.items) keyNames.set(k.id, `${k.name} (${k.masked_key})`);
      forKey.replaceChildren(h("option", { value: "" }, "The whole account"), ...data.items.map((k) => h("option", { value: k.id }, keyNames.get(k.id))));
    } catch (err) {
      formErrors.append(errorBox(err)); // account rules can still be made
    }
  }

  async function loadRules() {
    rulesErrors.replaceChildren();
    try {
      const data = await get("/api/ai/usage/alert");
      rulesBody.replaceChildren(...data.rules.map(ruleRow));
      noRules.hidden = data.rules.length > 0;
    } catch (err) {
      rulesErrors.append(errorBox(err));
    }
  }

  function ruleRow(rule) {
    const remove = h("button", { type: "button", class: "danger small", "aria-label": `Delete the ${METRICS[rule.metric] || rule.metric} ${rule.threshold_pct}% rule` }, "Delete");
    remove.addEventListener("click", async () => {
      const ok = await confirmDialog({ title: "Delete this rule?", message: "You will no longer be notified at this threshold.", confirmLabel: "Delete rule", danger: true });
      if (!ok) return;
      try {
        await del(`/api/ai/usage/alert/${rule.id}`);
        ctx.toast("Rule deleted.");
        await loadRules();
      } catch (err) {
        rulesErrors.append(errorBox(err));
      }
    });
    const log = h("button", { type: "button", class: "secondary small", "aria-label": `Deliveries of the ${METRICS[rule.metric] || rule.metric} ${rule.threshold_pct}% rule` }, "Deliveries");
    log.addEventListener("click", () => showDeliveries(rule, log));
    return h(
      "tr",
      { dataset: { ruleId: rule.id } },
      h("td", { "data-label": "Metric" }, METRICS[rule.metric] || rule.metric),
      h("td", { "data-label": "Threshold" }, `${rule.threshold_pct}%`),
      h("td", { "data-label": "Scope", class: "rule-scope" }, rule.scope && rule.scope.api_key_id ? ["Key ", keyLabel(rule.scope.api_key_id)] : "Account"),
      h("td", { "data-label": "Channels" }, rule.channels.map((c) => (CHANNELS.find(([v]) => v === c) || [c, c])[1]).join(", ")),
      h("td", { "data-label": "Recipients" }, recipientsText(rule)),
      h("td", { "data-label": "This period" }, rule.fired_this_period ? `Fired ${dateTime(rule.last_fired_at)}` : "Not fired"),
      h("td", { class: "row-actions" }, log, remove),
    );
  }

  const metric = select("metric", Object.entries(METRICS), "total_tokens");
  const threshold = h("input", { type: "number", name: "threshold_pct", min: 1, max: 100, step: 1, required: true, value: "80" });
  const channelBoxes = CHANNELS.map(([value, label]) => h("label", { class: "choice inline" }, h("input", { type: "checkbox", name: "channels", value, checked: value === "in_site" }), label));
  const forKey = select("api_key_id", [["", "The whole account"]], "");
  const emails = h("input", { type: "text", name: "emails", autocomplete: "off", placeholder: "ops@example.com" });
  const phones = h("input", { type: "text", name: "phones", autocomplete: "off", placeholder: "+15551234567" });
  const webhookUrl = h("input", { type: "url", name: "webhook_url", autocomplete: "off", placeholder: "https://hooks.example.com/tollgate" });
  const formErrors = h("div");
  const save = h("button", { type: "submit", class: "primary" }, "Add rule");
  const form = h(
    "form",
    { class: "card inline-form", "aria-labelledby": "rule-title" },
    h("h2", { id: "rule-title" }, "New alert rule"),
    h("div", { class: "row" }, field("Metric", metric), field("Threshold (% of quota)", threshold), field("For key", forKey, "Optional: watch this key's own limits on the metric's resource (each limit's day, week, month or one-time window) instead of the account's quota.")),
    h("fieldset", {}, h("legend", {}, "Channels"), channelBoxes),
    h("div", { class: "row" }, field("E-mail recipients", emails, "Comma-separated; for the e-mail channel."), field("SMS recipients", phones, "Comma-separated phone numbers; for the SMS channel.")),
    h("div", { class: "row" }, field("Webhook URL", webhookUrl, "For the webhook, Slack or Microsoft Teams channel (one of them per rule): the receiver's URL, or the Slack or Teams channel's incoming-webhook URL (https). Reachable from the internet: private and loopback addresses are refused. Webhooks get signed JSON; Slack and Teams get a message in their own format.")),
    formErrors,
    h("div", { class: "actions" }, save),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    formErrors.replaceChildren();
    const channels = [...form.querySelectorAll("input[name=channels]:checked")].map((x) => x.value);
    const recipients = [
      ...splitList(emails.value).map((email) => ({ email })),
      ...splitList(phones.value).map((phone) => ({ phone })),
      ...(webhookUrl.value.trim() ? [{ url: webhookUrl.value.trim() }] : []),
    ];
    try {
      const body = { metric: metric.value, threshold_pct: Number(threshold.value), channels, recipients };
      if (forKey.value) body.scope = { api_key_id: forKey.value };
      const created = await busy(save, () => post("/api/ai/usage/alert", body));
      ctx.toast("Alert rule added.");
      emails.value = "";
      phones.value = "";
      webhookUrl.value = "";
      if (created && created.webhook_secret) {
        secretSlot.replaceChildren(webhookSecretPanel(created.webhook_secret, () => webhookUrl.focus()));
        secretSlot.firstChild.focus();
      }
      await loadRules();
    } catch (err) {
      formErrors.append(errorBox(err));
    }
  });

  const refresh = h("button", { type: "button", class: "secondary small" }, "Refresh");
  refresh.addEventListener("click", () => busy(refresh, loadNotifications));
  container.append(
    h("h1", {}, "Alerts"),
    h(
      "section",
      { class: "card", "aria-labelledby": "notes-title" },
      h("div", { class: "page-head" }, h("h2", { id: "notes-title" }, "Notifications"), refresh),
      noteErrors,
      notifications,
    ),
    form,
    secretSlot,
    h(
      "section",
      { class: "card", "aria-labelledby": "rules-title" },
      h("h2", { id: "rules-title" }, "Rules"),
      rulesErrors,
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { class: "responsive", id: "rules-table" },
          h("thead", {}, h("tr", {}, ["Metric", "Threshold", "Scope", "Channels", "Recipients", "This period"].map((t) => h("th", { scope: "col" }, t)), h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")))),
          rulesBody,
        ),
      ),
      noRules,
    ),
    deliveries,
  );
  await loadKeys(); // first: the rules name their keys
  await Promise.all([loadNotifications(), loadRules()]);
  const timer = setInterval(() => { if (!document.hidden) loadNotifications(); }, 20000);
  ctx.onCleanup(() => clearInterval(timer));
}
