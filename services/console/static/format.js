// Formatting for people: numbers, money, bytes, dates, and the names of resources.

const integer = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat(undefined, { maximumFractionDigits: 2 });

export const RESOURCES = {
  ai_tokens: "AI tokens",
  api_calls: "API calls",
  geo_projects: "GEO projects",
  storage_bytes: "Storage",
  ai_conversations: "AI conversations",
  content_publishes: "Content publishes",
};

export const METRICS = { total_tokens: "Total tokens", api_calls: "API calls", storage: "Storage" };

export const resourceName = (r) => RESOURCES[r] || r;

export function num(n) {
  return n === null || n === undefined ? "–" : integer.format(Number(n));
}

export function dec(n) {
  return n === null || n === undefined ? "–" : decimal.format(Number(n));
}

export function bytes(n) {
  let value = Number(n);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(value) >= 1024 && i < units.length - 1) {
    value /= 1024;
    i += 1;
  }
  return `${decimal.format(value)} ${units[i]}`;
}

/** An amount of a resource in its natural unit. */
export function amount(resource, n) {
  return resource === "storage_bytes" ? bytes(n) : num(n);
}

/** Money stays a decimal string end to end (never a float). */
export function money(value, currency) {
  if (value === null || value === undefined) return "–";
  return `${value} ${currency || ""}`.trim();
}

export function pct(n) {
  return n === null || n === undefined ? "–" : `${decimal.format(Number(n))}%`;
}

/** "+12.5%" / "−3%" / "new" for a change against the previous period. */
export function change(n) {
  if (n === null || n === undefined) return "new: none in the previous period";
  const v = Number(n);
  if (!Number.isFinite(v)) return "new";
  const sign = v > 0 ? "+" : v < 0 ? "−" : "±";
  return `${sign}${decimal.format(Math.abs(v))}% vs previous period`;
}

export function dateTime(iso) {
  if (!iso) return "–";
  return new Date(iso).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

export function date(iso) {
  if (!iso) return "–";
  return new Date(iso).toLocaleDateString(undefined, { dateStyle: "medium" });
}

/** "in 3 days", "in 5 hours", "in 12 minutes": how long until `iso` (a key's expiry). */
export function countdown(iso, now = new Date()) {
  const minutes = Math.max(0, Math.round((new Date(iso) - now) / 60000));
  const [n, unit] = minutes >= 2880 ? [Math.floor(minutes / 1440), "day"] : minutes >= 120 ? [Math.floor(minutes / 60), "hour"] : [minutes, "minute"];
  return `in ${n} ${unit}${n === 1 ? "" : "s"}`;
}

export function titleCase(s) {
  return s ? s.charAt(0).toUpperCase() + s.slice(1) : s;
}

/** The browser's IANA zone, so "today" means the user's today. */
export function browserZone() {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  } catch {
    return "UTC";
  }
}
