// tether's page (docs/WEB.md): sign in with a token, the hosts and their
// terminals, a form to start one, the terminal view, and runs with their
// logs. Routes live in the URL's fragment: `#/t/<id>` a terminal,
// `#/r/<id>` a run, nothing the lists. The token stays in localStorage and
// never enters a URL.

import "@xterm/xterm/css/xterm.css";
import "./style.css";
import { api, ApiError, forgetToken, storedToken, storeToken } from "./api.js";
import { ago, el, reconcile, splitArgv } from "./dom.js";
import { shortExit } from "./exit.js";
import { TerminalActions } from "./terminal-actions.js";
import { bufferLines, defaultFontSize, TerminalView } from "./terminal-view.js";
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";

const app = document.getElementById("app");
const LIST_REFRESH_MS = 3000;
const isPhone = () => matchMedia("(pointer: coarse)").matches || matchMedia("(max-width: 600px)").matches;

let current = null; // the view on screen: {dispose()}
let lastTerminalId = null; // the terminal this page showed last, for a share token's way back

// The page's height follows the visual viewport, so the terminal's grid
// shrinks when a phone's keyboard opens instead of hiding behind it.
function followVisualViewport() {
  const vv = window.visualViewport;
  const apply = () => document.documentElement.style.setProperty("--app-height", `${Math.round(vv ? vv.height : innerHeight)}px`);
  apply();
  (vv || window).addEventListener("resize", apply);
}

function show(view) {
  current?.dispose();
  current = view;
}

function route() {
  const token = storedToken();
  if (!token) return show(signIn());
  const [, kind, id] = location.hash.match(/^#\/([tr])\/([0-9a-fA-F-]{36})$/) || [];
  if (kind === "t") return show(terminalPage(token, id));
  if (kind === "r") return show(runPage(token, id));
  show(home(token));
}

function signIn(message) {
  const input = el("input", {
    type: "password",
    id: "token",
    name: "token",
    autocomplete: "current-password",
    placeholder: "tth_…",
    spellcheck: "false",
    required: true,
  });
  const note = el("p", { className: "signin-message", role: "alert" }, message || "");
  const button = el("button", { type: "submit" }, "Sign in");
  const form = el(
    "form",
    { className: "signin" },
    el("h1", {}, "tether"),
    el("label", { for: "token" }, "API token"),
    input,
    button,
    note,
    el(
      "p",
      { className: "hint" },
      "Create one with ",
      el("code", {}, "tether token create --user NAME"),
      ", or use the token that ",
      el("code", {}, "tether serve --demo"),
      " printed. It is kept in this browser only.",
    ),
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = input.value.trim();
    button.disabled = true;
    note.textContent = "Checking…";
    // On a terminal's address the token is checked against that terminal:
    // a share token (`tether share`) reaches it and nothing else.
    const [, terminalId] = location.hash.match(/^#\/t\/([0-9a-fA-F-]{36})$/) || [];
    try {
      await (terminalId ? api(token).terminal(terminalId) : api(token).hosts().refresh());
      storeToken(token);
      route();
    } catch (err) {
      note.textContent =
        err instanceof ApiError && err.status === 401
          ? "That token was not accepted. Check that you pasted all of it (it starts with tth_) and that it was not revoked."
          : `Could not sign in: ${err.message}`;
      button.disabled = false;
    }
  });
  app.replaceChildren(form);
  input.focus();
  return { dispose() {} };
}

function signOut() {
  forgetToken();
  location.hash = "";
  route();
}

function topBar() {
  const out = el("button", { type: "button", className: "sign-out" }, "Sign out");
  out.addEventListener("click", signOut);
  return el("header", { className: "top" }, el("h1", {}, "tether"), out);
}

/**
 * The lists: hosts, terminals, the start form and runs, refreshed while
 * shown. A refresh changes only the rows that changed, so a selection or
 * the focus in the lists survives it. The form, and the terminals' Kill
 * and Delete, show only for a token that may control terminals; a share
 * token, which reaches only its terminal, gets a word on that instead of
 * lists.
 */
function home(token) {
  const client = api(token);
  const lists = { hosts: client.hosts(), terminals: client.terminals(), runs: client.runs() };
  const hostsBox = el("ul", { className: "hosts" });
  const termsBox = el("div", { className: "terminals" });
  const runsBox = el("div", { className: "runs" });
  const problem = el("p", { className: "problem", role: "alert", hidden: true });
  const form = startForm(client);
  const startSection = el("section", { className: "start-section", hidden: true }, el("h2", {}, "Start a terminal"), form.element);
  const readOnlyNote = el(
    "p",
    { className: "read-only-note", hidden: true },
    "This token is read-only: it can watch terminals but not start them or type into them.",
  );
  const main = el(
    "main",
    { className: "home" },
    topBar(),
    problem,
    readOnlyNote,
    el("section", {}, el("h2", {}, "Hosts"), hostsBox),
    startSection,
    el("section", {}, el("h2", {}, "Terminals"), termsBox),
    el("section", {}, el("h2", {}, "Runs"), runsBox),
  );
  app.replaceChildren(main);
  let mayControl = false; // until the server says; Kill and Delete show once it does
  let shown = null; // the terminals last read and the host names, to draw the list again between refreshes
  const drawTerminals = () => {
    if (shown) terminalTable(termsBox, actions.visible(shown.terminals), shown.names, mayControl ? actions : null);
  };
  const actions = new TerminalActions(client, { changed: drawTerminals, refresh: () => refresh() });
  termsBox.addEventListener("click", (e) => actions.onClick(e));
  termsBox.addEventListener("keydown", (e) => actions.onKey(e));
  client.mayControl().then(
    (may) => {
      startSection.hidden = !may;
      readOnlyNote.hidden = may;
      mayControl = may;
      drawTerminals();
    },
    () => {
      // Unknown: offer them; the server has the last word.
      startSection.hidden = false;
      mayControl = true;
      drawTerminals();
    },
  );
  let timer = null;
  let stopped = false;
  let reading = false; // a refresh is under way
  let again = false; // and another was asked for meanwhile
  const refresh = async () => {
    clearTimeout(timer);
    if (reading) {
      again = true;
      return;
    }
    reading = true;
    try {
      const [hosts, terminals, runs] = await Promise.all([lists.hosts.refresh(), lists.terminals.refresh(), lists.runs.refresh()]);
      if (stopped) return;
      problem.hidden = true;
      const names = new Map(hosts.map((h) => [h.id, h.name]));
      reconcile(hostsBox, hosts.length ? hosts.map(hostItem) : [el("li", { className: "empty" }, "No hosts yet: run `tether daemon` on a machine.")]);
      form.setHosts(hosts);
      shown = { terminals, names };
      actions.forgetEnded(terminals);
      drawTerminals();
      runTable(runsBox, runs, names);
    } catch (err) {
      if (stopped) return;
      if (err instanceof ApiError && err.status === 401) {
        stopped = true;
        forgetToken();
        show(signIn("The token is no longer accepted: sign in again."));
        return;
      }
      if (err instanceof ApiError && err.code === "insufficient_scope") {
        stopped = true;
        main.replaceChildren(topBar(), shareTokenNote(err.message));
        return;
      }
      problem.textContent = `Could not refresh: ${err.message}`;
      problem.hidden = false;
    } finally {
      reading = false;
    }
    if (stopped) return;
    if (again) {
      again = false;
      refresh();
    } else timer = setTimeout(refresh, LIST_REFRESH_MS);
  };
  refresh();
  return {
    dispose() {
      stopped = true;
      clearTimeout(timer);
    },
  };
}

/** What a token that reaches no list (a share token) sees instead of the lists. */
function shareTokenNote(reason) {
  return el(
    "section",
    { className: "share-note" },
    el("p", {}, `This token cannot list hosts or terminals (${reason}). Open the terminal's own link to watch it, or sign out and sign in with another token.`),
    lastTerminalId ? el("p", {}, el("a", { href: `#/t/${lastTerminalId}` }, "Back to the terminal")) : null,
  );
}

function hostItem(h) {
  return el(
    "li",
    { className: `host ${h.state}`, "data-host": h.id },
    el("span", { className: "dot", "aria-hidden": "true" }),
    el("strong", { title: h.name }, h.name),
    el("span", { className: "muted", title: `${h.hostname} · ${h.platform}/${h.arch}` }, ` ${h.hostname} · ${h.platform}/${h.arch}`),
    el("span", { className: "state" }, h.state),
  );
}

/**
 * Fills `box` with a table of resources, newest first (or `empty` when
 * there are none); `cells(item)` gives a row's cells, `rowsAfter(item)`
 * rows to put under it. The table stays (until its headers change) and
 * only rows that changed are replaced.
 */
function fillNewestFirst(box, items, { empty, headers, rowProps, cells, rowsAfter = () => [], className }) {
  if (!items.length) {
    reconcile(box, [el("p", { className: "empty" }, empty)]);
    return;
  }
  let table = box.querySelector(":scope > table");
  const heads = headers.join("|");
  if (!table || table.dataset.headers !== heads) {
    table = el("table", { className, "data-headers": heads }, el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))), el("tbody", {}));
    box.replaceChildren(table);
  }
  const rows = items
    .slice()
    .sort((a, b) => Date.parse(b.createdAt) - Date.parse(a.createdAt))
    .flatMap((item) => [
      el("tr", rowProps(item), ...cells(item).map((cell) => (cell instanceof Node && cell.tagName === "TD" ? cell : el("td", {}, cell)))),
      ...rowsAfter(item),
    ]);
  reconcile(table.tBodies[0], rows);
}

/** The terminals; with `actions` (a TerminalActions), each row's Kill or Delete. */
function terminalTable(box, terminals, names, actions) {
  const headers = ["Terminal", "Host", "State", "Size", "Last typed"];
  if (actions) headers.push("Actions");
  fillNewestFirst(box, terminals, {
    empty: "No terminals yet.",
    headers,
    className: actions ? "with-actions" : undefined,
    rowProps: (t) => ({ className: `terminal ${t.state}`, "data-terminal": t.id }),
    cells: (t) => [
      el("a", { href: `#/t/${t.id}` }, t.title || (t.argv.length ? t.argv.join(" ") : "login shell")),
      names.get(t.hostId) || "?",
      el("td", { className: "state" }, terminalState(t)),
      `${t.cols}×${t.rows}`,
      ago(t.lastInteractedAt),
      ...(actions ? [actions.cell(t)] : []),
    ],
    rowsAfter: (t) => (actions ? actions.rowsAfter(t, headers.length) : []),
  });
}

/** A terminal's state for the list: with its exit code or signal once exited. */
function terminalState(t) {
  return t.state === "exited" ? shortExit(t) : t.state;
}

function runTable(box, runs, names) {
  fillNewestFirst(box, runs, {
    empty: "No runs yet (POST /api/v1/runs, or tether run).",
    headers: ["Command", "Host", "State", "Exit", "Queued"],
    rowProps: (r) => ({ className: `run ${r.state}`, "data-run": r.id }),
    cells: (r) => [
      el("a", { href: `#/r/${r.id}` }, r.argv.join(" ")),
      names.get(r.hostId) || "?",
      el("td", { className: "state" }, r.state),
      r.exitCode ?? "",
      ago(r.createdAt),
    ],
  });
}

/**
 * Host, command (blank = login shell), dir from the host's allowed dirs;
 * size from the window. The server's refusal stays under the form until
 * the user changes something or presses Start again.
 */
function startForm(client) {
  const host = el("select", { name: "host", id: "start-host" });
  const dir = el("select", { name: "dir", id: "start-dir" });
  const command = el("input", { name: "command", id: "start-command", placeholder: "blank = login shell", autocomplete: "off", spellcheck: "false" });
  const button = el("button", { type: "submit" }, "Start");
  const problem = el("p", { className: "start-problem", role: "alert", hidden: true });
  const form = el(
    "form",
    { className: "start" },
    el("label", { for: "start-host" }, "Host"),
    host,
    el("label", { for: "start-command" }, "Command"),
    command,
    el("label", { for: "start-dir" }, "Directory"),
    dir,
    button,
    problem,
  );
  let hosts = [];
  let shownHosts = null; // what the host list was built from, to rebuild it only on change
  const fillDirs = () => {
    const h = hosts.find((x) => x.id === host.value);
    const dirs = h ? h.dirs : [];
    const keep = dir.value;
    reconcile(dir, dirs.map((d) => el("option", { value: d }, d)));
    if (dirs.includes(keep)) dir.value = keep;
  };
  host.addEventListener("change", fillDirs);
  form.addEventListener("input", () => (problem.hidden = true));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    button.disabled = true;
    problem.hidden = true;
    try {
      const { cols, rows } = estimateGrid();
      const terminal = await client.createTerminal({
        hostId: host.value,
        argv: splitArgv(command.value),
        dir: dir.value || undefined,
        cols,
        rows,
      });
      location.hash = `#/t/${terminal.id}`;
    } catch (err) {
      problem.textContent = `Could not start the terminal: ${err.message}`;
      problem.hidden = false;
    } finally {
      button.disabled = hosts.length === 0;
    }
  });
  return {
    element: form,
    setHosts(list) {
      hosts = list;
      const summary = JSON.stringify(list.map((h) => [h.id, h.name, h.state, h.dirs]));
      if (summary === shownHosts) return;
      shownHosts = summary;
      const keep = host.value;
      reconcile(host, list.map((h) => el("option", { value: h.id }, `${h.name} (${h.state})`)));
      if (list.some((h) => h.id === keep)) host.value = keep;
      else {
        const online = list.find((h) => h.state === "online");
        if (online) host.value = online.id;
      }
      button.disabled = list.length === 0;
      fillDirs();
    },
  };
}

/** The grid the terminal view will have, before it exists: close enough for the spawn. */
function estimateGrid() {
  const size = defaultFontSize();
  const cols = Math.floor((innerWidth - 16) / (size * 0.6));
  const rows = Math.floor((innerHeight - (isPhone() ? 110 : 60)) / (size * 1.2));
  return { cols: Math.max(20, Math.min(500, cols)), rows: Math.max(5, Math.min(200, rows)) };
}

function terminalPage(token, id) {
  const view = new TerminalView({
    terminalId: id,
    token,
    title: id.slice(0, 8),
    phone: isPhone(),
    onBack: () => (location.hash = ""),
    fetchTerminal: () => api(token).terminal(id),
  });
  view.mount(app);
  api(token)
    .terminal(id)
    .then((t) => {
      view.element.querySelector(".term-title").textContent = t.title || (t.argv.length ? t.argv.join(" ") : "login shell");
    })
    .catch(() => {});
  window.tether.view = view;
  lastTerminalId = id;
  return {
    dispose() {
      // The next view may have registered already (show() disposes after).
      if (window.tether.view === view) window.tether.view = null;
      view.dispose();
    },
  };
}

/** A run: state, exit code, usage and its log in a read-only terminal. */
function runPage(token, id) {
  const client = api(token);
  const back = el("button", { type: "button", className: "back" }, "‹ Back");
  back.addEventListener("click", () => (location.hash = ""));
  const summary = el("p", { className: "run-summary" }, "loading…");
  const screen = el("div", { className: "screen log" });
  app.replaceChildren(el("section", { className: "run-view" }, el("header", { className: "term-header" }, back, el("span", { className: "term-title" }, "run")), summary, screen));
  const term = new Terminal({ fontSize: defaultFontSize(), disableStdin: true, scrollback: 20000, convertEol: true, theme: { background: "#0f1115" } });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  fit.fit();
  let timer = null;
  let shown = 0;
  let stopped = false;
  const load = async () => {
    try {
      const run = await client.run(id);
      const log = await client.runLog(id);
      if (stopped) return;
      const usage = run.usage ? ` · ${run.usage.wallMs} ms wall, ${run.usage.cpuMs} ms CPU, ${run.usage.outputBytes} bytes` : "";
      summary.textContent = `${run.argv.join(" ")} — ${run.state}${run.exitCode === null ? "" : `, exit code ${run.exitCode}`}${usage}`;
      summary.dataset.state = run.state;
      if (log.byteLength > shown) {
        term.write(log.subarray(shown));
        shown = log.byteLength;
      }
      if (!["succeeded", "failed", "lost"].includes(run.state)) timer = setTimeout(load, 1000);
    } catch (err) {
      summary.textContent = `Could not load the run: ${err.message}`;
    }
  };
  load();
  const hook = { debugState: () => ({ lines: bufferLines(term), state: summary.dataset.state }) };
  window.tether.view = hook;
  const onResize = () => fit.fit();
  window.addEventListener("resize", onResize);
  return {
    dispose() {
      stopped = true;
      clearTimeout(timer);
      if (window.tether.view === hook) window.tether.view = null;
      window.removeEventListener("resize", onResize);
      term.dispose();
    },
  };
}

// Read-only hooks for tests and for a person debugging in the console.
window.tether = {
  view: null,
  screen: () => window.tether.view?.debugState() ?? null,
};

followVisualViewport();
window.addEventListener("hashchange", route);
route();
