// Unit tests of the page's plain logic (node --test); tests/web_browser.rs
// runs them too.

import { test } from "node:test";
import assert from "node:assert/strict";
import { OutputQueue } from "../src/output-queue.js";
import { arrowSequence, ctrlOf, Modifiers } from "../src/keys.js";
import { splitArgv } from "../src/dom.js";
import {
  backoffDelay, BACKOFF, finalCloseMessage, HELD_INPUT_LIMIT, INPUT_FRAME_BYTES, LIVENESS, ViewerSocket,
} from "../src/viewer-socket.js";
import { PagedList } from "../src/api.js";
import { describeStatus } from "../src/status.js";
import { linesFor } from "../src/touch-scroll.js";
import { describeExit, exitFromResource, exitIsComplete, shortExit, signalName } from "../src/exit.js";
import { actionFor } from "../src/terminal-actions.js";
import { api } from "../src/api.js";

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

test("a 4403 for a share link's scope is not called someone else's terminal", () => {
  assert.equal(finalCloseMessage(4403, "not your terminal"), "This terminal belongs to someone else.");
  assert.match(finalCloseMessage(4403, "this token's scope does not reach this terminal"), /link is for another terminal/);
  assert.equal(finalCloseMessage(4404, "no such terminal"), "There is no such terminal.");
});

test("command lines split like a shell's words", () => {
  assert.deepEqual(splitArgv(""), []);
  assert.throws(() => splitArgv('echo "unterminated'), /quote that is not closed/);
  assert.throws(() => splitArgv("echo 'x"), /quote that is not closed/);
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

test("a latch modifies the first character of a multi-character chunk", () => {
  const m = new Modifiers(() => {});
  m.toggle("ctrl");
  assert.equal(m.apply("cd"), "\x03d", "a soft keyboard's word: Ctrl takes its first letter");
  assert.equal(m.ctrl, false);
  m.toggle("alt");
  assert.equal(m.apply("bc"), "\x1bbc");
});

test("latched arrows are xterm's modified arrows", () => {
  assert.equal(arrowSequence("D"), "\x1b[D");
  assert.equal(arrowSequence("D", { application: true }), "\x1bOD");
  assert.equal(arrowSequence("D", { ctrl: true }), "\x1b[1;5D");
  assert.equal(arrowSequence("C", { alt: true }), "\x1b[1;3C");
  assert.equal(arrowSequence("A", { ctrl: true, alt: true, application: true }), "\x1b[1;7A");
});

test("a finger drag scrolls whole lines", () => {
  assert.equal(linesFor(50, 17), 2);
  assert.equal(linesFor(-50, 17), -2);
  assert.equal(linesFor(10, 17), 0);
  assert.equal(linesFor(10, 0), 0);
});

test("the status says what the view waits for", () => {
  assert.deepEqual(describeStatus({ state: "live", termState: "running", hostState: "online" }), { text: "live" });
  const offline = describeStatus({ state: "live", termState: "running", hostState: "offline" });
  assert.equal(offline.text, "host offline");
  assert.equal(offline.kind, "host");
  const pending = describeStatus({ state: "connecting", termState: "pending", hostState: "offline" });
  assert.equal(pending.text, "pending");
  assert.match(pending.notice, /not started yet: it starts when its host comes online/);
  const failed = describeStatus({ state: "ended", termState: "error", endMessage: "The terminal could not start: x." });
  assert.deepEqual(failed, { text: "failed to start", notice: "The terminal could not start: x.", kind: "final" });
  const down = describeStatus({ state: "reconnecting", attempt: 2, heldBytes: 5 });
  assert.equal(down.text, "reconnecting (try 2)");
  assert.match(down.notice, /held \(5 bytes so far\) and sent once it is back/);
  // A paste too large for the hold is said at once, not only once live again.
  const dropped = describeStatus({ state: "reconnecting", attempt: 1, heldBytes: 5, droppedBytes: 5000 });
  assert.match(dropped.notice, /held \(5 bytes so far\).* 5000 bytes did not fit in the 4096-byte hold and will not be sent/);
  const droppedOffline = describeStatus({ state: "live", termState: "running", hostState: "offline", droppedBytes: 5000 });
  assert.match(droppedOffline.notice, /5000 bytes did not fit/);
  assert.deepEqual(describeStatus({ state: "exited", exitCode: 3 }), { text: "exited with code 3" });
});

/** A browser WebSocket stand-in: the test opens, feeds and closes it. */
class FakeSocket {
  static all = [];
  static CONNECTING = 0;
  static OPEN = 1;
  constructor(url, protocols) {
    Object.assign(this, { url, protocols, readyState: 0, sent: [] });
    FakeSocket.all.push(this);
  }
  open() {
    this.readyState = FakeSocket.OPEN;
  }
  send(data) {
    this.sent.push(typeof data === "string" ? JSON.parse(data) : new TextDecoder().decode(data));
  }
  control(msg) {
    this.onmessage({ data: JSON.stringify(msg) });
  }
  serverClose(code) {
    this.readyState = 3;
    this.onclose({ code, reason: "" });
  }
  close() {
    this.readyState = 3;
  }
}

/** A ViewerSocket on FakeSockets, with what it told its handlers. */
function fakeViewer() {
  globalThis.window ??= new EventTarget();
  globalThis.location ??= { protocol: "http:", host: "tether.test" };
  globalThis.WebSocket = FakeSocket;
  FakeSocket.all = [];
  const seen = { states: [], held: [] };
  const socket = new ViewerSocket("t1", "tok", {
    control: () => {},
    bytes: () => {},
    state: (name, detail) => seen.states.push({ name, ...detail }),
    held: (h) => seen.held.push(h),
  });
  socket.connect();
  const ws = () => FakeSocket.all.at(-1);
  ws().open();
  return { socket, seen, ws };
}

test("close 1000 after a failed start ends the view with the reason, no retry", () => {
  const { socket, seen, ws } = fakeViewer();
  ws().control({ type: "access", readOnly: false });
  ws().control({ type: "status", state: "error", host: "online" });
  ws().control({ type: "error", message: "cannot start /nope: ENOENT" });
  ws().serverClose(1000);
  const last = seen.states.at(-1);
  assert.equal(last.name, "ended");
  assert.equal(last.message, "The terminal could not start: cannot start /nope: ENOENT");
  assert.equal(socket.timer, null, "no retry is planned");
  assert.equal(FakeSocket.all.length, 1);
});

test("drops other than 1000 still reconnect", () => {
  for (const code of [1006, 1001, 1011, 4503, 4429]) {
    const { socket, seen, ws } = fakeViewer();
    ws().control({ type: "live", offset: 7 });
    ws().serverClose(code);
    assert.equal(seen.states.at(-1).name, "reconnecting", `close ${code}`);
    assert.notEqual(socket.timer, null, `close ${code} plans a retry`);
    socket.close();
  }
});

test("keys typed while reconnecting are held and sent once live again", () => {
  const { socket, seen, ws } = fakeViewer();
  ws().control({ type: "status", state: "running", host: "online" });
  ws().control({ type: "live", offset: 0 });
  socket.sendInput(new TextEncoder().encode("a"));
  assert.deepEqual(ws().sent, ["a"]);
  ws().serverClose(1006);
  socket.sendInput(new TextEncoder().encode("echo hi\r"));
  assert.deepEqual(seen.held.at(-1), { bytes: 8, dropped: 0 });
  socket.sendInput(new Uint8Array(HELD_INPUT_LIMIT)); // does not fit: dropped, and said so
  assert.deepEqual(seen.held.at(-1), { bytes: 8, dropped: HELD_INPUT_LIMIT });
  socket.connect();
  ws().open();
  ws().control({ type: "status", state: "running", host: "online" });
  assert.deepEqual(ws().sent, [], "nothing before the stream is live");
  ws().control({ type: "resume", offset: 1 });
  assert.deepEqual(ws().sent, ["echo hi\r"]);
  assert.deepEqual(seen.held.at(-1), { bytes: 0, dropped: HELD_INPUT_LIMIT }, "the drop is told once more");
  socket.sendInput(new TextEncoder().encode("b"));
  assert.deepEqual(ws().sent, ["echo hi\r", "b"]);
  socket.close();
});

test("input waits while the host is offline", () => {
  const { socket, ws } = fakeViewer();
  ws().control({ type: "status", state: "running", host: "offline" });
  ws().control({ type: "error", message: "host offline" });
  socket.sendInput(new TextEncoder().encode("x"));
  assert.deepEqual(ws().sent, []);
  ws().control({ type: "status", state: "running", host: "online" });
  ws().control({ type: "replay", cols: 80, rows: 24, offset: 0 });
  ws().control({ type: "live", offset: 0 });
  assert.deepEqual(ws().sent, ["x"]);
  socket.close();
});

test("a list reads every page once, then from its last page on", async () => {
  const asked = [];
  // Three pages; the refreshes add "e" to the last one.
  const pages = { "": ["a", "b"], "?after=c1": ["c", "d"], "?after=c2": [] };
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
    const list = new PagedList("tok", "/hosts", "hosts", 3);
    assert.deepEqual(await list.refresh(), ["a", "b", "c", "d"]);
    assert.deepEqual(asked.splice(0), ["", "?after=c1", "?after=c2"]);
    pages["?after=c2"] = ["e"];
    assert.deepEqual(await list.refresh(), ["a", "b", "c", "d", "e"]);
    assert.deepEqual(asked.splice(0), ["?after=c2"], "only the last page, where new items come");
    pages["?after=c2"] = ["e2"];
    assert.deepEqual(await list.refresh(), ["a", "b", "c", "d", "e2"]);
    assert.deepEqual(asked.splice(0), ["?after=c2"]);
    pages[""] = ["a"]; // "b" deleted: seen at the next full read
    assert.deepEqual(await list.refresh(), ["a", "c", "d", "e2"]);
    assert.deepEqual(asked.splice(0), ["", "?after=c1", "?after=c2"]);
  } finally {
    globalThis.fetch = saved;
  }
});

test("signals have their portable names, others their number", () => {
  assert.equal(signalName(1), "SIGHUP");
  assert.equal(signalName(9), "SIGKILL");
  assert.equal(signalName(15), "SIGTERM");
  assert.equal(signalName(10), "signal 10", "SIGUSR1 on Linux, SIGBUS on macOS: the page cannot tell");
  assert.equal(signalName(64), "signal 64");
});

test("an ended terminal says its code or its signal", () => {
  assert.equal(describeExit({ exitCode: 0, exitSignal: null }), "exited with code 0");
  assert.equal(describeExit({ exitCode: 3 }), "exited with code 3");
  assert.equal(describeExit({ exitCode: null, exitSignal: 1 }), "killed by SIGHUP");
  assert.equal(describeExit({ exitCode: null, exitSignal: 42 }), "killed by signal 42");
  assert.equal(describeExit({ exitCode: null, exitSignal: null }), "exited");
  assert.equal(shortExit({ exitCode: 3 }), "exited (3)");
  assert.equal(shortExit({ exitCode: null, exitSignal: 1 }), "killed (SIGHUP)");
  assert.equal(shortExit({}), "exited");
  assert.equal(describeStatus({ state: "exited", exitCode: null, exitSignal: 1 }).text, "killed by SIGHUP");
  assert.equal(describeStatus({ state: "exited", exitCode: 0, exitSignal: null }).text, "exited with code 0");
  assert.ok(exitIsComplete({ exitCode: 0 }) && exitIsComplete({ exitCode: null, exitSignal: 9 }));
  assert.ok(!exitIsComplete({ type: "exit", exitCode: null }), "a signal's exit message says nothing more");
});

test("the exit is read from the resource once it says exited", async () => {
  const answers = [{ state: "running" }, Promise.reject(new Error("network")), { state: "exited", exitCode: null, exitSignal: 1 }];
  const waits = [];
  const sleep = async (ms) => waits.push(ms);
  const status = await exitFromResource(() => answers.shift(), { sleep, waitMs: 7 });
  assert.deepEqual(status, { exitCode: null, exitSignal: 1 });
  assert.deepEqual(waits, [7, 7]);
  const never = await exitFromResource(async () => ({ state: "running" }), { sleep, tries: 3 });
  assert.equal(never, null);
});

test("running terminals offer Kill, ended ones Delete", () => {
  assert.equal(actionFor("running"), "kill");
  assert.equal(actionFor("launching"), "kill");
  for (const state of ["pending", "exited", "error"]) assert.equal(actionFor(state), "delete", state);
});

test("kill sends the chosen signal (none: the server's HUP); delete answers nothing", async () => {
  const asked = [];
  const saved = globalThis.fetch;
  globalThis.fetch = async (url, init) => {
    asked.push([init.method, url, init.body ?? null]);
    if (init.method === "DELETE") return new Response(null, { status: 204 });
    return new Response(JSON.stringify({ terminal: { id: "t1", state: "running" } }), {
      status: 202,
      headers: { "content-type": "application/json" },
    });
  };
  try {
    const client = api("tok");
    assert.deepEqual(await client.killTerminal("t1"), { id: "t1", state: "running" });
    assert.deepEqual(await client.killTerminal("t1", "KILL"), { id: "t1", state: "running" });
    assert.equal(await client.deleteTerminal("t1"), null);
    assert.deepEqual(asked, [
      ["POST", "/api/v1/terminals/t1/kill", null],
      ["POST", "/api/v1/terminals/t1/kill", '{"signal":"KILL"}'],
      ["DELETE", "/api/v1/terminals/t1", null],
    ]);
  } finally {
    globalThis.fetch = saved;
  }
});

test("a quiet server is asked with a ping; one that does not answer is dropped and redialled from its offset", () => {
  const { socket, seen, ws } = fakeViewer();
  const first = ws();
  first.control({ type: "access", readOnly: true });
  first.control({ type: "status", state: "running", host: "online" });
  first.control({ type: "live", offset: 10 });
  const t0 = socket.heardAt;
  socket.checkLiveness(t0 + LIVENESS.quietMs - 1);
  assert.deepEqual(first.sent, [], "nothing is asked before the connection has been quiet long enough");
  socket.checkLiveness(t0 + LIVENESS.quietMs);
  assert.deepEqual(first.sent, [{ type: "ping" }], "a read-only viewer pings too");
  socket.checkLiveness(t0 + LIVENESS.quietMs + 1);
  assert.equal(first.sent.length, 1, "one ping at a time");
  // An answer (any message) keeps the connection.
  first.control({ type: "pong" });
  socket.checkLiveness(socket.heardAt + LIVENESS.answerMs);
  assert.equal(socket.ws, first);
  // A ping nobody answers drops it; the redial resumes from the offset.
  const t1 = socket.heardAt;
  socket.checkLiveness(t1 + LIVENESS.quietMs);
  assert.equal(first.sent.length, 2);
  socket.checkLiveness(t1 + LIVENESS.quietMs + LIVENESS.answerMs - 1);
  assert.equal(socket.ws, first, "the answer's time is not over yet");
  socket.checkLiveness(t1 + LIVENESS.quietMs + LIVENESS.answerMs);
  assert.equal(socket.ws, null);
  assert.equal(first.readyState, 3, "the dead connection is closed");
  assert.equal(seen.states.at(-1).name, "reconnecting");
  assert.equal(socket.stats.unanswered, 1);
  socket.connect();
  assert.match(ws().url, /\?from=10$/);
  // Becoming visible asks at once.
  ws().open();
  socket.checkLiveness(socket.heardAt, { askNow: true });
  assert.deepEqual(ws().sent, [{ type: "ping" }]);
  socket.close();
});

test("a handshake that hangs is given up and redialled", () => {
  const { socket, seen, ws } = fakeViewer();
  socket.connect(); // a second dial that never opens
  const hanging = ws();
  socket.checkLiveness(socket.heardAt + LIVENESS.quietMs + LIVENESS.answerMs - 1);
  assert.equal(socket.ws, hanging);
  socket.checkLiveness(socket.heardAt + LIVENESS.quietMs + LIVENESS.answerMs);
  assert.equal(socket.ws, null);
  assert.equal(seen.states.at(-1).name, "reconnecting");
  socket.close();
});

test("a large paste goes out in frames the server takes, in order", () => {
  const { socket, ws } = fakeViewer();
  ws().control({ type: "access", readOnly: false });
  ws().control({ type: "status", state: "running", host: "online" });
  ws().control({ type: "live", offset: 0 });
  const paste = new Uint8Array(3 * 1024 * 1024 + 5).map((_, i) => 97 + (i % 26));
  socket.sendInput(paste);
  const frames = ws().sent;
  assert.ok(frames.every((f) => f.length <= INPUT_FRAME_BYTES), "no frame over the limit");
  assert.equal(frames.length, Math.ceil(paste.byteLength / INPUT_FRAME_BYTES));
  assert.equal(frames.join(""), new TextDecoder().decode(paste), "every byte, in order");
  socket.close();
});
