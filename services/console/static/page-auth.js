// Sign in and register (with the user type). Registering signs you in straight away.
import { post, session } from "./api.js";
import { busy, errorBox, field, h } from "./dom.js";

async function signIn(email, password) {
  const token = await post("/api/auth/login", { email, password });
  session.set(token.access_token, token.expires_in);
}

function signInForm(ctx) {
  const email = h("input", { type: "email", name: "email", autocomplete: "username", required: true });
  const password = h("input", { type: "password", name: "password", autocomplete: "current-password", required: true });
  const errors = h("div");
  const submit = h("button", { type: "submit", class: "primary" }, "Sign in");
  const form = h(
    "form",
    { class: "card auth-card", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    field("Email", email),
    field("Password", password),
    errors,
    h("div", { class: "actions" }, submit),
    h("p", {}, "New to Tollgate? ", h("a", { href: "/console/register" }, "Create an account")),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errors.replaceChildren();
    try {
      await busy(submit, () => signIn(email.value.trim(), password.value));
      await ctx.reloadAccount();
      ctx.afterSignIn();
    } catch (err) {
      errors.append(errorBox(err));
    }
  });
  return form;
}

function registerForm(ctx) {
  const name = h("input", { type: "text", name: "name", autocomplete: "name", required: true, maxlength: 200 });
  const email = h("input", { type: "email", name: "email", autocomplete: "email", required: true });
  const password = h("input", { type: "password", name: "password", autocomplete: "new-password", required: true, minlength: 8 });
  const userType = (value, label, hint) =>
    h(
      "label",
      { class: "choice" },
      h("input", { type: "radio", name: "user_type", value, checked: value === "individual" }),
      h("span", {}, h("strong", {}, label), h("small", { class: "hint" }, hint)),
    );
  const errors = h("div");
  const submit = h("button", { type: "submit", class: "primary" }, "Create account");
  const form = h(
    "form",
    { class: "card auth-card", "aria-labelledby": "register-title" },
    h("h1", { id: "register-title" }, "Create an account"),
    field("Name", name),
    field("Email", email),
    field("Password", password, "At least 8 characters."),
    h(
      "fieldset",
      {},
      h("legend", {}, "User type"),
      userType("individual", "Individual", "For a person. Plans up to Professional."),
      userType("enterprise", "Enterprise", "For a company. Every plan, including Enterprise."),
    ),
    errors,
    h("div", { class: "actions" }, submit),
    h("p", {}, "Already registered? ", h("a", { href: "/console/signin" }, "Sign in")),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errors.replaceChildren();
    const chosen = form.querySelector("input[name=user_type]:checked").value;
    try {
      await busy(submit, async () => {
        await post("/api/auth/register", { email: email.value.trim(), password: password.value, name: name.value.trim(), user_type: chosen });
        await signIn(email.value.trim(), password.value);
      });
      await ctx.reloadAccount();
      ctx.toast("Welcome! Your account is on the free plan.");
      ctx.afterSignIn();
    } catch (err) {
      errors.append(errorBox(err));
    }
  });
  return form;
}

export async function render(container, ctx) {
  container.classList.add("auth");
  container.append(ctx.route === "register" ? registerForm(ctx) : signInForm(ctx));
  container.querySelector("input")?.focus();
}
