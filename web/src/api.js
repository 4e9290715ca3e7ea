// The REST API under /api/v1, seen from the page: every call carries the
// token as `Authorization: Bearer`, errors become ApiError with the
// server's code and message.

const TOKEN_KEY = "tether.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function storedToken() {
  return localStorage.getItem(TOKEN_KEY);
}

export function storeToken(token) {
  localStorage.setItem(TOKEN_KEY, token);
}

export function forgetToken() {
  localStorage.removeItem(TOKEN_KEY);
}

export async function request(token, method, path, body) {
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(`/api/v1${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch (e) {
    throw new ApiError(0, "network", "the server cannot be reached");
  }
  if (!res.ok) {
    let code = "http_" + res.status;
    let message = res.statusText || "request failed";
    try {
      const err = (await res.json()).error;
      if (err) ({ code, message } = err);
    } catch (_) {
      // not a JSON error body
    }
    throw new ApiError(res.status, code, message);
  }
  const type = res.headers.get("content-type") || "";
  return type.includes("json") ? res.json() : new Uint8Array(await res.arrayBuffer());
}

// Every item of a list, page after page: a page with more behind it
// carries `nextCursor` (docs/REST.md, "Conventions").
export async function list(token, path, key) {
  const items = [];
  let after = null;
  for (;;) {
    const query = after === null ? "" : `?after=${encodeURIComponent(after)}`;
    const page = await request(token, "GET", path + query);
    items.push(...page[key]);
    if (!page.nextCursor || page.nextCursor === after) return items;
    after = page.nextCursor;
  }
}

export const api = (token) => ({
  hosts: () => list(token, "/hosts", "hosts"),
  terminals: () => list(token, "/terminals", "terminals"),
  terminal: (id) => request(token, "GET", `/terminals/${id}`).then((b) => b.terminal),
  createTerminal: (body) => request(token, "POST", "/terminals", body).then((b) => b.terminal),
  killTerminal: (id) => request(token, "POST", `/terminals/${id}/kill`, {}),
  deleteTerminal: (id) => request(token, "DELETE", `/terminals/${id}`),
  runs: () => list(token, "/runs", "runs"),
  run: (id) => request(token, "GET", `/runs/${id}`).then((b) => b.run),
  runLog: (id) => request(token, "GET", `/runs/${id}/log`),
});
