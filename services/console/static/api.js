// The only way the console talks to Tollgate: the public API with a console session.

const TOKEN_KEY = "tollgate.session";
const EXPIRES_KEY = "tollgate.session.expires";

export class ApiError extends Error {
  constructor(status, code, message, details, requestId) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
    this.requestId = requestId;
  }
}

export const session = {
  get token() {
    const expires = Number(sessionStorage.getItem(EXPIRES_KEY) || 0);
    if (expires && Date.now() >= expires) {
      this.clear();
      return null;
    }
    return sessionStorage.getItem(TOKEN_KEY);
  },
  set(token, expiresInSeconds) {
    sessionStorage.setItem(TOKEN_KEY, token);
    if (expiresInSeconds) sessionStorage.setItem(EXPIRES_KEY, String(Date.now() + expiresInSeconds * 1000));
  },
  clear() {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(EXPIRES_KEY);
  },
};

function query(params) {
  const pairs = Object.entries(params || {}).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return pairs.length ? `?${new URLSearchParams(pairs)}` : "";
}

/** A fresh Idempotency-Key for one user action (orders, payments): a retry of that action with
 * the same key is answered with the first response and never charges twice. */
export function newIdempotencyKey() {
  if (typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16)); // outside a secure context
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** fetch + the contract's error body turned into an ApiError whose message is for people. */
export async function api(method, path, { body, params, idempotencyKey } = {}) {
  const headers = { Accept: "application/json" };
  const token = session.token;
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
  let response;
  try {
    response = await fetch(path + query(params), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit",
      cache: "no-store",
    });
  } catch {
    throw new ApiError(0, "network_error", "Tollgate could not be reached. Check your connection and try again.");
  }
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const err = (data && data.error) || {};
    const message = err.message || `The server answered ${response.status} ${response.statusText}.`;
    const error = new ApiError(response.status, err.code || `http_${response.status}`, message, err.details, err.request_id);
    if (response.status === 401 && token && ["invalid_session", "missing_credentials"].includes(error.code)) {
      session.clear();
      window.dispatchEvent(new CustomEvent("tollgate:signed-out", { detail: error }));
    }
    throw error;
  }
  return data;
}

export const get = (path, params) => api("GET", path, { params });
export const post = (path, body, options = {}) => api("POST", path, { body, ...options });
export const put = (path, body) => api("PUT", path, { body });
export const patch = (path, body) => api("PATCH", path, { body });
export const del = (path) => api("DELETE", path);

/** GET `path` as CSV (Accept: text/csv, the session header) and save it as `filename`. */
export async function download(path, params, filename) {
  const headers = { Accept: "text/csv" };
  const token = session.token;
  if (token) headers.Authorization = `Bearer ${token}`;
  let response;
  try {
    response = await fetch(path + query(params), { headers, credentials: "omit", cache: "no-store" });
  } catch {
    throw new ApiError(0, "network_error", "Tollgate could not be reached. Check your connection and try again.");
  }
  if (!response.ok) {
    const err = ((await response.json().catch(() => null)) || {}).error || {};
    throw new ApiError(response.status, err.code || `http_${response.status}`, err.message || `The server answered ${response.status}.`, err.details, err.request_id);
  }
  const url = URL.createObjectURL(await response.blob());
  const link = Object.assign(document.createElement("a"), { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
