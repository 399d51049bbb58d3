// Tiny DOM helpers: build elements from data without innerHTML, so nothing the API returns
// can ever become markup (no XSS by construction).

import { amount, dateTime, resourceName } from "./format.js";

const SVG_NS = "http://www.w3.org/2000/svg";

function apply(el, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2).toLowerCase(), value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "style" && typeof value === "object") {
      Object.assign(el.style, value); // CSSOM, allowed by the CSP (attributes would not be)
    } else if (name in el && !(el instanceof SVGElement) && typeof value !== "string") {
      el[name] = value; // properties such as checked, disabled, value
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** h("button", {class: "primary", onclick}, "Save") */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

/** The SVG counterpart of h(). */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

let uid = 0;
/** A unique id for label/aria wiring. */
export function nextId(prefix = "f") {
  uid += 1;
  return `${prefix}-${uid}`;
}

/** A labelled form field: the label is always a real <label for=...>. */
export function field(label, input, hint) {
  const id = input.id || nextId("field");
  input.id = id;
  const hintEl = hint ? h("small", { class: "hint", id: `${id}-hint` }, hint) : null;
  if (hintEl) input.setAttribute("aria-describedby", hintEl.id);
  return h("div", { class: "field" }, h("label", { for: id }, label), input, hintEl);
}

export function select(name, options, value) {
  return h(
    "select",
    { name },
    options.map(([v, text]) => h("option", { value: v, selected: v === value }, text)),
  );
}

/** An error shown in words (the API's error.message), announced to screen readers. */
export function errorBox(err) {
  const box = h("div", { class: "error", role: "alert" }, h("p", {}, err.message || String(err)));
  if (Array.isArray(err.details) && err.details.length) {
    box.append(h("ul", {}, err.details.map((d) => h("li", {}, d.field ? `${d.field}: ${d.message}` : d.message || JSON.stringify(d)))));
  }
  if (err.code === "insufficient_quota" && err.details && typeof err.details === "object") box.append(...quotaHelp(err.details));
  return box;
}

/** Links from the server point at the console; keep them on the console the user is using. */
export function consoleLink(url) {
  try {
    const parsed = new URL(url, location.href);
    if (parsed.pathname.startsWith("/console")) return `${location.origin}${parsed.pathname}${parsed.search}`;
    return parsed.protocol === "https:" || parsed.protocol === "http:" ? parsed.href : "/console/plan";
  } catch {
    return "/console/plan";
  }
}

/** What a 403 insufficient_quota says: which resource, used of total, when it resets, the way out. */
function quotaHelp(d) {
  const links = d.links || {};
  const ends = d.period_end ? ` The period ends ${dateTime(d.period_end)}.` : "";
  return [
    h("p", { class: "quota-details" }, `${resourceName(d.resource)}: ${amount(d.resource, d.used)} of ${amount(d.resource, d.total)} used.${ends}`),
    h(
      "div",
      { class: "actions" },
      links.upgrade_plan ? h("a", { class: "button primary small", href: consoleLink(links.upgrade_plan) }, "Upgrade plan") : null,
      links.buy_quota_package ? h("a", { class: "button secondary small", href: consoleLink(links.buy_quota_package) }, "Buy quota package") : null,
    ),
  ];
}

/** A modal confirmation (native <dialog>: focus trap and Escape for free). Resolves true/false. */
export function confirmDialog({ title, message, confirmLabel = "Confirm", danger = false }) {
  return new Promise((resolve) => {
    const titleId = nextId("dlg");
    const dialog = h(
      "dialog",
      { class: "dialog", "aria-labelledby": titleId },
      h("h2", { id: titleId }, title),
      h("p", {}, message),
      h(
        "form",
        { method: "dialog", class: "actions" },
        h("button", { value: "cancel", class: "secondary" }, "Cancel"),
        h("button", { value: "ok", class: danger ? "danger" : "primary" }, confirmLabel),
      ),
    );
    dialog.addEventListener("close", () => {
      resolve(dialog.returnValue === "ok");
      dialog.remove();
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

/** Run an async action with its button disabled, so a double click cannot submit twice. */
export async function busy(button, action) {
  const wasDisabled = button ? button.disabled : false;
  if (button) {
    button.disabled = true;
    button.setAttribute("aria-busy", "true");
  }
  try {
    return await action();
  } finally {
    if (button) {
      button.disabled = wasDisabled;
      button.removeAttribute("aria-busy");
    }
  }
}

/**
 * A secret on screen the one time it is shown (a new API key, a webhook's signing secret): the
 * value lives in this element alone, with a copy button; "I have stored it" clears and removes it.
 */
export function shownOncePanel({ secret, inputLabel, inputId, copyLabel, titleId, title, warning }, onDone) {
  const input = h("input", { type: "text", readOnly: true, value: secret, class: "secret-value", id: inputId, "aria-label": inputLabel });
  const copy = h("button", { type: "button", class: "primary" }, copyLabel);
  copy.addEventListener("click", async () => {
    input.select();
    try {
      await navigator.clipboard.writeText(secret);
    } catch {
      document.execCommand("copy"); // older browsers and non-secure origins
    }
    copy.textContent = "Copied";
  });
  const done = h("button", { type: "button", class: "secondary" }, "I have stored it");
  const panel = h(
    "section",
    { class: "card secret-panel", "aria-labelledby": titleId, tabindex: "-1" },
    h("h2", { id: titleId }, title),
    h("p", { class: "warning", role: "alert" }, warning),
    h("div", { class: "secret-row" }, input, copy),
    h("div", { class: "actions" }, done),
  );
  done.addEventListener("click", () => {
    input.value = "";
    panel.remove();
    onDone();
  });
  return panel;
}

/** A table paged by the API's keyset cursor: `load()` fills it anew, `load(true)` appends the next
 *  page; "Load more" shows while there is one, the empty note when nothing matched. */
export function cursorPaged({ fetchPage, line, tbody, more, empty, errors }) {
  let cursor = null;
  return async function load(append = false) {
    errors.replaceChildren();
    try {
      const data = await fetchPage(append ? cursor : "");
      const rows = data.items.map(line);
      if (append) tbody.append(...rows);
      else tbody.replaceChildren(...rows);
      cursor = data.next_cursor || null;
      more.hidden = !cursor;
      empty.hidden = tbody.children.length > 0;
    } catch (err) {
      errors.append(errorBox(err));
    }
  };
}
