// One terminal's viewer socket (docs/WEB.md, "Viewer protocol"), kept
// alive: it dials `/ws/v1/terminals/{id}` with the token in the
// subprotocol list (never in the URL), tracks the stream offset of the
// bytes it has passed on, and after a drop dials again with `?from=` that
// offset, backing off between tries. Close codes that no retry can fix
// (4401, 4403, 4404), the server's close 1000 (the terminal is over: it
// exited, or it failed to start and an `error` said why) and the
// terminal's exit end it for good.
//
// Input typed while no stream is live (reconnecting, host offline, not
// started yet) is held, up to HELD_INPUT_LIMIT bytes, and sent once the
// stream is live again; what does not fit is dropped and reported.
//
// A browser cannot see WebSocket pings, so a server that stopped answering
// (a frozen pod, a connection a phone's network change left half open)
// would look live for ever. After LIVENESS.quietMs with nothing heard the
// socket sends `{"type":"ping"}`; with nothing heard LIVENESS.answerMs
// after that, it drops the connection and redials from its offset. A page
// that becomes visible again asks at once (docs/WEB.md, "Liveness").

export const FINAL_CLOSES = {
  4401: "The token is no longer accepted: sign in again.",
  4403: "This terminal belongs to someone else.",
  4404: "There is no such terminal.",
};
/** A 4403 whose token is a share link for another terminal (docs/PROTOCOL.md, "Viewer close codes"). */
const OUT_OF_SCOPE = "this token's scope does not reach this terminal";

/** What a final close says: a share link opened on another terminal is not "someone else's". */
export function finalCloseMessage(code, reason) {
  if (code === 4403 && reason === OUT_OF_SCOPE) return "This link is for another terminal: it does not open this one.";
  return FINAL_CLOSES[code];
}
const HOST_MOVED = 4503;
/** What a connection the watchdog dropped counts as: an abnormal close. */
const CLOSE_NO_ANSWER = 1006;
/** The server's "stop; the terminal is over" (docs/PROTOCOL.md, "Viewer close codes"). */
const TERMINAL_OVER = 1000;
/** At most this much input waits for the stream to come back. */
export const HELD_INPUT_LIMIT = 4096;
/** Input goes in frames of at most this (the server takes frames up to 1 MiB). */
export const INPUT_FRAME_BYTES = 64 * 1024;

export const BACKOFF = { firstMs: 500, maxMs: 15000, jitter: 0.25 };

/** When to ask the server whether it is there, and how long it has to answer. */
export const LIVENESS = { quietMs: 15000, answerMs: 5000, checkEveryMs: 1000 };

/** The delay before retry number `attempt` (1-based) after an ordinary drop. */
export function backoffDelay(attempt, random = Math.random) {
  const base = Math.min(BACKOFF.maxMs, BACKOFF.firstMs * 2 ** (attempt - 1));
  return Math.round(base * (1 + BACKOFF.jitter * random()));
}

export class ViewerSocket {
  /**
   * handlers: control(msg) for JSON messages, bytes(Uint8Array, {live}) for
   * binary frames (live = stream bytes, counted in the offset; otherwise a
   * replay snapshot), state(name, detail) on every change of
   * connecting | live | reconnecting | ended, held({bytes, dropped}) when
   * the input waiting for the stream changes.
   */
  constructor(terminalId, token, handlers) {
    this.terminalId = terminalId;
    this.token = token;
    this.handlers = handlers;
    this.offset = null; // stream offset after the last live byte handed on
    this.inStream = false; // between live/resume and the close
    this.attempt = 0;
    this.ended = false;
    this.ws = null;
    this.timer = null;
    this.termState = null; // the last `status` message's state
    this.hostOnline = true; // the last `status` message's host
    this.lastError = null; // the last `error` message on this connection
    this.held = []; // input typed while no stream was live
    this.heldBytes = 0;
    this.droppedInput = 0; // bytes of it that did not fit
    this.stats = { connects: 0, resumes: 0, replays: 0, urls: [], closes: [], sizes: [], heldSent: 0, unanswered: 0 };
    this.heardAt = 0; // when this connection last heard anything from the server
    this.askedAt = null; // when the unanswered `ping` went out
    this.onOnline = () => this.retryNow();
    window.addEventListener("online", this.onOnline);
    this.onVisible = () => {
      if (globalThis.document?.visibilityState === "visible") this.checkLiveness(Date.now(), { askNow: true });
    };
    globalThis.document?.addEventListener("visibilitychange", this.onVisible);
    this.livenessTimer = setInterval(() => this.checkLiveness(Date.now()), LIVENESS.checkEveryMs);
    this.livenessTimer.unref?.(); // under Node (the unit tests) it keeps no process alive
  }

  /**
   * The watchdog (see the top of this file): pings a quiet server and
   * drops a connection that has not answered. `askNow` pings at once
   * unless a ping is out already (the page became visible again).
   */
  checkLiveness(now, { askNow = false } = {}) {
    const ws = this.ws;
    if (this.ended || !ws) return;
    if (ws.readyState === WebSocket.CONNECTING) {
      // A handshake that hangs (a black-holed address) gets as long as a
      // quiet connection and its answer together.
      if (now - this.heardAt >= LIVENESS.quietMs + LIVENESS.answerMs) this.dropUnanswered(ws);
      return;
    }
    if (ws.readyState !== WebSocket.OPEN) return;
    if (this.askedAt !== null) {
      if (now - this.askedAt >= LIVENESS.answerMs) this.dropUnanswered(ws);
      return;
    }
    if (askNow || now - this.heardAt >= LIVENESS.quietMs) {
      this.askedAt = now;
      this.send({ type: "ping" });
    }
  }

  /** Gives up on a connection that does not answer and redials, as after a drop. */
  dropUnanswered(ws) {
    this.stats.unanswered += 1;
    this.ws = null;
    ws.onmessage = null;
    ws.onclose = null;
    ws.close(1000, "no answer");
    this.onClose(CLOSE_NO_ANSWER, "the server did not answer");
  }

  connect({ fresh = false } = {}) {
    clearTimeout(this.timer);
    this.timer = null;
    if (this.ended) return;
    if (fresh) this.offset = null;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = this.offset === null ? "" : `?from=${this.offset}`;
    const url = `${scheme}://${location.host}/ws/v1/terminals/${encodeURIComponent(this.terminalId)}${query}`;
    this.stats.connects += 1;
    this.stats.urls.push(url.replace(/^wss?:\/\/[^/]+/, ""));
    const ws = new WebSocket(url, ["tether.v1", `tether.auth.${this.token}`]);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.inStream = false;
    this.lastError = null;
    this.heardAt = Date.now();
    this.askedAt = null;
    this.handlers.state(this.attempt === 0 ? "connecting" : "reconnecting", { attempt: this.attempt });
    ws.onmessage = (ev) => {
      if (ws !== this.ws) return;
      this.heardAt = Date.now();
      this.askedAt = null;
      if (typeof ev.data === "string") this.onControl(JSON.parse(ev.data));
      else this.onBytes(new Uint8Array(ev.data));
    };
    ws.onclose = (ev) => {
      if (ws !== this.ws) return;
      this.ws = null;
      this.onClose(ev.code, ev.reason);
    };
  }

  onControl(msg) {
    switch (msg.type) {
      case "replay":
        this.stats.replays += 1;
        this.inStream = false;
        break;
      case "live":
      case "resume":
        if (msg.type === "resume") this.stats.resumes += 1;
        this.offset = msg.offset;
        this.inStream = true;
        this.attempt = 0;
        this.handlers.state("live", {});
        break;
      case "status":
        this.termState = msg.state;
        this.hostOnline = msg.host !== "offline";
        break;
      case "size":
        this.stats.sizes.push(`${msg.cols}x${msg.rows}${msg.yours ? "*" : ""}`);
        if (this.stats.sizes.length > 50) this.stats.sizes.shift();
        break;
      case "error":
        this.lastError = msg.message;
        break;
      case "exit":
        this.ended = true;
        break;
    }
    this.handlers.control(msg);
    if (this.ended) this.close();
    else if (this.canSendInput()) this.sendHeld();
  }

  onBytes(bytes) {
    if (this.inStream) this.offset += bytes.byteLength;
    this.handlers.bytes(bytes, { live: this.inStream });
  }

  onClose(code, reason) {
    this.stats.closes.push(code);
    if (this.ended) return;
    if (FINAL_CLOSES[code]) {
      this.end(finalCloseMessage(code, reason), code);
      return;
    }
    if (code === TERMINAL_OVER) {
      this.end(this.overMessage(), code);
      return;
    }
    this.attempt += 1;
    // 4503: the host moved or the instance is draining; the terminal is
    // elsewhere now, so the first redial goes at once.
    const delay = code === HOST_MOVED && this.attempt === 1 ? 0 : backoffDelay(this.attempt);
    this.handlers.state("reconnecting", { attempt: this.attempt, delayMs: delay, code, reason });
    this.timer = setTimeout(() => this.connect(), delay);
  }

  /** Why the server said the terminal is over (close 1000 with no `exit`). */
  overMessage() {
    if (this.termState === "error") return `The terminal could not start: ${this.lastError ?? "the server gave no reason"}`;
    return this.lastError ? `The terminal is over: ${this.lastError}` : "The terminal is over.";
  }

  /** Skips the wait of a pending retry (the network came back). */
  retryNow() {
    if (!this.ended && this.ws === null && this.timer !== null) this.connect();
  }

  /** Drops the socket and attaches again for a fresh snapshot. */
  resync() {
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close(1000, "resync");
    this.connect({ fresh: true });
  }

  /** Sends a control message now, or drops it: they only matter while connected. */
  send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(typeof message === "string" || message instanceof Uint8Array ? message : JSON.stringify(message));
      return true;
    }
    return false;
  }

  /** Whether input sent now reaches the terminal (the server drops it while the host is offline). */
  canSendInput() {
    return this.inStream && this.hostOnline && this.ws !== null;
  }

  /**
   * Sends input while the stream is live, in frames of at most
   * INPUT_FRAME_BYTES (a larger frame is closed 4413: a big paste used to
   * be lost so); holds it (bounded) until then.
   */
  sendInput(bytes) {
    if (this.ended) return;
    if (this.canSendInput() && this.held.length === 0 && this.sendInFrames(bytes)) return;
    if (this.heldBytes + bytes.byteLength > HELD_INPUT_LIMIT) this.droppedInput += bytes.byteLength;
    else {
      this.held.push(bytes);
      this.heldBytes += bytes.byteLength;
    }
    this.handlers.held?.({ bytes: this.heldBytes, dropped: this.droppedInput });
  }

  /** Sends `bytes` in frames of at most INPUT_FRAME_BYTES; false if the socket is not open. */
  sendInFrames(bytes) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    for (let at = 0; at < bytes.byteLength; at += INPUT_FRAME_BYTES) {
      this.ws.send(bytes.subarray(at, at + INPUT_FRAME_BYTES));
    }
    return true;
  }

  /**
   * The stream is live again: what was typed meanwhile goes out, in order.
   * The handler hears once more how much was dropped, then the count starts over.
   */
  sendHeld() {
    if (this.held.length === 0 && this.droppedInput === 0) return;
    while (this.held.length > 0 && this.send(this.held[0])) {
      this.stats.heldSent += this.held[0].byteLength;
      this.heldBytes -= this.held.shift().byteLength;
    }
    if (this.held.length > 0) return;
    this.handlers.held?.({ bytes: 0, dropped: this.droppedInput });
    this.droppedInput = 0;
  }

  end(message, code) {
    this.ended = true;
    this.held = [];
    this.heldBytes = 0;
    this.handlers.state("ended", { message, code });
    this.close();
  }

  close() {
    clearTimeout(this.timer);
    this.timer = null;
    window.removeEventListener("online", this.onOnline);
    globalThis.document?.removeEventListener("visibilitychange", this.onVisible);
    clearInterval(this.livenessTimer);
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close(1000, "bye");
  }
}
