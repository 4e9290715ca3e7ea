// The terminal view (docs/WEB.md, "Terminal view"): an xterm.js terminal
// fed by a ViewerSocket through a bounded OutputQueue, the grid rules of
// the viewer protocol (who holds the PTY's size), `view` messages from the
// Page Visibility API, the phone's key row, and the read-only state the
// server announces first (`access`): then nothing is sent, and the page
// says so before anyone types. The header's status and the notice say what
// the view waits for (the connection, the host, the terminal's start); the
// held bar and the notice float over the screen, so showing them never
// changes the grid. When the terminal ends by a signal, the socket's `exit`
// has no code and says no more, so the view reads the signal from the
// terminal's REST resource (`fetchTerminal`).

import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import { WebLinksAddon } from "@xterm/addon-web-links";
import { WebglAddon } from "@xterm/addon-webgl";
import { HELD_INPUT_LIMIT, ViewerSocket } from "./viewer-socket.js";
import { describeStatus } from "./status.js";
import { exitFromResource, exitIsComplete } from "./exit.js";
import { OutputQueue } from "./output-queue.js";
import { keyRow, Modifiers } from "./keys.js";
import { touchScroll } from "./touch-scroll.js";
import { el } from "./dom.js";

const FONT_KEY = "tether.fontSize";
const RENDERER_KEY = "tether.renderer";
const FONT_MIN = 8;
const FONT_MAX = 32;
/** How often a `view` goes out with nothing else to say, so idleMs stays fresh. */
const VIEW_EVERY_MS = 15000;
/** How long a size that is not ours must last before the held bar shows. */
const HELD_BAR_DELAY_MS = 700;
/** How long a notice about something that happened stays up. */
const INFO_NOTICE_MS = 20000;
/** A `size` that is not ours may mean the grid is free: a `view` this long after it asks. */
const ASK_FOR_GRID_MS = 100;
const encoder = new TextEncoder();

export function defaultFontSize() {
  const stored = Number(localStorage.getItem(FONT_KEY));
  if (stored >= FONT_MIN && stored <= FONT_MAX) return stored;
  return matchMedia("(max-width: 600px)").matches ? 13 : 14;
}

export class TerminalView {
  constructor({ terminalId, token, title, onBack, phone, fetchTerminal }) {
    this.terminalId = terminalId;
    this.fetchTerminal = fetchTerminal; // () => the REST resource, for how it ended
    this.phone = phone;
    this.lastKeyAt = Date.now();
    this.holder = null; // true: ours, false: another viewer's, null: not told yet
    this.ptySize = null;
    this.exited = false;
    this.painted = false; // a replay was painted: a later one keeps the scrollback
    this.disposed = false;
    this.termState = null; // the terminal's state and its host's, from `status`
    this.hostState = null;
    this.heldInput = { bytes: 0, dropped: 0 }; // typed while no stream was live
    this.readOnly = false; // the server's `access` says so; nothing is sent then
    this.accessKnown = false; // this connection's `access` came: until then nothing is sent
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
    this.notice = el("div", { className: "notice", role: "status", hidden: true });
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
    for (const [button, step] of [[smaller, -1], [larger, 1]]) {
      // A click keeps the focus where it was (the terminal, and on a phone
      // its keyboard), so keys typed next are not lost to the button.
      button.addEventListener("pointerdown", (e) => e.preventDefault());
      button.addEventListener("mousedown", (e) => e.preventDefault());
      button.addEventListener("click", () => this.setFontSize(this.term.options.fontSize + step));
    }
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
      el("div", { className: "screen-area" }, this.screen, el("div", { className: "overlays" }, this.heldBar, this.notice)),
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
      held: (held) => this.onHeldInput(held),
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
    // A grid held by another viewer may be larger than this screen: the
    // box scrolls, and output that moves the cursor brings it into view.
    this.term.onCursorMove(() => this.scheduleFollow());
    this.term.onResize(() => this.scheduleFollow());
    this.stopTouchScroll = touchScroll(this.screen, this.term);
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
    clearTimeout(this.askTimer);
    this.stopTouchScroll?.();
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
      if (this.accessKnown) this.socket.send({ type: "resize", cols, rows });
      return;
    }
    if (this.holder === null) this.fitNow();
    this.sendView();
  }

  claimGrid() {
    if (this.readOnly || !this.accessKnown) return;
    const { cols, rows } = this.naturalGrid();
    this.socket.send({ type: "resize", cols, rows });
    this.term.focus();
  }

  sendView(extra = {}) {
    // A read-only connection sends nothing; nor does one whose `access`
    // has not come yet (it may be read-only).
    if (this.readOnly || !this.accessKnown) return;
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
    this.socket.sendInput(bytes);
  }

  /** Follows the cursor at the next frame (many moves, one scroll). */
  scheduleFollow() {
    if (this.followPending) return;
    this.followPending = true;
    requestAnimationFrame(() => {
      this.followPending = false;
      this.followCursor();
    });
  }

  /**
   * The cursor's cell in the screen box's scrolled content (pixels), or
   * null before the terminal is on the page.
   */
  cursorCell() {
    const grid = this.term.element?.querySelector(".xterm-screen");
    if (!grid || !grid.clientHeight) return null;
    const box = this.screen.getBoundingClientRect();
    const at = grid.getBoundingClientRect();
    const height = at.height / this.term.rows;
    const width = at.width / this.term.cols;
    const buffer = this.term.buffer.active;
    return {
      top: at.top - box.top + this.screen.scrollTop + buffer.cursorY * height,
      left: at.left - box.left + this.screen.scrollLeft + buffer.cursorX * width,
      height,
      width,
    };
  }

  /** Scrolls the screen box, when the grid does not fit it, just enough to show the cursor. */
  followCursor() {
    const box = this.screen;
    const cell = this.cursorCell();
    if (!cell || (box.scrollHeight <= box.clientHeight && box.scrollWidth <= box.clientWidth)) return;
    if (cell.top < box.scrollTop) box.scrollTop = cell.top;
    else if (cell.top + cell.height > box.scrollTop + box.clientHeight) {
      box.scrollTop = cell.top + cell.height - box.clientHeight;
    }
    if (cell.left < box.scrollLeft) box.scrollLeft = cell.left;
    else if (cell.left + cell.width > box.scrollLeft + box.clientWidth) {
      box.scrollLeft = cell.left + cell.width - box.clientWidth;
    }
  }

  /** Whether the cursor's cell lies within the visible part of the screen box. */
  cursorShown() {
    const box = this.screen;
    const cell = this.cursorCell();
    if (!cell) return false;
    const within = (start, size, from, span) => start >= from - 1 && start + size <= from + span + 1;
    return (
      within(cell.top, cell.height, box.scrollTop, box.clientHeight) &&
      within(cell.left, cell.width, box.scrollLeft, box.clientWidth)
    );
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
        this.accessKnown = true;
        // The first word of a full viewer: its grid, so it may take the
        // PTY's (a terminal not started yet included).
        this.sendView();
        break;
      case "status":
        this.termState = msg.state;
        this.hostState = msg.host;
        this.renderStatus();
        break;
      case "replay": {
        // A repaint: take the snapshot's grid. The first one paints an
        // empty terminal; a later one (the page or the server skipped
        // output) keeps what the user could scroll back to and marks where
        // output may be missing.
        const later = this.painted;
        this.painted = true;
        this.queue.clear();
        if (later) this.queue.write(new TextEncoder().encode(skippedMark(this.term.rows)));
        this.queue.then(() => {
          if (!later) this.term.reset();
          this.term.resize(clampGrid(msg.cols), clampGrid(msg.rows));
        });
        break;
      }
      case "live":
      case "resume":
        this.sendView();
        break;
      case "size": {
        const wasHolder = this.holder;
        const sameGrid = this.ptySize?.cols === msg.cols && this.ptySize?.rows === msg.rows;
        this.ptySize = { cols: msg.cols, rows: msg.rows };
        this.holder = msg.yours;
        this.queue.then(() => {
          if (!msg.yours) this.term.resize(clampGrid(msg.cols), clampGrid(msg.rows));
          else this.fitNow();
        });
        this.renderHolder();
        if (!msg.yours && wasHolder === false && sameGrid) this.askForGrid();
        break;
      }
      case "exit":
        this.exited = true;
        this.queue.then(() => this.onState("exited", { exitCode: msg.exitCode, exitSignal: msg.exitSignal }));
        if (!exitIsComplete(msg) && this.fetchTerminal) this.readExitFromResource();
        break;
      case "error":
        // The bar already says what a read-only refusal would, the status
        // what "host offline" would; a close 1000 after a failed start
        // ends the view with the reason (ViewerSocket.overMessage).
        if (msg.message === "host offline") {
          this.hostState = "offline";
          this.renderStatus();
        } else if (!(this.readOnly && msg.message.startsWith("read-only:"))) this.showNotice(msg.message);
        break;
    }
  }

  /**
   * A `size` that is not ours, with the same grid, while the grid was not
   * ours before either, says the holder changed between others: another
   * viewer claimed it, or the holder left (the grid is then free, and the
   * next arrival takes it). A visible page then says at once that it is
   * here; the server keeps the grid with a holder that is in use. A page
   * that just lost the grid, or sees the PTY resized, does not ask: two idle
   * pages would otherwise take the grid from each other in a loop.
   */
  askForGrid() {
    if (this.readOnly || this.exited || document.visibilityState !== "visible") return;
    clearTimeout(this.askTimer);
    this.askTimer = setTimeout(() => {
      if (this.holder === false) this.sendView();
    }, ASK_FOR_GRID_MS);
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
    const over = () => this.exited || this.state === "ended";
    const held = this.holder === false && !over() && !this.readOnly;
    if (!held) {
      this.heldBar.hidden = true;
      return;
    }
    // On a phone only the second part shows (style.css), so the bar stays
    // small in the top right corner instead of covering the top row.
    this.holderText.replaceChildren(
      el("span", { className: "held-size" }, `viewing at ${this.ptySize.cols}×${this.ptySize.rows}, `),
      "held by another viewer",
    );
    if (!this.heldBar.hidden) return;
    this.heldBarTimer = setTimeout(() => {
      if (this.holder === false && !over()) this.heldBar.hidden = false;
    }, HELD_BAR_DELAY_MS);
  }

  onState(name, detail) {
    this.state = name;
    if (this.stateLog.at(-1) !== name) this.stateLog.push(name);
    if (this.stateLog.length > 50) this.stateLog.shift();
    this.status.dataset.state = name;
    if (name === "connecting" || name === "reconnecting") {
      // A new connection tells the terminal's and the host's state afresh.
      this.termState = null;
      this.hostState = null;
      this.accessKnown = false;
      this.attempt = detail.attempt;
    }
    if (name === "ended") {
      this.endMessage = detail.message;
      this.renderHolder();
    }
    if (name === "exited") {
      // The resource may have answered first: what it said stays.
      this.exitCode = detail.exitCode ?? this.exitCode;
      this.exitSignal = detail.exitSignal ?? this.exitSignal;
      this.renderHolder();
      this.term.options.cursorBlink = false;
    }
    this.renderStatus();
  }

  /** How the terminal ended, from its REST resource (the `exit` message had no code: a signal). */
  async readExitFromResource() {
    const status = await exitFromResource(this.fetchTerminal);
    if (!status || this.disposed) return;
    this.exitCode ??= status.exitCode;
    this.exitSignal ??= status.exitSignal;
    this.renderStatus();
  }

  /** Keys typed while no stream is live are held by the socket; the notice says so. */
  onHeldInput(held) {
    this.heldInput = held;
    if (this.state === "live" && held.bytes === 0 && held.dropped > 0) {
      this.showNotice(`${held.dropped} bytes typed while disconnected did not fit in the ${HELD_INPUT_LIMIT}-byte hold and were not sent.`);
    } else this.renderStatus();
  }

  /**
   * The header's status and the notice, from the socket's state, the
   * terminal's (`status`) and what waits to be sent: what the view is
   * waiting for, in words.
   */
  renderStatus() {
    const { text, notice, kind } = describeStatus({
      state: this.state,
      attempt: this.attempt,
      termState: this.termState,
      hostState: this.hostState,
      exitCode: this.exitCode,
      exitSignal: this.exitSignal,
      endMessage: this.endMessage,
      heldBytes: this.heldInput.bytes,
      droppedBytes: this.heldInput.dropped,
    });
    this.status.textContent = text;
    if (notice) this.showNotice(notice, kind);
    else if (["connection", "host"].includes(this.notice.dataset.kind)) this.hideNotice();
  }

  /**
   * Shows a notice. One about something that happened ("info": output
   * skipped, input dropped, the server's error) goes away after a while;
   * one about a state the page waits on stays until that state changes.
   */
  showNotice(text, kind = "info") {
    clearTimeout(this.noticeTimer);
    this.notice.textContent = text;
    this.notice.dataset.kind = kind;
    this.notice.hidden = false;
    if (kind === "info") this.noticeTimer = setTimeout(() => this.hideNotice(), INFO_NOTICE_MS);
  }

  hideNotice() {
    clearTimeout(this.noticeTimer);
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
      status: this.status.textContent,
      notice: this.notice.hidden ? null : this.notice.textContent,
      cursorShown: this.cursorShown(),
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

/** The line that marks a later repaint in the scrollback. */
export const SKIPPED_MARK = "── output skipped; the screen below is repainted ──";

/**
 * Escape sequences that move the screen of a terminal `rows` high into its
 * scrollback, followed by SKIPPED_MARK, leaving the screen blank for a
 * snapshot: back to the main buffer (the alternate one has no scrollback),
 * a soft reset (attributes, margins, origin mode), then as many line feeds
 * from the bottom row as the screen has rows.
 */
export function skippedMark(rows) {
  return `\x1b[?1049l\x1b[!p\x1b[${rows};1H\r\n\x1b[2m${SKIPPED_MARK}\x1b[0m${"\r\n".repeat(rows)}`;
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
