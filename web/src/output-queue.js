// Bounded buffering between the socket and xterm.js (docs/WEB.md, "Large
// output").
//
// A browser WebSocket cannot stop reading, so when output arrives faster
// than xterm.js parses it the bytes pile up somewhere. Here they pile up in
// one place with a limit: at most `inFlightLimit` bytes are handed to
// xterm.js at a time (its write callback says when a chunk was parsed),
// the rest waits in `queue`. When the queue passes `queueLimit` the page
// stops trying to show every byte: it drops the queue and calls
// `onOverflow`, and the terminal view re-attaches for a fresh snapshot of
// the screen (skipping ahead, as the server's own slow-viewer rule would).
//
// Actions (reset, resize) are queued in order with the bytes: one runs only
// once everything before it has been parsed.

export class OutputQueue {
  constructor(term, { inFlightLimit = 256 * 1024, queueLimit = 4 * 1024 * 1024, onOverflow = () => {} } = {}) {
    this.term = term;
    this.inFlightLimit = inFlightLimit;
    this.queueLimit = queueLimit;
    this.onOverflow = onOverflow;
    this.queue = [];
    this.queuedBytes = 0;
    this.inFlight = 0;
    this.peakBytes = 0;
    this.overflows = 0;
  }

  /** Terminal bytes (Uint8Array) in stream order. */
  write(bytes) {
    if (bytes.byteLength === 0) return;
    this.queue.push(bytes);
    this.queuedBytes += bytes.byteLength;
    this.peakBytes = Math.max(this.peakBytes, this.queuedBytes + this.inFlight);
    if (this.queuedBytes > this.queueLimit) {
      this.overflows += 1;
      this.clear();
      this.onOverflow();
      return;
    }
    this.pump();
  }

  /** Runs `fn` once every byte queued before it has been parsed. */
  then(fn) {
    this.queue.push(fn);
    this.pump();
  }

  /** Drops what has not reached xterm.js yet; parses in flight still finish. */
  clear() {
    this.queue = [];
    this.queuedBytes = 0;
  }

  /** Bytes held by the page: queued plus handed to xterm.js and not yet parsed. */
  get heldBytes() {
    return this.queuedBytes + this.inFlight;
  }

  pump() {
    while (this.queue.length > 0) {
      const next = this.queue[0];
      if (typeof next === "function") {
        if (this.inFlight > 0) return; // wait for the parser to catch up
        this.queue.shift();
        next();
        continue;
      }
      if (this.inFlight > 0 && this.inFlight + next.byteLength > this.inFlightLimit) return;
      this.queue.shift();
      this.queuedBytes -= next.byteLength;
      this.inFlight += next.byteLength;
      this.term.write(next, () => {
        this.inFlight -= next.byteLength;
        this.pump();
      });
    }
  }
}
