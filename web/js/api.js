// The farm's REST API as the console uses it: every call sends the session's bearer token,
// and every failure becomes an ApiError carrying the server's `{"error": "..."}` message.

const TOKEN_KEY = 'ferry.token';
const BASE = '/api/v1';

/** An answer that was not 2xx, or a request that did not reach the server. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(t) {
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** Calls `method path` (relative to /api/v1) with an optional JSON body; returns the JSON. */
export async function call(method, path, body) {
  const headers = { Accept: 'application/json' };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const init = { method, headers, cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(BASE + path, init);
  } catch (e) {
    throw new ApiError(0, `cannot reach the server: ${e.message}`);
  }
  if (r.status === 204) return null;
  const text = await r.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    // Not JSON: keep the text for the message below.
  }
  if (!r.ok) {
    const msg = json && typeof json.error === 'string' ? json.error : text || r.statusText;
    throw new ApiError(r.status, msg);
  }
  return json;
}

/** Every item of a paged list (pages of 1000; stops at `max` items). */
export async function all(path, max = 10000) {
  const items = [];
  const sep = path.includes('?') ? '&' : '?';
  for (let offset = 0; offset < max; offset += 1000) {
    const page = await call('GET', `${path}${sep}limit=1000&offset=${offset}`);
    items.push(...page.items);
    if (items.length >= page.total || page.items.length === 0) break;
  }
  return items;
}
