// tether's page (docs/WEB.md): sign in with a token, the hosts and their
// terminals, a form to start one, the terminal view, and runs with their
// logs. Routes live in the URL's fragment: `#/t/<id>` a terminal,
// `#/r/<id>` a run, nothing the lists. The token stays in localStorage and
// never enters a URL.

import "@xterm/xterm/css/xterm.css";
import "./style.css";
import { api, ApiError, forgetToken, storedToken, storeToken } from "./api.js";
import { ago, el, splitArgv } from "./dom.js";
import { bufferLines, defaultFontSize, TerminalView } from "./terminal-view.js";
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";

const app = document.getElementById("app");
const LIST_REFRESH_MS = 3000;
const isPhone = () => matchMedia("(pointer: coarse)").matches || matchMedia("(max-width: 600px)").matches;

let current = null; // the view on screen: {dispose()}

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
      await (terminalId ? api(token).terminal(terminalId) : api(token).hosts());
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

/** The lists: hosts, terminals, the start form and runs, refreshed while shown. */
function home(token) {
  const client = api(token);
  const hostsBox = el("ul", { className: "hosts" });
  const termsBox = el("div", { className: "terminals" });
  const runsBox = el("div", { className: "runs" });
  const problem = el("p", { className: "problem", role: "alert", hidden: true });
  const form = startForm(client, problem);
  app.replaceChildren(
    el(
      "main",
      { className: "home" },
      topBar(),
      problem,
      el("section", {}, el("h2", {}, "Hosts"), hostsBox),
      el("section", {}, el("h2", {}, "Start a terminal"), form.element),
      el("section", {}, el("h2", {}, "Terminals"), termsBox),
      el("section", {}, el("h2", {}, "Runs"), runsBox),
    ),
  );
  let timer = null;
  let stopped = false;
  const refresh = async () => {
    try {
      const [hosts, terminals, runs] = await Promise.all([client.hosts(), client.terminals(), client.runs()]);
      if (stopped) return;
      problem.hidden = true;
      const names = new Map(hosts.map((h) => [h.id, h.name]));
      hostsBox.replaceChildren(...(hosts.length ? hosts.map(hostItem) : [el("li", { className: "empty" }, "No hosts yet: run `tether daemon` on a machine.")]));
      form.setHosts(hosts);
      termsBox.replaceChildren(terminalTable(terminals, names));
      runsBox.replaceChildren(runTable(runs, names));
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) {
        forgetToken();
        show(signIn("The token is no longer accepted: sign in again."));
        return;
      }
      problem.textContent = `Could not refresh: ${err.message}`;
      problem.hidden = false;
    }
    if (!stopped) timer = setTimeout(refresh, LIST_REFRESH_MS);
  };
  refresh();
  return {
    dispose() {
      stopped = true;
      clearTimeout(timer);
    },
  };
}

function hostItem(h) {
  return el(
    "li",
    { className: `host ${h.state}`, "data-host": h.id },
    el("span", { className: "dot", "aria-hidden": "true" }),
    el("strong", {}, h.name),
    el("span", { className: "muted" }, ` ${h.hostname} · ${h.platform}/${h.arch}`),
    el("span", { className: "state" }, h.state),
  );
}

/** A table of resources, newest first; `cells(item)` gives a row's cells. */
function newestFirstTable(items, empty, headers, rowProps, cells) {
  if (!items.length) return el("p", { className: "empty" }, empty);
  const rows = items
    .slice()
    .sort((a, b) => Date.parse(b.createdAt) - Date.parse(a.createdAt))
    .map((item) => el("tr", rowProps(item), ...cells(item).map((cell) => (cell instanceof Node && cell.tagName === "TD" ? cell : el("td", {}, cell)))));
  return el("table", {}, el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))), el("tbody", {}, rows));
}

function terminalTable(terminals, names) {
  return newestFirstTable(
    terminals,
    "No terminals yet.",
    ["Terminal", "Host", "State", "Size", "Last typed"],
    (t) => ({ className: `terminal ${t.state}`, "data-terminal": t.id }),
    (t) => [
      el("a", { href: `#/t/${t.id}` }, t.title || (t.argv.length ? t.argv.join(" ") : "login shell")),
      names.get(t.hostId) || "?",
      el("td", { className: "state" }, t.state === "exited" && t.exitCode !== null ? `exited (${t.exitCode})` : t.state),
      `${t.cols}×${t.rows}`,
      ago(t.lastInteractedAt),
    ],
  );
}

function runTable(runs, names) {
  return newestFirstTable(
    runs,
    "No runs yet (POST /api/v1/runs, or tether run).",
    ["Command", "Host", "State", "Exit", "Queued"],
    (r) => ({ className: `run ${r.state}`, "data-run": r.id }),
    (r) => [
      el("a", { href: `#/r/${r.id}` }, r.argv.join(" ")),
      names.get(r.hostId) || "?",
      el("td", { className: "state" }, r.state),
      r.exitCode ?? "",
      ago(r.createdAt),
    ],
  );
}

/** Host, command (blank = login shell), dir from the host's allowed dirs; size from the window. */
function startForm(client, problem) {
  const host = el("select", { name: "host", id: "start-host" });
  const dir = el("select", { name: "dir", id: "start-dir" });
  const command = el("input", { name: "command", id: "start-command", placeholder: "blank = login shell", autocomplete: "off", spellcheck: "false" });
  const button = el("button", { type: "submit" }, "Start");
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
  );
  let hosts = [];
  const fillDirs = () => {
    const h = hosts.find((x) => x.id === host.value);
    const dirs = h ? h.dirs : [];
    const keep = dir.value;
    dir.replaceChildren(...dirs.map((d) => el("option", { value: d, selected: d === keep }, d)));
  };
  host.addEventListener("change", fillDirs);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    button.disabled = true;
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
      button.disabled = false;
    }
  });
  return {
    element: form,
    setHosts(list) {
      hosts = list;
      const keep = host.value;
      host.replaceChildren(
        ...list.map((h) => el("option", { value: h.id, selected: h.id === keep }, `${h.name} (${h.state})`)),
      );
      if (!keep) {
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
  });
  view.mount(app);
  api(token)
    .terminal(id)
    .then((t) => {
      view.element.querySelector(".term-title").textContent = t.title || (t.argv.length ? t.argv.join(" ") : "login shell");
    })
    .catch(() => {});
  window.tether.view = view;
  return {
    dispose() {
      window.tether.view = null;
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
  window.tether.view = { debugState: () => ({ lines: bufferLines(term), state: summary.dataset.state }) };
  const onResize = () => fit.fit();
  window.addEventListener("resize", onResize);
  return {
    dispose() {
      stopped = true;
      clearTimeout(timer);
      window.tether.view = null;
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
