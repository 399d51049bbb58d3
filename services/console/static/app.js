// The console shell: path routing (/console/keys ...), the signed-in account, navigation and toasts.
import { ApiError, get, post, session } from "./api.js";
import { clear, errorBox, h } from "./dom.js";
import * as alertsPage from "./page-alerts.js";
import * as auditPage from "./page-audit.js";
import * as authPage from "./page-auth.js";
import * as keysPage from "./page-keys.js";
import * as membersPage from "./page-members.js";
import * as planPage from "./page-plan.js";
import * as quotaPage from "./page-quota.js";
import * as usagePage from "./page-usage.js";

const PAGES = {
  signin: authPage,
  register: authPage,
  keys: keysPage,
  quota: quotaPage,
  usage: usagePage,
  alerts: alertsPage,
  plan: planPage,
  members: membersPage,
  audit: auditPage,
};
const PUBLIC = new Set(["signin", "register"]);
const DEFAULT = "keys";

const main = document.getElementById("main");
const nav = document.getElementById("site-nav");
const menuToggle = document.getElementById("menu-toggle");
const whoami = document.getElementById("whoami");
const unread = document.getElementById("unread");
const toastEl = document.getElementById("toast");

const state = { account: null, cleanup: [], next: null };

export function toast(message) {
  toastEl.textContent = message;
  toastEl.classList.add("show");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => toastEl.classList.remove("show"), 4000);
}

const BASE = "/console";

/** Path routing (/console/keys ...): links in e-mails and notifications open the right page. */
export function navigate(route, { replace = false } = {}) {
  const url = `${BASE}/${route}`;
  if (replace) history.replaceState(null, "", url);
  else if (location.pathname + location.search !== url) history.pushState(null, "", url);
  render();
}

function parseLocation() {
  const rest = location.pathname.startsWith(BASE) ? location.pathname.slice(BASE.length) : "";
  return { route: rest.replace(/^\/+|\/+$/g, ""), params: new URLSearchParams(location.search) };
}

async function loadAccount() {
  state.account = await get("/api/account");
  document.getElementById("whoami-name").textContent = `${state.account.name} · ${state.account.plan}`;
  // Only owners and billing members may read the audit log: the others do not see the link.
  document.getElementById("nav-audit").hidden = !auditPage.canRead(state.account);
  return state.account;
}

export async function refreshUnread() {
  try {
    const data = await get("/api/notifications");
    const count = (data.items || []).filter((n) => !n.read).length;
    unread.hidden = count === 0;
    unread.textContent = String(count);
    unread.setAttribute("aria-label", `${count} unread notifications`);
  } catch {
    unread.hidden = true; // the badge is a hint; the alerts page shows any real error
  }
}

function setChrome(signedIn, route) {
  nav.hidden = !signedIn;
  whoami.hidden = !signedIn;
  menuToggle.hidden = !signedIn;
  document.body.classList.toggle("signed-in", signedIn);
  for (const link of nav.querySelectorAll("a[data-route]")) {
    if (link.dataset.route === route) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  nav.classList.remove("open");
  menuToggle.setAttribute("aria-expanded", "false");
}

let generation = 0;

async function render() {
  generation += 1;
  const mine = generation; // a newer navigation makes this render's late results moot
  const { route: wanted, params } = parseLocation();
  for (const fn of state.cleanup.splice(0)) fn();
  const signedIn = Boolean(session.token);
  let route = wanted in PAGES ? wanted : signedIn ? DEFAULT : "signin";
  if (!signedIn && !PUBLIC.has(route)) {
    if (wanted in PAGES) state.next = location.pathname + location.search; // come back here after signing in
    route = "signin";
  }
  if (signedIn && PUBLIC.has(route)) route = DEFAULT;
  if (route !== wanted) history.replaceState(null, "", `${BASE}/${route}`);
  setChrome(signedIn, route);
  const page = PAGES[route];
  const container = h("div", { class: "page" });
  clear(main, container);
  const ctx = {
    route,
    params,
    account: state.account,
    navigate,
    toast,
    refreshUnread,
    reloadAccount: loadAccount,
    onCleanup: (fn) => state.cleanup.push(fn),
    afterSignIn: () => {
      const next = state.next;
      state.next = null;
      if (next) {
        history.replaceState(null, "", next);
        render();
      } else navigate(DEFAULT);
    },
  };
  try {
    if (signedIn && !state.account) ctx.account = await loadAccount();
    await page.render(container, ctx);
    if (signedIn) refreshUnread();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return; // signed-out handler re-renders
    container.append(errorBox(err));
  }
  if (mine !== generation) return;
  document.title = `${container.querySelector("h1")?.textContent || "Console"} · Tollgate`;
  // Move focus to the new page so keyboard and screen-reader users start at its heading.
  if (!main.contains(document.activeElement)) main.focus({ preventScroll: true });
}

menuToggle.addEventListener("click", () => {
  const open = !nav.classList.contains("open");
  nav.classList.toggle("open", open);
  menuToggle.setAttribute("aria-expanded", String(open));
});

// Log out ends the session on the server (every replica refuses it at once), then here.
document.getElementById("sign-out").addEventListener("click", async (event) => {
  const button = event.currentTarget;
  button.disabled = true;
  try {
    if (session.token) await post("/api/auth/logout");
  } catch {
    // already ended (401) or unreachable: the browser forgets the session either way
  } finally {
    button.disabled = false;
  }
  session.clear();
  state.account = null;
  toast("You are logged out.");
  navigate("signin");
});

window.addEventListener("tollgate:signed-out", (event) => {
  state.account = null;
  toast((event.detail && event.detail.toast) || "Your session has ended; please sign in again.");
  navigate("signin");
});

window.addEventListener("popstate", () => render());

// Same-document navigation for console links (plain clicks only: new tabs etc. still work).
document.addEventListener("click", (event) => {
  const link = event.target.closest("a[href]");
  if (!link || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const url = new URL(link.href, location.href);
  if (url.origin !== location.origin || !url.pathname.startsWith(`${BASE}/`) || url.pathname.startsWith(`${BASE}/assets/`)) return;
  event.preventDefault();
  history.pushState(null, "", url.pathname + url.search);
  render();
});

document.querySelector(".skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});

export function signedIn(account) {
  state.account = account;
}

render();
