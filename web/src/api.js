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
  if (method === "HEAD") return null;
  const type = res.headers.get("content-type") || "";
  return type.includes("json") ? res.json() : new Uint8Array(await res.arrayBuffer());
}

/**
 * A list the page refreshes (docs/REST.md, "Conventions": oldest first, in
 * pages; a page with more behind it carries `nextCursor`). The first
 * refresh reads every page; the next ones read again only from the last
 * page on, where new items arrive, and every `fullEvery`-th reads them all
 * again (for changes and deletions further back). With one page, the
 * common case, every refresh is one request.
 */
export class PagedList {
  constructor(token, path, key, fullEvery = 10) {
    Object.assign(this, { token, path, key, fullEvery });
    this.refreshes = 0;
    this.items = [];
    this.lastPageAfter = null; // the cursor the last page was read after
    this.beforeLastPage = 0; // how many items come before it
  }

  async refresh() {
    const full = this.refreshes++ % this.fullEvery === 0;
    let after = full ? null : this.lastPageAfter;
    const items = full ? [] : this.items.slice(0, this.beforeLastPage);
    let lastPageAfter = after;
    let beforeLastPage = items.length;
    for (;;) {
      const query = after === null ? "" : `?after=${encodeURIComponent(after)}`;
      const page = await request(this.token, "GET", this.path + query);
      lastPageAfter = after;
      beforeLastPage = items.length;
      items.push(...page[this.key]);
      if (!page.nextCursor || page.nextCursor === after) break;
      after = page.nextCursor;
    }
    Object.assign(this, { items, lastPageAfter, beforeLastPage });
    return items;
  }
}

export const api = (token) => ({
  hosts: () => new PagedList(token, "/hosts", "hosts"),
  terminals: () => new PagedList(token, "/terminals", "terminals"),
  terminal: (id) => request(token, "GET", `/terminals/${id}`).then((b) => b.terminal),
  createTerminal: (body) => request(token, "POST", "/terminals", body).then((b) => b.terminal),
  /** Signals the terminal's processes: `signal` a name or number, or none for the server's default, HUP (docs/REST.md). */
  killTerminal: (id, signal) =>
    request(token, "POST", `/terminals/${id}/kill`, signal === undefined ? undefined : { signal }).then((b) => b.terminal),
  /** Removes an ended terminal (409 terminal_live while it may still run); 204, so nothing comes back. */
  deleteTerminal: (id) => request(token, "DELETE", `/terminals/${id}`).then(() => null),
  runs: () => new PagedList(token, "/runs", "runs"),
  /** Whether the token may start terminals: only a `full` one reaches the tokens route (docs/REST.md, "Scopes"). */
  mayControl: () =>
    request(token, "HEAD", "/tokens").then(
      () => true,
      (err) => {
        if (err.status === 403) return false;
        throw err;
      },
    ),
  run: (id) => request(token, "GET", `/runs/${id}`).then((b) => b.run),
  runLog: (id) => request(token, "GET", `/runs/${id}/log`),
});
