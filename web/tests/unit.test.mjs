// Unit tests of the page's plain logic (node --test); tests/web_browser.rs
// runs them too.

import { test } from "node:test";
import assert from "node:assert/strict";
import { OutputQueue } from "../src/output-queue.js";
import { ctrlOf, Modifiers } from "../src/keys.js";
import { splitArgv } from "../src/dom.js";
import { backoffDelay, BACKOFF } from "../src/viewer-socket.js";

/** An xterm.js stand-in whose parser finishes a write only when told to. */
function slowTerm() {
  const pending = [];
  return {
    written: [],
    write(bytes, done) {
      this.written.push(bytes.byteLength);
      pending.push(done);
    },
    /** Finishes the writes in flight now (not those they let in). */
    finishAll() {
      for (const done of pending.splice(0)) done();
    },
    get pending() {
      return pending.length;
    },
  };
}

test("the queue hands xterm.js at most the in-flight limit", () => {
  const term = slowTerm();
  const q = new OutputQueue(term, { inFlightLimit: 100, queueLimit: 1000 });
  for (let i = 0; i < 5; i++) q.write(new Uint8Array(40));
  assert.equal(term.written.length, 2, "80 bytes in flight; the third would pass 100");
  assert.equal(q.heldBytes, 200);
  term.finishAll();
  assert.equal(term.written.length, 4);
  term.finishAll();
  term.finishAll();
  assert.equal(q.heldBytes, 0);
});

test("past the queue limit it drops what waits and reports an overflow", () => {
  const term = slowTerm();
  let overflows = 0;
  const q = new OutputQueue(term, { inFlightLimit: 10, queueLimit: 50, onOverflow: () => overflows++ });
  for (let i = 0; i < 10; i++) q.write(new Uint8Array(10));
  assert.equal(overflows, 1);
  assert.ok(q.heldBytes <= 60, `held ${q.heldBytes}`);
  assert.ok(q.peakBytes <= 70, `peak ${q.peakBytes}`);
});

test("actions run in order, after the bytes before them are parsed", () => {
  const term = slowTerm();
  const q = new OutputQueue(term, { inFlightLimit: 100 });
  const order = [];
  q.write(new Uint8Array(10));
  q.then(() => order.push("reset"));
  q.write(new Uint8Array(10));
  assert.deepEqual(order, []);
  assert.equal(term.written.length, 1, "nothing passes an action");
  term.finishAll();
  assert.deepEqual(order, ["reset"]);
  assert.equal(term.written.length, 2);
});

test("Ctrl turns keys into control characters", () => {
  assert.equal(ctrlOf("c"), "\x03");
  assert.equal(ctrlOf("C"), "\x03");
  assert.equal(ctrlOf("["), "\x1b");
  assert.equal(ctrlOf(" "), "\x00");
  assert.equal(ctrlOf("?"), "\x7f");
  assert.equal(ctrlOf("é"), null);
  const m = new Modifiers(() => {});
  m.toggle("ctrl");
  assert.equal(m.apply("d"), "\x04");
  assert.equal(m.apply("d"), "d", "the latch lets go after one key");
  m.toggle("alt");
  assert.equal(m.apply("x"), "\x1bx");
});

test("command lines split like a shell's words", () => {
  assert.deepEqual(splitArgv(""), []);
  assert.deepEqual(splitArgv("  htop  "), ["htop"]);
  assert.deepEqual(splitArgv(`sh -c "echo 'a b'"`), ["sh", "-c", "echo 'a b'"]);
  assert.deepEqual(splitArgv(`a\\ b ''`), ["a b", ""]);
});

test("backoff doubles to its ceiling with bounded jitter", () => {
  assert.equal(backoffDelay(1, () => 0), BACKOFF.firstMs);
  assert.equal(backoffDelay(2, () => 0), BACKOFF.firstMs * 2);
  assert.equal(backoffDelay(30, () => 0), BACKOFF.maxMs);
  assert.equal(backoffDelay(30, () => 1), Math.round(BACKOFF.maxMs * (1 + BACKOFF.jitter)));
});

test("lists follow nextCursor to the last page", async () => {
  const { list } = await import("../src/api.js");
  const asked = [];
  const pages = { "": ["a", "b"], "?after=c1": ["c"], "?after=c2": [] };
  const cursors = { "": "c1", "?after=c1": "c2" };
  const saved = globalThis.fetch;
  globalThis.fetch = async (url) => {
    const query = url.slice("/api/v1/hosts".length);
    asked.push(query);
    const body = { hosts: pages[query] };
    if (cursors[query]) body.nextCursor = cursors[query];
    return new Response(JSON.stringify(body), { headers: { "content-type": "application/json" } });
  };
  try {
    assert.deepEqual(await list("tok", "/hosts", "hosts"), ["a", "b", "c"]);
    assert.deepEqual(asked, ["", "?after=c1", "?after=c2"]);
  } finally {
    globalThis.fetch = saved;
  }
});
