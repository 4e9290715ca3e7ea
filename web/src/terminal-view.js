// The terminal view (docs/WEB.md, "Terminal view"): an xterm.js terminal
// fed by a ViewerSocket through a bounded OutputQueue, the grid rules of
// the viewer protocol (who holds the PTY's size), `view` messages from the
// Page Visibility API, the phone's key row, and the read-only state the
// server announces first (`access`): then nothing is sent, and the page
// says so before anyone types.

import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import { WebLinksAddon } from "@xterm/addon-web-links";
import { WebglAddon } from "@xterm/addon-webgl";
import { ViewerSocket } from "./viewer-socket.js";
import { OutputQueue } from "./output-queue.js";
import { keyRow, Modifiers } from "./keys.js";
import { el } from "./dom.js";

const FONT_KEY = "tether.fontSize";
const RENDERER_KEY = "tether.renderer";
const FONT_MIN = 8;
const FONT_MAX = 32;
/** How often a `view` goes out with nothing else to say, so idleMs stays fresh. */
const VIEW_EVERY_MS = 15000;
/** How long a size that is not ours must last before the held bar shows. */
const HELD_BAR_DELAY_MS = 700;
const encoder = new TextEncoder();

export function defaultFontSize() {
  const stored = Number(localStorage.getItem(FONT_KEY));
  if (stored >= FONT_MIN && stored <= FONT_MAX) return stored;
  return matchMedia("(max-width: 600px)").matches ? 13 : 14;
}

export class TerminalView {
  constructor({ terminalId, token, title, onBack, phone }) {
    this.terminalId = terminalId;
    this.phone = phone;
    this.lastKeyAt = Date.now();
    this.holder = null; // true: ours, false: another viewer's, null: not told yet
    this.ptySize = null;
    this.exited = false;
    this.disposed = false;
    this.readOnly = false; // the server's `access` says so; nothing is sent then
    this.stateLog = []; // the last states shown, for debugState

    this.term = new Terminal({
      fontSize: defaultFontSize(),
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
      scrollback: 5000,
      cursorBlink: true,
      allowProposedApi: false,
      theme: { background: "#0f1115", foreground: "#e6e6e6", cursor: "#f0c674" },
    });
    this.fit = new FitAddon();
    this.term.loadAddon(this.fit);
    this.term.loadAddon(new WebLinksAddon());

    this.status = el("span", { className: "status", role: "status", "aria-live": "polite" }, "connecting");
    this.holderText = el("span", {});
    this.takeOver = el("button", { type: "button", className: "take-over" }, "take over");
    this.takeOver.addEventListener("click", () => this.claimGrid());
    this.heldBar = el("div", { className: "held-bar", hidden: true }, this.holderText, this.takeOver);
    this.notice = el("div", { className: "notice", hidden: true });
    this.readOnlyBadge = el("span", { className: "read-only-badge", hidden: true }, "read-only");
    this.readOnlyBar = el(
      "div",
      { className: "read-only-bar", role: "status", hidden: true },
      "Read-only: you can watch this terminal, but not type into it or resize it.",
    );
    this.screen = el("div", { className: "screen" });
    const back = el("button", { type: "button", className: "back", "aria-label": "Back to the list" }, "‹ Back");
    back.addEventListener("click", onBack);
    const smaller = el("button", { type: "button", "aria-label": "Smaller text", className: "font-down" }, "A−");
    const larger = el("button", { type: "button", "aria-label": "Larger text", className: "font-up" }, "A+");
    smaller.addEventListener("click", () => this.setFontSize(this.term.options.fontSize - 1));
    larger.addEventListener("click", () => this.setFontSize(this.term.options.fontSize + 1));
    const header = el(
      "header",
      { className: "term-header" },
      back,
      el("span", { className: "term-title" }, title),
      this.readOnlyBadge,
      this.status,
      el("span", { className: "font-size" }, smaller, larger),
    );
    this.modifiers = new Modifiers(() => this.keys.render());
    this.keys = keyRow(this.term, this.modifiers, (data) => this.sendInput(data));
    this.keys.element.hidden = !phone;
    this.element = el(
      "section",
      { className: "terminal-view" },
      header,
      this.readOnlyBar,
      this.heldBar,
      this.notice,
      this.screen,
      this.keys.element,
    );

    this.queue = new OutputQueue(this.term, {
      onOverflow: () => {
        this.showNotice("Output came faster than this screen could draw it: skipped ahead to the current screen.");
        this.socket.resync();
      },
    });
    this.socket = new ViewerSocket(terminalId, token, {
      control: (msg) => this.onControl(msg),
      bytes: (bytes) => this.queue.write(bytes),
      state: (name, detail) => this.onState(name, detail),
    });

    this.answerOnlyAsHolder();
    this.term.onData((data) => this.sendInput(this.modifiers.apply(data)));
    this.term.onBinary((data) => this.sendBytes(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
  }

  /**
   * Programs ask the terminal questions (device attributes, cursor
   * position, mode and colour reports) and read the answers as input.
   * Every viewer's xterm.js would answer, so with two viewers the program
   * reads two answers and the second shows up as garbage. Only the grid
   * holder (or a viewer not told otherwise) answers; the others swallow
   * the question. A handler that returns true stops xterm.js's own.
   */
  answerOnlyAsHolder() {
    const notMine = () => this.holder === false;
    const questions = [
      { final: "c" }, // DA1
      { prefix: ">", final: "c" }, // DA2
      { prefix: "=", final: "c" }, // DA3
      { final: "n" }, // DSR, cursor position
      { prefix: "?", final: "n" }, // DEC DSR
      { intermediates: "$", final: "p" }, // DECRQM
      { prefix: "?", intermediates: "$", final: "p" },
    ];
    for (const id of questions) this.term.parser.registerCsiHandler(id, notMine);
    for (const osc of [4, 10, 11, 12]) {
      this.term.parser.registerOscHandler(osc, (data) => notMine() && data.includes("?"));
    }
  }

  /** Puts the terminal on the page and attaches. */
  mount(parent) {
    parent.replaceChildren(this.element);
    this.term.open(this.screen);
    this.renderer = "dom";
    // WebGL on desktops; phones keep xterm.js's DOM renderer, which is fast
    // enough for a phone's grid and the only one whose output the browser
    // tests could see under touch emulation (docs/WEB.md, "Renderer").
    // `localStorage["tether.renderer"]` = "webgl" or "dom" overrides.
    const choice = localStorage.getItem(RENDERER_KEY) || (this.phone ? "dom" : "webgl");
    if (choice === "webgl") this.loadWebgl();
    this.screen.addEventListener("click", () => this.term.focus());
    this.fitNow();
    this.onResize = debounce(() => this.windowResized(), 80);
    this.resizeObserver = new ResizeObserver(this.onResize);
    this.resizeObserver.observe(this.screen);
    this.onVisibility = () => this.sendView();
    document.addEventListener("visibilitychange", this.onVisibility);
    this.onPageHide = () => this.sendView({ open: false });
    window.addEventListener("pagehide", this.onPageHide);
    this.viewTimer = setInterval(() => this.sendView(), VIEW_EVERY_MS);
    this.socket.connect();
    this.term.focus();
  }

  loadWebgl() {
    try {
      const webgl = new WebglAddon();
      webgl.onContextLoss(() => {
        webgl.dispose();
        this.renderer = "dom";
      });
      this.term.loadAddon(webgl);
      this.renderer = "webgl";
    } catch (_) {
      // No WebGL here: xterm.js keeps its DOM renderer.
    }
  }

  dispose() {
    this.disposed = true;
    this.sendView({ open: false });
    this.socket.close();
    clearInterval(this.viewTimer);
    clearTimeout(this.heldBarTimer);
    this.resizeObserver?.disconnect();
    document.removeEventListener("visibilitychange", this.onVisibility);
    window.removeEventListener("pagehide", this.onPageHide);
    this.term.dispose();
  }

  /** The grid this viewer's screen would show at its size. */
  naturalGrid() {
    const d = this.fit.proposeDimensions();
    if (!d || !Number.isFinite(d.cols) || !Number.isFinite(d.rows)) return { cols: this.term.cols, rows: this.term.rows };
    return { cols: clampGrid(d.cols), rows: clampGrid(d.rows) };
  }

  fitNow() {
    const { cols, rows } = this.naturalGrid();
    if (this.holder !== false && (cols !== this.term.cols || rows !== this.term.rows)) this.term.resize(cols, rows);
  }

  /**
   * The screen changed size (window, phone keyboard, font, a bar). The
   * holder claims the new grid with `resize`; anyone else only tells its
   * natural grid in a `view` ("take over" is the explicit claim).
   */
  windowResized() {
    if (this.disposed || this.readOnly) return;
    if (this.holder === true) {
      this.fitNow();
      const { cols, rows } = this.naturalGrid();
      this.socket.send({ type: "resize", cols, rows });
      return;
    }
    if (this.holder === null) this.fitNow();
    this.sendView();
  }

  claimGrid() {
    if (this.readOnly) return;
    const { cols, rows } = this.naturalGrid();
    this.socket.send({ type: "resize", cols, rows });
    this.term.focus();
  }

  sendView(extra = {}) {
    if (this.readOnly) return;
    const { cols, rows } = this.naturalGrid();
    this.socket.send({
      type: "view",
      cols,
      rows,
      visible: document.visibilityState === "visible",
      idleMs: Date.now() - this.lastKeyAt,
      open: true,
      ...extra,
    });
  }

  sendInput(data) {
    if (this.exited || data.length === 0) return;
    this.sendBytes(encoder.encode(data));
  }

  sendBytes(bytes) {
    if (this.exited || this.readOnly) return;
    this.lastKeyAt = Date.now();
    this.socket.send(bytes);
  }

  setFontSize(size) {
    const fontSize = Math.max(FONT_MIN, Math.min(FONT_MAX, size));
    localStorage.setItem(FONT_KEY, String(fontSize));
    this.term.options.fontSize = fontSize;
    this.windowResized();
  }

  onControl(msg) {
    switch (msg.type) {
      case "access":
        this.setReadOnly(msg.readOnly === true);
        break;
      case "status":
        this.hostState = msg.host;
        if (msg.host === "offline") this.showNotice("The host is offline; the terminal comes back when it reconnects.");
        break;
      case "replay":
        // A repaint: forget what is on screen, take the snapshot's grid.
        this.queue.clear();
        this.queue.then(() => {
          this.term.reset();
          this.term.resize(clampGrid(msg.cols), clampGrid(msg.rows));
        });
        break;
      case "live":
      case "resume":
        this.sendView();
        break;
      case "size":
        this.ptySize = { cols: msg.cols, rows: msg.rows };
        this.holder = msg.yours;
        this.queue.then(() => {
          if (!msg.yours) this.term.resize(clampGrid(msg.cols), clampGrid(msg.rows));
          else this.fitNow();
        });
        this.renderHolder();
        break;
      case "exit":
        this.exited = true;
        this.exitCode = msg.exitCode;
        this.queue.then(() => this.onState("exited", { exitCode: msg.exitCode }));
        break;
      case "error":
        // The bar already says what a read-only refusal would.
        if (!(this.readOnly && msg.message.startsWith("read-only:"))) this.showNotice(msg.message);
        break;
    }
  }

  /** Read-only: the badge and bar show, the keyboard and grid claims go quiet. */
  setReadOnly(readOnly) {
    this.readOnly = readOnly;
    this.readOnlyBadge.hidden = !readOnly;
    this.readOnlyBar.hidden = !readOnly;
    this.term.options.disableStdin = readOnly;
    this.keys.element.hidden = readOnly || !this.phone;
    this.renderHolder();
  }

  /**
   * The "held by another viewer" bar. Every attach starts with a size that
   * is not ours (the server has not seen our first view yet), so the bar
   * shows only when that lasts past HELD_BAR_DELAY_MS.
   */
  renderHolder() {
    clearTimeout(this.heldBarTimer);
    const held = this.holder === false && !this.exited && !this.readOnly;
    if (!held) {
      this.heldBar.hidden = true;
      return;
    }
    this.holderText.textContent = `viewing at ${this.ptySize.cols}×${this.ptySize.rows}, held by another viewer`;
    if (!this.heldBar.hidden) return;
    this.heldBarTimer = setTimeout(() => {
      if (this.holder === false && !this.exited) this.heldBar.hidden = false;
    }, HELD_BAR_DELAY_MS);
  }

  onState(name, detail) {
    this.state = name;
    if (this.stateLog.at(-1) !== name) this.stateLog.push(name);
    if (this.stateLog.length > 50) this.stateLog.shift();
    this.status.dataset.state = name;
    switch (name) {
      case "connecting":
        this.status.textContent = "connecting";
        break;
      case "live":
        this.status.textContent = "live";
        if (this.notice.dataset.kind === "connection") this.hideNotice();
        break;
      case "reconnecting":
        this.status.textContent = detail.attempt ? `reconnecting (try ${detail.attempt})` : "reconnecting";
        this.showNotice("Connection lost; reconnecting…", "connection");
        break;
      case "ended":
        this.status.textContent = "disconnected";
        this.showNotice(detail.message, "final");
        break;
      case "exited":
        this.status.textContent = detail.exitCode === null || detail.exitCode === undefined ? "exited" : `exited with code ${detail.exitCode}`;
        this.renderHolder();
        this.term.options.cursorBlink = false;
        break;
    }
  }

  showNotice(text, kind = "info") {
    this.notice.textContent = text;
    this.notice.dataset.kind = kind;
    this.notice.hidden = false;
  }

  hideNotice() {
    this.notice.hidden = true;
    this.notice.dataset.kind = "";
  }

  /** What tests and a curious person can read: the buffer as text lines. */
  debugState() {
    return {
      lines: bufferLines(this.term),
      viewportY: this.term.buffer.active.viewportY,
      cols: this.term.cols,
      rows: this.term.rows,
      state: this.state,
      states: this.stateLog,
      holder: this.holder,
      readOnly: this.readOnly,
      readOnlyShown: !this.readOnlyBar.hidden && !this.readOnlyBadge.hidden,
      pty: this.ptySize,
      offset: this.socket.offset,
      socket: this.socket.stats,
      renderer: this.renderer,
      heldBytes: this.queue.heldBytes,
      peakHeldBytes: this.queue.peakBytes,
      overflows: this.queue.overflows,
    };
  }
}

/** The active buffer of `term` (scrollback and screen) as text lines. */
export function bufferLines(term) {
  const buffer = term.buffer.active;
  const lines = [];
  for (let i = 0; i < buffer.length; i++) lines.push(buffer.getLine(i)?.translateToString(true) ?? "");
  return lines;
}

function clampGrid(n) {
  return Math.max(1, Math.min(1000, Math.floor(n)));
}

function debounce(fn, ms) {
  let timer = null;
  return () => {
    clearTimeout(timer);
    timer = setTimeout(fn, ms);
  };
}
