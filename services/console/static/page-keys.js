// API keys (personal centre): list masked, create (full key shown once), toggle, rotate, delete,
// and (v4) open one key to set or clear its own rules (key-view.js).
import { del, get, post } from "./api.js";
import { busy, confirmDialog, errorBox, field, h, nextId, select, shownOncePanel } from "./dom.js";
import { countdown, dateTime, titleCase } from "./format.js";
import { keyView } from "./key-view.js";
import { keyUsage } from "./key-usage.js";

const GRACE = [
  ["0", "No grace: the old key stops now"],
  ["3600", "1 hour"],
  ["86400", "24 hours"],
  ["604800", "7 days"],
];

/** The one and only time a full secret is on screen. It lives in this element alone. */
function secretPanel(created, onDone) {
  return shownOncePanel(
    {
      secret: created.key,
      inputLabel: `Full API key for ${created.name}`,
      copyLabel: "Copy key",
      titleId: "secret-title",
      title: `Your new key “${created.name}”`,
      warning: "Copy this key now and store it somewhere safe. For your security it is shown only this once: Tollgate keeps only a hash and cannot show it again.",
    },
    onDone,
  );
}

export async function render(container, ctx) {
  const slot = h("div");
  const viewSlot = h("div", { id: "key-view-slot" });
  const listErrors = h("div");
  const tbody = h("tbody");
  const empty = h("p", { class: "muted", hidden: true }, "No keys yet. Create one above to call the API.");

  const showSecret = (created) => {
    slot.replaceChildren(secretPanel(created, () => container.querySelector("#key-name")?.focus()));
    slot.firstChild.focus();
  };

  function openKey(key) {
    const view = keyView(key, {
      onSaved: async (updated) => {
        ctx.toast(`Rules of key “${updated.name}” saved.`);
        await load();
        openKey(updated);
      },
      onClose: () => viewSlot.replaceChildren(),
    });
    viewSlot.replaceChildren(view);
    view.querySelector("#key-view-title").focus();
  }

  async function load() {
    listErrors.replaceChildren();
    try {
      const data = await get("/api/api-keys");
      tbody.replaceChildren(...data.items.map(row));
      empty.hidden = data.items.length > 0;
    } catch (err) {
      listErrors.append(errorBox(err));
    }
  }

  // Older than 90 days: the seed's advice is to rotate it (the alerts page also has one reminder).
  // A key already rotated is in its grace period instead: its successor is the one to rotate.
  function rotationDue(key) {
    if (key.status === "expired") return "";
    if (key.rotated) {
      const title = "Rotated: it stops at its expiry; rotate its successor";
      return h("span", { class: "status status-rotation status-replaced", title }, "Replaced");
    }
    if (!key.rotation_due) return "";
    return h("span", { class: "status status-rotation", title: "Older than 90 days: rotate it" }, "Rotation due");
  }

  function expiry(key) {
    if (!key.expires_at) return "Never";
    if (key.status === "expired") return dateTime(key.expires_at);
    return h("span", {}, dateTime(key.expires_at), " ", h("small", { class: "countdown" }, `(${countdown(key.expires_at)})`));
  }

  function row(key) {
    const status = h("span", { class: `status status-${key.status}` }, titleCase(key.status));
    const toggle = h(
      "button",
      { type: "button", class: "secondary small", "aria-label": `${key.status === "enabled" ? "Disable" : "Enable"} key ${key.name}` },
      key.status === "enabled" ? "Disable" : "Enable",
    );
    toggle.hidden = key.status === "expired"; // refused whatever its switch says: rotate or delete it
    toggle.addEventListener("click", async () => {
      listErrors.replaceChildren();
      try {
        const result = await busy(toggle, () => post(`/api/api-keys/${key.id}/toggle`));
        ctx.toast(`Key “${key.name}” is now ${result.status}.`);
        await load();
      } catch (err) {
        listErrors.append(errorBox(err));
      }
    });
    const rules = h("button", { type: "button", class: "secondary small", "aria-label": `Rules of key ${key.name}` }, "Rules");
    rules.addEventListener("click", () => openKey(key));
    const rotate = h("button", { type: "button", class: "secondary small", "aria-label": `Rotate key ${key.name}` }, "Rotate");
    rotate.hidden = Boolean(key.rotated); // rotated once already (409 again): its successor is rotated instead
    rotate.addEventListener("click", () => rotateDialog(key));
    const remove = h("button", { type: "button", class: "danger small", "aria-label": `Delete key ${key.name}` }, "Delete");
    remove.addEventListener("click", async () => {
      const ok = await confirmDialog({
        title: `Delete key “${key.name}”?`,
        message: "This is permanent. Every call made with this key fails at once, and it cannot be restored.",
        confirmLabel: "Delete key",
        danger: true,
      });
      if (!ok) return;
      listErrors.replaceChildren();
      try {
        await del(`/api/api-keys/${key.id}`);
        ctx.toast(`Key “${key.name}” deleted.`);
        await load();
      } catch (err) {
        listErrors.append(errorBox(err));
      }
    });
    return h(
      "tr",
      { dataset: { keyId: key.id } },
      h("td", { "data-label": "Name" }, key.name, keyUsage(key)),
      h("td", { "data-label": "Key" }, h("code", {}, key.masked_key)),
      h("td", { "data-label": "Status" }, status, rotationDue(key)),
      h("td", { "data-label": "Expires" }, expiry(key)),
      h("td", { "data-label": "Last used" }, key.last_used_at ? dateTime(key.last_used_at) : "Never"),
      h("td", { "data-label": "Created" }, dateTime(key.created_at)),
      h("td", { class: "row-actions" }, rules, toggle, rotate, remove),
    );
  }

  function rotateDialog(key) {
    const titleId = nextId("dlg");
    const grace = select("grace_seconds", GRACE, "3600");
    const errors = h("div");
    const go = h("button", { type: "submit", class: "primary" }, "Rotate key");
    const cancel = h("button", { type: "button", class: "secondary" }, "Cancel");
    const form = h(
      "form",
      {},
      h("p", {}, "A new key replaces this one. The old key keeps working during the grace period, then it is deleted."),
      field("Grace period for the old key", grace),
      errors,
      h("div", { class: "actions" }, cancel, go),
    );
    const dialog = h("dialog", { class: "dialog", "aria-labelledby": titleId }, h("h2", { id: titleId }, `Rotate key “${key.name}”`), form);
    cancel.addEventListener("click", () => dialog.close());
    dialog.addEventListener("close", () => dialog.remove());
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      errors.replaceChildren();
      try {
        const created = await busy(go, () => post(`/api/api-keys/${key.id}/rotate`, { grace_seconds: Number(grace.value) }));
        dialog.close();
        showSecret(created);
        await load();
      } catch (err) {
        errors.append(errorBox(err));
      }
    });
    document.body.append(dialog);
    dialog.showModal();
  }

  const name = h("input", { type: "text", name: "name", id: "key-name", required: true, maxlength: 100, placeholder: "e.g. production server" });
  const expires = h("input", { type: "datetime-local", name: "expires_at" });
  const createErrors = h("div");
  const create = h("button", { type: "submit", class: "primary" }, "Create key");
  const form = h(
    "form",
    { class: "card inline-form", "aria-labelledby": "create-title" },
    h("h2", { id: "create-title" }, "Create a key"),
    h("div", { class: "row" }, field("Name", name), field("Expires (optional)", expires, "Leave empty for a key that never expires.")),
    createErrors,
    h("div", { class: "actions" }, create),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    createErrors.replaceChildren();
    const body = { name: name.value.trim(), expires_at: expires.value ? new Date(expires.value).toISOString() : null };
    try {
      const created = await busy(create, () => post("/api/api-keys", body));
      form.reset();
      showSecret(created);
      await load();
    } catch (err) {
      createErrors.append(errorBox(err));
    }
  });

  container.append(
    h("h1", {}, "API keys"),
    h("p", { class: "lead" }, "Keys let your programs call Tollgate. Only a masked form is shown after creation."),
    slot,
    form,
    h(
      "section",
      { class: "card", "aria-labelledby": "keys-title" },
      h("h2", { id: "keys-title" }, "Your keys"),
      listErrors,
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { class: "responsive", id: "keys-table" },
          h("thead", {}, h("tr", {}, ["Name", "Key", "Status", "Expires", "Last used", "Created"].map((t) => h("th", { scope: "col" }, t)), h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")))),
          tbody,
        ),
      ),
      empty,
    ),
    viewSlot,
  );
  await load();
}
