// Members (v2): the account's users and their roles; an owner adds, re-roles and removes them.
import { del, get, post, put } from "./api.js";
import { busy, confirmDialog, errorBox, field, h, select } from "./dom.js";
import { dateTime, titleCase } from "./format.js";

const ROLES = [
  ["owner", "Owner"],
  ["developer", "Developer"],
  ["billing", "Billing"],
  ["viewer", "Viewer"],
];
const ROLE_HINT =
  "The initial password has at least 8 characters; the member signs in with it. Owner: everything, every key, members. Developer: the keys it creates, usage, alerts, projects. Billing: every read, plan and payments. Viewer: read only.";

export async function render(container, ctx) {
  const account = ctx.account || (await ctx.reloadAccount());
  const isOwner = account.role === "owner" || (!account.role && (account.roles || []).includes("owner"));
  const listErrors = h("div");
  const tbody = h("tbody");

  async function load() {
    listErrors.replaceChildren();
    try {
      const data = await get("/api/account/members");
      tbody.replaceChildren(...data.items.map(row));
    } catch (err) {
      listErrors.append(errorBox(err));
    }
  }

  function row(member) {
    const isMe = member.id === account.id && member.email === account.email;
    const role = select("role", ROLES, member.role);
    role.setAttribute("aria-label", `Role of ${member.name}`);
    role.disabled = !isOwner;
    role.addEventListener("change", async () => {
      listErrors.replaceChildren();
      try {
        const changed = await put(`/api/account/members/${member.id}/role`, { role: role.value });
        ctx.toast(`${member.name} is now ${titleCase(changed.role)}.`);
        await load();
      } catch (err) {
        role.value = member.role;
        listErrors.append(errorBox(err));
      }
    });
    const remove = h("button", { type: "button", class: "danger small", "aria-label": `Remove member ${member.name}` }, "Remove");
    remove.hidden = !isOwner;
    remove.addEventListener("click", async () => {
      const ok = await confirmDialog({
        title: `Remove ${member.name}?`,
        message: "Their sessions end and the API keys they created stop working at once. This cannot be undone.",
        confirmLabel: "Remove member",
        danger: true,
      });
      if (!ok) return;
      listErrors.replaceChildren();
      try {
        await busy(remove, () => del(`/api/account/members/${member.id}`));
        ctx.toast(`${member.name} removed.`);
        await load();
      } catch (err) {
        listErrors.append(errorBox(err));
      }
    });
    return h(
      "tr",
      { dataset: { memberId: member.id } },
      h("td", { "data-label": "Name" }, member.name, isMe ? h("span", { class: "muted" }, " (registered the account)") : null),
      h("td", { "data-label": "Email" }, member.email),
      h("td", { "data-label": "Role" }, role),
      h("td", { "data-label": "Added" }, dateTime(member.created_at)),
      h("td", { class: "row-actions" }, remove),
    );
  }

  const name = h("input", { type: "text", name: "name", id: "member-name", required: true, maxlength: 200 });
  const email = h("input", { type: "email", name: "email", id: "member-email", required: true, maxlength: 254 });
  const password = h("input", { type: "password", name: "password", id: "member-password", required: true, minlength: 8, maxlength: 1024, autocomplete: "new-password" });
  const role = select("role", ROLES, "developer");
  role.id = "member-role";
  const addErrors = h("div");
  const add = h("button", { type: "submit", class: "primary" }, "Add member");
  const form = h(
    "form",
    { class: "card inline-form", "aria-labelledby": "add-member-title" },
    h("h2", { id: "add-member-title" }, "Add a member"),
    h(
      "div",
      { class: "row" },
      field("Member name", name),
      field("Member email", email),
      field("Initial password", password),
      field("Role", role),
    ),
    h("p", { class: "hint" }, ROLE_HINT),
    addErrors,
    h("div", { class: "actions" }, add),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    addErrors.replaceChildren();
    const body = { name: name.value.trim(), email: email.value.trim(), password: password.value, role: role.value };
    try {
      const added = await busy(add, () => post("/api/account/members", body));
      form.reset();
      role.value = "developer";
      ctx.toast(`${added.name} added as ${titleCase(added.role)}.`);
      await load();
    } catch (err) {
      addErrors.append(errorBox(err));
    }
  });

  container.append(
    h("h1", {}, "Members"),
    h(
      "p",
      { class: "lead" },
      "People (or robot users for one script) who sign in to this account. API keys act with the current role of the member who created them.",
    ),
    isOwner ? form : h("p", { class: "muted" }, `Your role is ${titleCase(account.role || "viewer")}: only an owner can change members.`),
    h(
      "section",
      { class: "card", "aria-labelledby": "members-title" },
      h("h2", { id: "members-title" }, "Members"),
      listErrors,
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { class: "responsive", id: "members-table" },
          h("thead", {}, h("tr", {}, ["Name", "Email", "Role", "Added"].map((t) => h("th", { scope: "col" }, t)), h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")))),
          tbody,
        ),
      ),
    ),
  );
  await load();
}
