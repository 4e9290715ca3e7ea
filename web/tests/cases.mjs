// The browser cases of issue 8, one function each; tests/web_browser.rs
// runs every one as its own test (`node tests/run.mjs NAME`).

import {
  askHarness, check, DESKTOP, env, expectEachOnce, newPage, noProblems, openTerminal, PHONE, report, rest, screen,
  screenText, signIn, signInAndSeeHost, startTerminal, typeLine, waitFor, waitForLine, waitLive,
} from "./lib.mjs";

const shot = (name) => `${env.screenshots}/${name}`;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A terminal made through REST on the case's host, in /tmp; returns it. */
async function restTerminal(body) {
  return (await rest("POST", "/terminals", { hostId: env.hostId, dir: "/tmp", ...body })).terminal;
}

/** Waits until `page` holds the grid and the PTY has its grid; returns the state. */
async function holdsTheGrid(page) {
  return waitFor("this viewer to hold the grid at its size", async () => {
    const s = await screen(page);
    return s.holder === true && s.pty?.cols === s.cols && s.pty?.rows === s.rows ? s : null;
  });
}

/** Sign in, see the host online, start a shell, `echo $((6*7))` shows 42; exit shows its code. */
export async function sign_in_echo_and_exit(browser) {
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  check(await page.locator(`.host[data-host="${env.hostId}"] .state`).textContent() === "online", "host shown online");
  await page.screenshot({ path: shot("desktop-lists.png") });
  await startTerminal(page, "");
  await typeLine(page, "echo $((6*7))");
  await waitForLine(page, /^42\s*$/);
  const s = await screen(page);
  check(s.holder === true, `the only viewer holds the grid (${s.holder})`);
  check(s.renderer === "webgl", `desktops draw with WebGL (${s.renderer})`);
  await page.screenshot({ path: shot("desktop.png") });
  await typeLine(page, "exit 3");
  await page.waitForFunction(() => document.querySelector(".status")?.textContent === "exited with code 3");
  check((await screenText(page)).includes("42"), "the final screen is kept after the exit");
  noProblems(page);
  report({ renderer: s.renderer, grid: `${s.cols}x${s.rows}` });
}

/** Resizing the window resizes the PTY: `stty size` shows the new grid. */
export async function resize_window_changes_stty_size(browser) {
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  await startTerminal(page, "sh");
  const seen = [];
  let before = await holdsTheGrid(page);
  for (const viewport of [{ width: 900, height: 560 }, { width: 640, height: 420 }]) {
    await page.setViewportSize(viewport);
    const after = await waitFor("the grid to follow the window", async () => {
      const s = await holdsTheGrid(page);
      return s.cols !== before.cols && s.rows !== before.rows ? s : null;
    });
    // The PTY has the holder's new size: the shell sees it.
    const want = `${after.rows} ${after.cols}`;
    let ok = false;
    for (let i = 0; i < 20 && !ok; i++) {
      await typeLine(page, "stty size");
      await new Promise((r) => setTimeout(r, 500));
      ok = (await screen(page)).lines.some((l) => l.trim() === want);
    }
    check(ok, `stty size never said ${want}:\n${(await screenText(page)).trimEnd()}`);
    before = after;
    seen.push(`${after.cols}x${after.rows}`);
  }
  noProblems(page);
  report({ grids: seen });
}

/** A second viewer sees "held by another viewer"; "take over" moves the grid to it. */
export async function second_viewer_sees_held_bar_and_takes_over(browser) {
  const first = await newPage(browser, DESKTOP);
  await signInAndSeeHost(first);
  const id = await startTerminal(first, "sh");
  await typeLine(first, "echo first-here");
  await waitForLine(first, /^first-here/);
  const a = await screen(first);
  check(a.holder === true, "the first viewer holds the grid");

  const second = await newPage(browser, { viewport: { width: 760, height: 480 } });
  await signIn(second);
  await second.waitForSelector(".home");
  await openTerminal(second, id);
  await second.waitForSelector(".held-bar:not([hidden])");
  const bar = await second.locator(".held-bar").textContent();
  check(bar.includes(`viewing at ${a.cols}×${a.rows}, held by another viewer`), `the bar says ${bar}`);
  check((await screen(second)).cols === a.cols, "the second viewer shows the holder's grid");

  const sizesBefore = (await screen(second)).socket.sizes.length;
  await second.click(".take-over");
  await second.waitForSelector(".held-bar", { state: "hidden" });
  const b = await holdsTheGrid(second);
  check(b.cols !== a.cols, "the grids differ, so the move is visible");
  // The bar floats over the screen: hiding it changes no grid, so the PTY
  // is resized once (the claim's `size`, then the new grid's).
  await sleep(1000);
  const sizes = (await screen(second)).socket.sizes.slice(sizesBefore);
  check(
    sizes.join(" ") === `${a.cols}x${a.rows}* ${b.cols}x${b.rows}*`,
    `the take-over resized the PTY once: ${sizes.join(" ")}`,
  );
  await first.waitForSelector(".held-bar:not([hidden])");
  await typeLine(second, "stty size");
  await waitForLine(second, new RegExp(`^${b.rows} ${b.cols}\\s*$`));
  await first.screenshot({ path: shot("desktop-held-bar.png") });

  // Asked for the cursor position, the program gets one answer, not one per viewer.
  await typeLine(
    second,
    "stty -echo -icanon min 0 time 10; printf '\\033[6n'; sleep 1; " +
      "dd bs=1 count=200 2>/dev/null | od -An -c | tr -d ' \\n' | sed 's/^/answers:/'; echo; stty sane",
  );
  const answers = (await waitForLine(second, /^answers:/)).lines.find((l) => l.startsWith("answers:")).trim();
  check((answers.match(/R/g) || []).length === 1, `one cursor-position answer, got ${answers}`);
  noProblems(first);
  noProblems(second);
  report({ first: `${a.cols}x${a.rows}`, second: `${b.cols}x${b.rows}` });
}

/** The connection drops: the page dials again with ?from=, gets `resume`, and no line is doubled. */
export async function dropped_socket_resumes_without_duplicates(browser) {
  const base = env.balancerUrl;
  const page = await newPage(browser, DESKTOP, base);
  await signInAndSeeHost(page, base);
  await startTerminal(page, "sh");
  await typeLine(page, "for i in 1 2 3; do echo line-$i; done");
  await waitForLine(page, /^line-3/);
  const before = await screen(page);
  await askHarness("cut");
  const after = await waitFor("a reconnect", async () => {
    const s = await screen(page);
    return s.socket.connects >= 2 && s.state === "live" ? s : null;
  });
  check(after.states.join(" ").includes("live reconnecting live"), `the page showed ${after.states.join(" → ")}`);
  check(
    (await page.locator(".status").textContent()) === "live" && (await page.locator(".notice").isHidden()),
    "the reconnecting notice goes away once live",
  );
  const url = after.socket.urls[after.socket.urls.length - 1];
  check(new RegExp(`\\?from=${before.offset}$`).test(url), `redialed ${url}, not ?from=${before.offset}`);
  check(
    after.socket.resumes === 1 && after.socket.replays === before.socket.replays,
    `resumed without a repaint: ${JSON.stringify(after.socket)}`,
  );
  await typeLine(page, "echo after-$((40+2))");
  await waitForLine(page, /^after-42/);
  await expectEachOnce(page, ["line-1", "line-2", "line-3", "after-42"]);
  noProblems(page);
  report({ urls: after.socket.urls });
}

/**
 * A repaint after the first (here the page's own skip ahead, as after
 * output it could not keep up with, or a server 1008) keeps the scrollback
 * and marks where output may be missing, above the repainted screen.
 */
export async function repaint_keeps_the_scrollback(browser) {
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  await startTerminal(page, "sh");
  await typeLine(page, "seq -f 'old-%g' 1 200; echo old-done-$((2+3))");
  await waitForLine(page, /^old-done-5/);
  const before = await screen(page);
  await page.evaluate(() => window.tether.view.socket.resync());
  await waitFor("a second replay, live", async () => {
    const s = await screen(page);
    return s.socket.replays > before.socket.replays && s.state === "live" ? s : null;
  });
  await typeLine(page, "echo new-$((6*7))");
  await waitForLine(page, /^new-42/);
  const lines = (await screen(page)).lines.map((l) => l.trimEnd());
  const mark = "── output skipped; the screen below is repainted ──";
  const first = lines.indexOf("old-1");
  const marks = lines.filter((l) => l === mark).length;
  const at = lines.indexOf(mark);
  const after = lines.findIndex((l) => /^new-42/.test(l));
  check(first >= 0, `the scrollback before the repaint is gone:\n${lines.join("\n").trimEnd()}`);
  check(marks === 1 && first < at && at < after, `one mark between the old output and the new:\n${lines.join("\n").trimEnd()}`);
  check(lines.slice(at + 1).includes("old-done-5"), "the repaint below the mark shows the screen");
  noProblems(page);
  report({ lines: lines.length, markAt: at });
}

/**
 * A connection that silently stops (the balancer freezes it) looks live
 * until the page asks: on becoming visible it pings, hears nothing, drops
 * the socket and resumes from its offset on a new one.
 */
export async function a_frozen_connection_is_dropped_and_resumed(browser) {
  const base = env.balancerUrl;
  const page = await newPage(browser, DESKTOP, base);
  await signInAndSeeHost(page, base);
  await startTerminal(page, "sh");
  await typeLine(page, "echo before-$((2*3))");
  await waitForLine(page, /^before-6/);
  const before = await screen(page);
  await askHarness("stall");
  const asked = Date.now();
  await page.evaluate(() => document.dispatchEvent(new Event("visibilitychange")));
  const after = await waitFor("a redial after no answer", async () => {
    const s = await screen(page);
    return s.socket.connects > before.socket.connects && s.state === "live" ? s : null;
  });
  const waited = Date.now() - asked;
  check(after.socket.unanswered === 1, `the watchdog dropped the socket: ${JSON.stringify(after.socket)}`);
  const url = after.socket.urls.at(-1);
  check(new RegExp(`\\?from=${before.offset}$`).test(url), `redialed ${url}, not ?from=${before.offset}`);
  check(after.states.join(" ").includes("live reconnecting live"), `the page showed ${after.states.join(" → ")}`);
  await typeLine(page, "echo after-$((40+2))");
  await waitForLine(page, /^after-42/);
  await expectEachOnce(page, ["before-6", "after-42"]);
  noProblems(page);
  report({ waitedMs: waited, urls: after.socket.urls });
}

/** On a phone, the held bar is small, in the top right corner: most of the top row shows. */
export async function phone_held_bar_keeps_the_top_row(browser) {
  const first = await newPage(browser, DESKTOP);
  await signInAndSeeHost(first);
  const id = await startTerminal(first, "sh");
  await typeLine(first, "echo first-here");
  await waitForLine(first, /^first-here/);

  const phone = await newPage(browser, PHONE);
  await signIn(phone);
  await phone.waitForSelector(".home");
  await openTerminal(phone, id);
  await phone.waitForSelector(".held-bar:not([hidden])");
  const bar = await phone.locator(".held-bar").boundingBox();
  const area = await phone.locator(".screen").boundingBox();
  check(bar.width <= area.width * 0.7, `the bar is ${bar.width}px of the screen's ${area.width}px`);
  check(bar.x + bar.width <= area.x + area.width, "the bar ends within the screen");
  check(bar.x >= area.x + area.width * 0.3, `the bar sits on the right (x ${bar.x} of ${area.width})`);
  check((await phone.locator(".held-bar").textContent()).includes("held by another viewer"), "the bar says why");
  await phone.screenshot({ path: shot("phone-held.png") });
  await phone.tap(".take-over");
  await phone.waitForSelector(".held-bar", { state: "hidden" });
  noProblems(phone);
  report({ bar, area });
}

/** The phone layout: the key row's Ctrl, then c, interrupts `sleep 100`. */
export async function phone_ctrl_c_interrupts_sleep(browser) {
  const page = await newPage(browser, PHONE);
  await signInAndSeeHost(page);
  const width = await page.evaluate(() => document.documentElement.scrollWidth);
  check(width <= 390, `the lists fit the phone's width (${width}px)`);
  await page.screenshot({ path: shot("phone-lists.png") });
  await startTerminal(page, "sh");
  check(await page.locator(".key-row").isVisible(), "the key row is shown on a phone");
  for (const key of ["Esc", "Tab", "Ctrl", "Alt", "←", "↑", "→", "↓", "|", "~", "/"]) {
    check((await page.locator(`.key-row button[data-key="${key}"]`).count()) === 1, `key ${key} is in the row`);
  }
  const full = await screen(page);
  await page.tap(".screen");
  await page.keyboard.type("sleep 100");
  await page.keyboard.press("Enter");
  await waitForLine(page, /sleep 100/);
  await new Promise((r) => setTimeout(r, 300));
  await page.tap('.key-row button[data-key="Ctrl"]');
  check((await page.locator('.key-row button[data-key="Ctrl"]').getAttribute("aria-pressed")) === "true", "Ctrl latches");
  await page.keyboard.type("c");
  check((await page.locator('.key-row button[data-key="Ctrl"]').getAttribute("aria-pressed")) === "false", "the latch lets go");
  await page.keyboard.type("echo back-$((2+3))");
  await page.keyboard.press("Enter");
  // Within 30 s, so well before the sleep would have ended by itself. The
  // line is typed ahead of sh's next prompt: the tty echoes it at once,
  // and whether sh prints its prompt before or after it runs the line is
  // sh's race, so `back-5` may follow a `# ` on its line. The typed line
  // holds `$((2+3))`, never `back-5`: only the shell's output matches.
  await waitForLine(page, /back-5/, 30000);
  check((await screen(page)).lines.some((l) => l.startsWith("^C")), "the terminal echoed ^C");
  await page.screenshot({ path: shot("phone.png") });
  check((await screen(page)).renderer === "dom", "phones use the DOM renderer");

  // The soft keyboard takes the lower part of the screen: the grid follows.
  await page.setViewportSize({ width: 390, height: 480 });
  const small = await waitFor("fewer rows", async () => {
    const s = await screen(page);
    return s.rows < full.rows ? s : null;
  });
  // Font size control.
  const cols = small.cols;
  await page.tap(".font-up");
  await page.tap(".font-up");
  await waitFor("fewer columns at a larger font", async () => (await screen(page)).cols < cols);
  const manifest = await page.evaluate(async () => {
    const href = document.querySelector('link[rel="manifest"]').href;
    const m = await (await fetch(href)).json();
    const icons = await Promise.all(m.icons.map(async (i) => (await fetch(i.src)).status));
    return { display: m.display, icons };
  });
  check(manifest.display === "fullscreen" && manifest.icons.every((s) => s === 200), `manifest ${JSON.stringify(manifest)}`);
  noProblems(page);
  report({ grid: `${full.cols}x${full.rows}`, keyboardOpen: `${small.cols}x${small.rows}` });
}

/** `seq 1 2000000`: the last line shows up, the tab stays responsive, the heap stays bounded. */
export async function seq_two_million_bounded(browser) {
  const HEAP_BOUND = env.heapBoundBytes;
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  await startTerminal(page, "sh");
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("HeapProfiler.enable");
  await cdp.send("HeapProfiler.collectGarbage");
  const baseline = (await cdp.send("Runtime.getHeapUsage")).usedSize;
  await typeLine(page, "seq 1 2000000; echo seq-done-$((3*3))");
  let peak = 0;
  let slowest = 0;
  const started = Date.now();
  let done = null;
  while (!done) {
    check(Date.now() - started < 180000, "seq did not finish within 180 s");
    const t0 = Date.now();
    const s = await page.evaluate(() => {
      const v = window.tether.view.debugState();
      return { tail: v.lines.slice(-40), heldBytes: v.heldBytes, overflows: v.overflows, peak: v.peakHeldBytes };
    });
    slowest = Math.max(slowest, Date.now() - t0);
    peak = Math.max(peak, (await cdp.send("Runtime.getHeapUsage")).usedSize);
    if (s.tail.some((l) => /^seq-done-9/.test(l))) done = s;
    else await new Promise((r) => setTimeout(r, 200));
  }
  const tail = done.tail.map((l) => l.trimEnd());
  const last = tail.lastIndexOf("2000000");
  check(last >= 1 && tail[last - 1] === "1999999", `the last lines are right:\n${tail.join("\n")}`);
  await cdp.send("HeapProfiler.collectGarbage");
  const settled = (await cdp.send("Runtime.getHeapUsage")).usedSize;
  check(peak < HEAP_BOUND, `JS heap peaked at ${peak} bytes, over the bound ${HEAP_BOUND}`);
  check(done.peak <= env.pageBufferBoundBytes, `the page held ${done.peak} bytes of output at once`);
  check(slowest < 5000, `the tab answered a script call only after ${slowest} ms`);
  noProblems(page);
  report({
    seconds: (Date.now() - started) / 1000,
    heapBaseline: baseline,
    heapPeak: peak,
    heapAfterGc: settled,
    heapBound: HEAP_BOUND,
    pageBufferPeakBytes: done.peak,
    skippedAhead: done.overflows,
    slowestEvaluateMs: slowest,
  });
}

/** A wrong token gets a clear message and is not kept; sign out forgets the right one. */
export async function bad_token_and_sign_out(browser) {
  const page = await newPage(browser, DESKTOP);
  await signIn(page, "tth_" + "x".repeat(43));
  await page.waitForFunction(() => /not accepted/.test(document.querySelector(".signin-message")?.textContent || ""));
  check((await page.evaluate(() => localStorage.getItem("tether.token"))) === null, "a refused token is not kept");
  await signInAndSeeHost(page);
  check((await page.evaluate(() => localStorage.getItem("tether.token"))) === env.token, "the token is kept");
  // A terminal that does not exist: 4404, a message, and no retry.
  await page.goto(`${env.url}/#/t/00000000-0000-4000-8000-000000000000`);
  await page.waitForFunction(() => document.querySelector(".notice")?.textContent === "There is no such terminal.");
  await new Promise((r) => setTimeout(r, 2000));
  const s = await screen(page);
  check(s.state === "ended" && s.socket.connects === 1, `no retry after 4404: ${JSON.stringify(s.socket)}`);
  await page.goto(`${env.url}/`);
  await page.click(".sign-out");
  await page.waitForSelector("form.signin");
  check((await page.evaluate(() => localStorage.getItem("tether.token"))) === null, "sign out forgets the token");
  noProblems(page);
  report({});
}

/** Runs: the list with state and exit code, and the log. */
export async function runs_list_and_log(browser) {
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  const row = page.locator(`tr.run[data-run="${env.runId}"]`);
  await row.waitFor();
  await waitFor("the run to finish", async () => (await row.locator(".state").textContent()) === "failed");
  check((await row.locator("td").nth(3).textContent()) === "4", "the exit code is listed");
  await row.locator("a").click();
  await page.waitForFunction(() => /exit code 4/.test(document.querySelector(".run-summary")?.textContent || ""));
  await waitForLine(page, /^run-output-25/);
  noProblems(page);
  report({});
}

/** A holder whose tab is hidden is not in use: a newcomer's view takes the grid without "take over". */
export async function hidden_holder_yields_the_grid(browser) {
  const first = await newPage(browser, DESKTOP);
  await signInAndSeeHost(first);
  const id = await startTerminal(first, "sh");
  await typeLine(first, "echo typed");
  await waitForLine(first, /^typed/);
  check((await screen(first)).holder === true, "the first viewer holds the grid");
  // What the Page Visibility API reports when the user switches tabs.
  await first.evaluate(() => {
    Object.defineProperty(document, "visibilityState", { configurable: true, get: () => "hidden" });
    Object.defineProperty(document, "hidden", { configurable: true, get: () => true });
    document.dispatchEvent(new Event("visibilitychange"));
  });
  const second = await newPage(browser, { viewport: { width: 760, height: 480 } });
  await signIn(second);
  await second.waitForSelector(".home");
  await openTerminal(second, id);
  const b = await holdsTheGrid(second);
  check(await second.locator(".held-bar").isHidden(), "no held bar for the new holder");
  await first.waitForSelector(".held-bar:not([hidden])");
  await typeLine(second, "stty size");
  await waitForLine(second, new RegExp(`^${b.rows} ${b.cols}\\s*$`));
  noProblems(first);
  noProblems(second);
  report({ second: `${b.cols}x${b.rows}` });
}

/** The host moves to another instance: the viewer is closed 4503, redials at once and continues. */
export async function host_moved_redials_at_once(browser) {
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  await startTerminal(page, "sh");
  await typeLine(page, "echo before-$((2+3))");
  await waitForLine(page, /^before-5/);
  const before = await screen(page);
  await askHarness("move");
  const after = await waitFor("a redial after 4503", async () => {
    const s = await screen(page);
    return s.socket.closes.includes(4503) && s.socket.connects >= 2 && s.state === "live" ? s : null;
  }, 30000);
  await typeLine(page, "echo after-$((3+4))");
  await waitForLine(page, /^after-7/);
  await expectEachOnce(page, ["before-5", "after-7"]);
  check(after.socket.urls[1].includes(`?from=${before.offset}`), `redialed ${after.socket.urls[1]}`);
  noProblems(page);
  report({ socket: after.socket });
}

/**
 * A share token opens its terminal's address: it signs in there, the page
 * says "read-only" as soon as the terminal shows (before anyone types), and
 * what is typed on it reaches nothing while the owner's typing shows up.
 */
export async function share_token_watches_read_only(browser) {
  const owner = await newPage(browser, DESKTOP);
  await signIn(owner);
  await owner.waitForSelector(".home");
  await openTerminal(owner, env.terminalId);

  const guest = await newPage(browser, { viewport: { width: 900, height: 560 } });
  // Every control message the guest's page sends: none may be a `view` or
  // a `resize` (one sent before `access` came used to be refused).
  const guestSent = [];
  guest.on("websocket", (ws) => ws.on("framesent", (f) => typeof f.payload === "string" && guestSent.push(f.payload)));
  await guest.goto(`${env.url}/#/t/${env.terminalId}`);
  await guest.fill("#token", env.shareToken);
  await guest.click("form.signin button[type=submit]");
  await waitLive(guest);
  const live = await screen(guest);
  check(live.readOnly === true && live.readOnlyShown === true, `read-only shown once live: ${JSON.stringify({ ...live, lines: undefined })}`);
  const bar = await guest.locator(".read-only-bar").textContent();
  check(/read-only/i.test(bar), `the bar says ${bar}`);
  check((await guest.locator(".read-only-badge").textContent()) === "read-only", "the header says read-only");

  await typeLine(owner, "echo owner-$((6*7))");
  await waitForLine(owner, /^owner-42/);
  await waitForLine(guest, /^owner-42/);
  await guest.screenshot({ path: shot("desktop-read-only.png") });
  await guest.click(".screen");
  await guest.keyboard.type("echo typed-by-guest");
  await guest.keyboard.press("Enter");
  await typeLine(owner, "echo after-$((2*3))");
  await waitForLine(owner, /^after-6/);
  await waitForLine(guest, /^after-6/);
  check(!(await screenText(owner)).includes("typed-by-guest"), "the guest's keys reached the shell");
  const after = await screen(guest);
  check(after.holder === false, `the guest never holds the grid (${after.holder})`);
  check(await guest.locator(".held-bar").isHidden(), "no take-over bar for a read-only viewer");
  check(await guest.locator(".notice").isHidden(), "no refusal notices: the page sent nothing to refuse");
  const controls = guestSent.filter((m) => /"type":"(view|resize)"/.test(m));
  check(controls.length === 0, `a read-only page sent ${controls.join(", ")}`);
  noProblems(owner);
  noProblems(guest);
  report({ guestGrid: `${after.cols}x${after.rows}` });
}

/**
 * A terminal that fails to start: the server sends `status: error`, the
 * reason and close 1000. The page shows the reason and stops: no redial.
 */
export async function failed_start_shows_error_and_stops(browser) {
  const t = await restTerminal({ argv: ["/nonexistent/cmd-xyz"] });
  const page = await newPage(browser, DESKTOP);
  await signIn(page);
  await page.waitForSelector(".home");
  await page.goto(`${env.url}/#/t/${t.id}`);
  await page.waitForFunction(() => document.querySelector(".status")?.textContent === "failed to start");
  const notice = await page.locator(".notice").textContent();
  check(/^The terminal could not start: .*cmd-xyz/.test(notice), `the notice says ${notice}`);
  await sleep(3000);
  const s = await screen(page);
  check(s.state === "ended" && s.socket.connects === 1, `no redial after close 1000: ${JSON.stringify(s.socket)}`);
  check((await page.locator(".notice").textContent()) === notice, "the reason stays on screen");
  check(await page.locator(".held-bar").isHidden(), "no take-over bar on a terminal that is over");
  await page.screenshot({ path: shot("desktop-failed-start.png") });
  noProblems(page);
  report({ notice, closes: s.socket.closes });
}

/** The Start form's error stays until the user changes something, across list refreshes. */
export async function start_error_stays_until_the_user_acts(browser) {
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  await page.waitForSelector('#start-dir option[value="/tmp"]', { state: "attached" });
  // A dir the host does not allow (as when the host's list changed since the page read it).
  await page.evaluate(() => document.querySelector("#start-dir").append(new Option("/etc", "/etc", true, true)));
  await page.click("form.start button[type=submit]");
  const problem = page.locator(".start-problem");
  await problem.waitFor();
  const text = await problem.textContent();
  check(/^Could not start the terminal: .*\/etc/.test(text), `the form says ${text}`);
  await sleep(3 * 3000 + 500); // three list refreshes
  check(await problem.isVisible(), "the error is still shown after the list refreshed");
  check((await problem.textContent()) === text, "and says the same");
  await page.fill("#start-command", "sh");
  check(await problem.isHidden(), "the error goes once the user changes the form");
  noProblems(page);
  report({ text });
}

/** A list refresh changes only what changed: a selection in the list survives it. */
export async function lists_refresh_in_place(browser) {
  const t = await restTerminal({ argv: ["sh"], title: "keep-me-selected" });
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  const link = page.locator(`tr[data-terminal="${t.id}"] a`);
  await link.waitFor();
  await page.evaluate((id) => {
    const a = document.querySelector(`tr[data-terminal="${id}"] a`);
    a.closest("tr").marked = "yes"; // gone if the row is rebuilt (a property: not in the HTML)
    getSelection().selectAllChildren(a);
  }, t.id);
  const requests = [];
  page.on("request", (r) => r.url().includes("/api/v1/") && requests.push(new URL(r.url()).pathname));
  await sleep(2 * 3000 + 500);
  const after = await page.evaluate((id) => ({
    selection: getSelection().toString(),
    marked: document.querySelector(`tr[data-terminal="${id}"]`)?.marked ?? null,
  }), t.id);
  check(after.selection === "keep-me-selected", `the selection is ${JSON.stringify(after.selection)}`);
  check(after.marked === "yes", "the row was rebuilt");
  check(requests.filter((p) => p === "/api/v1/terminals").length >= 2, `the list refreshed: ${requests}`);
  noProblems(page);
  report({ requests: requests.length });
}

/**
 * A terminal on a host that is offline waits (`pending`): the header says
 * so, and why, instead of "connecting" forever.
 */
export async function pending_terminal_says_why(browser) {
  const { host } = await rest("POST", "/hosts", { hostname: "nowhere", name: "nowhere" });
  const t = (await rest("POST", "/terminals", { hostId: host.id, argv: ["sh"] })).terminal;
  check(t.state === "pending", `a terminal on an offline host is ${t.state}`);
  const page = await newPage(browser, DESKTOP);
  await signIn(page);
  await page.waitForSelector(".home");
  await page.goto(`${env.url}/#/t/${t.id}`);
  await page.waitForFunction(() => document.querySelector(".status")?.textContent === "pending");
  const notice = await page.locator(".notice").textContent();
  check(/not started yet: it starts when its host comes online/.test(notice), `the notice says ${notice}`);
  noProblems(page);
  report({ notice });
}

/**
 * Keys typed while the page is reconnecting are held and sent once the
 * stream is back, and the notice says so meanwhile.
 */
export async function keys_typed_while_reconnecting_are_sent(browser) {
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  await startTerminal(page, "sh");
  // Drop the socket and keep the page from redialing until the keys are typed.
  await page.evaluate(() => {
    const socket = window.tether.view.socket;
    socket.realConnect = socket.connect;
    socket.connect = () => {};
    socket.ws.close(4000, "test: drop");
  });
  await waitFor("the page to notice the drop", async () => (await screen(page)).state === "reconnecting");
  await page.click(".screen");
  await page.keyboard.type("echo typed-$((20+1))");
  await page.keyboard.press("Enter");
  const held = await page.locator(".notice").textContent();
  check(/What you type is held/.test(held), `the notice says ${held}`);
  await page.evaluate(() => {
    const socket = window.tether.view.socket;
    socket.connect = socket.realConnect;
    socket.connect();
  });
  await waitForLine(page, /^typed-21/);
  const s = await screen(page);
  check(s.socket.heldSent > 0 && s.notice === null, `sent what was held: ${JSON.stringify(s.socket)} notice ${s.notice}`);
  noProblems(page);
  report({ held, heldSent: s.socket.heldSent });
}

/** The holder leaves: the other (visible) viewer takes the grid at once, not at its next periodic view. */
export async function holder_leaving_hands_the_grid_over(browser) {
  const first = await newPage(browser, DESKTOP);
  await signInAndSeeHost(first);
  const id = await startTerminal(first, "sh");
  const a = await holdsTheGrid(first);
  const second = await newPage(browser, { viewport: { width: 760, height: 480 } });
  await signIn(second);
  await second.waitForSelector(".home");
  await openTerminal(second, id);
  await second.waitForSelector(".held-bar:not([hidden])");
  await first.close();
  const started = Date.now();
  const b = await waitFor("the second viewer to take the free grid within 5 s", async () => {
    const s = await screen(second);
    return s.holder === true && s.pty?.cols === s.cols && s.pty?.rows === s.rows ? s : null;
  }, 5000);
  const ms = Date.now() - started;
  check(b.cols !== a.cols && (await second.locator(".held-bar").isHidden()), "the second viewer holds it at its size");
  noProblems(second);
  report({ ms, grid: `${b.cols}x${b.rows}` });
}

/** On a phone, a finger drag on the terminal scrolls back through the output. */
export async function phone_touch_scrolls_back(browser) {
  const page = await newPage(browser, PHONE);
  await signInAndSeeHost(page);
  await startTerminal(page, "sh");
  await page.tap(".screen");
  await page.keyboard.type("seq 1 300");
  await page.keyboard.press("Enter");
  await waitForLine(page, /^300\s*$/);
  const before = (await screen(page)).viewportY;
  const box = await page.locator(".screen").boundingBox();
  const x = box.x + box.width / 2;
  const y = box.y + box.height / 3;
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Input.dispatchTouchEvent", { type: "touchStart", touchPoints: [{ x, y }] });
  for (let i = 1; i <= 10; i++) {
    await cdp.send("Input.dispatchTouchEvent", { type: "touchMove", touchPoints: [{ x, y: y + 30 * i }] });
  }
  await cdp.send("Input.dispatchTouchEvent", { type: "touchEnd", touchPoints: [] });
  const after = await waitFor("the scrollback to move", async () => {
    const s = await screen(page);
    return s.viewportY < before ? s : null;
  }, 5000);
  // The key row: Ctrl latched, then ← goes out as Ctrl+← (cat -v shows it).
  await page.tap(".screen");
  await page.keyboard.type("cat -v");
  await page.keyboard.press("Enter");
  await sleep(300);
  await page.tap('.key-row button[data-key="Ctrl"]');
  await page.tap('.key-row button[data-key="←"]');
  await page.tap('.key-row button[data-key="Alt"]');
  await page.tap('.key-row button[data-key="→"]');
  await page.keyboard.press("Enter");
  await waitForLine(page, /^\^\[\[1;5D\^\[\[1;3C\s*$/);
  noProblems(page);
  report({ before, after: after.viewportY });
}

/** Read-only tokens get no Start form; a share token's home says what it can do, not "Could not refresh". */
export async function read_and_share_tokens_home(browser) {
  const { secret: readToken } = await rest("POST", "/tokens", { scope: "read", name: "reader" });
  const reader = await newPage(browser, DESKTOP);
  await signIn(reader, readToken);
  await reader.waitForSelector(`.host[data-host="${env.hostId}"]`);
  await reader.waitForSelector(".read-only-note:not([hidden])");
  check(await reader.locator(".start-section").isHidden(), "no Start form for a read token");

  const t = await restTerminal({ argv: ["sh"] });
  const { secret: shareToken } = await rest("POST", "/tokens", { terminalId: t.id });
  const guest = await newPage(browser, DESKTOP);
  await guest.goto(`${env.url}/#/t/${t.id}`);
  await guest.fill("#token", shareToken);
  await guest.click("form.signin button[type=submit]");
  await waitLive(guest);
  await guest.click(".back");
  await guest.waitForSelector(".share-note");
  check(await guest.locator(".problem:visible").count() === 0, "no \"Could not refresh\"");
  check(await guest.locator("form.start").count() === 0, "no Start form for a share token");
  await guest.click(`.share-note a[href="#/t/${t.id}"]`);
  await waitLive(guest);
  noProblems(reader);
  noProblems(guest);
  report({});
}

/** On a phone, long host names and titles stay within the screen's width. */
export async function phone_lists_fit_long_names(browser) {
  await rest("POST", "/hosts", { hostname: "far_away_machine_with_a_very_long_hostname.example.internal", name: "a_host_name_that_goes_on_and_on_and_on_and_on_and_on_and_on" });
  const t = await restTerminal({ argv: ["sh"], title: "a_terminal_title_that_goes_on_and_on_and_on_and_on_and_on_and_on" });
  const page = await newPage(browser, PHONE);
  await signInAndSeeHost(page);
  await page.waitForSelector("tr.terminal");
  const width = await page.evaluate(() => document.querySelector(".home").scrollWidth);
  await page.screenshot({ path: shot("phone-long-names.png") });
  check(width <= 390, `the lists are ${width}px wide on a 390px screen`);
  // With Kill's confirmation open too.
  await page.tap(`tr[data-terminal="${t.id}"] button[data-action="kill"]`);
  await page.waitForSelector(`tr.row-confirm[data-for="${t.id}"]`);
  const asking = await page.evaluate(() => document.querySelector(".home").scrollWidth);
  await page.screenshot({ path: shot("phone-kill-confirm.png") });
  check(asking <= 390, `the lists are ${asking}px wide with a confirmation open`);
  noProblems(page);
  report({ width, asking });
}

/**
 * Two visible pages whose users are both idle: each page's `view` may move
 * the grid (an idle holder is not in use), but losing it never makes a
 * page ask back at once, so the grid does not bounce between them.
 */
export async function idle_viewers_do_not_bounce_the_grid(browser) {
  const t = await restTerminal({ argv: ["sh"] });
  const pages = [];
  for (const viewport of [{ width: 1100, height: 720 }, { width: 760, height: 480 }]) {
    const page = await newPage(browser, { viewport });
    await signIn(page);
    await page.waitForSelector(".home");
    await openTerminal(page, t.id);
    // As if nobody had typed here for two minutes (the server's in-use limit is 60 s).
    await page.evaluate(() => (window.tether.view.lastKeyAt = Date.now() - 120000));
    pages.push(page);
  }
  for (const page of pages) await page.evaluate(() => window.tether.view.sendView());
  await sleep(3000);
  const sizes = await Promise.all(pages.map(async (p) => (await screen(p)).socket.sizes));
  check(sizes.every((s) => s.length <= 8), `the grid bounced: ${JSON.stringify(sizes)}`);
  for (const page of pages) noProblems(page);
  report({ sizes });
}

/** Polls the terminal's REST resource until it is in `state`; returns it. */
async function terminalInState(id, state) {
  return waitFor(`terminal ${id} to be ${state}`, async () => {
    const { terminal } = await rest("GET", `/terminals/${id}`);
    return terminal.state === state ? terminal : null;
  });
}

/**
 * The list's Kill (running terminals) and Delete (ended ones), each after
 * an in-page confirmation that survives the list's refresh; the list
 * changes in place (another row is never rebuilt, a selection in it
 * stays). A read token is offered neither.
 */
export async function kill_and_delete_from_the_list(browser) {
  const doomed = await restTerminal({ argv: ["sh"], title: "kill-me" });
  const kept = await restTerminal({ argv: ["sh"], title: "keep-me-selected" });
  await terminalInState(doomed.id, "running");
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  const row = page.locator(`tr[data-terminal="${doomed.id}"]`);
  const kill = row.locator('button[data-action="kill"]');
  await kill.waitFor();
  check((await row.locator('button[data-action="delete"]').count()) === 0, "no Delete while it runs");
  await page.evaluate((id) => (document.querySelector(`tr[data-terminal="${id}"]`).marked = "yes"), kept.id);

  // Asked first; the question stays across a refresh; Cancel does nothing.
  await kill.click();
  const confirm = page.locator(`tr.row-confirm[data-for="${doomed.id}"]`);
  await confirm.waitFor();
  const question = await confirm.textContent();
  check(/Kill this terminal\?/.test(question), `the confirmation says ${question}`);
  await page.screenshot({ path: shot("desktop-kill-confirm.png") });
  await sleep(3000 + 500);
  check(await confirm.isVisible(), "the confirmation went away with a list refresh");
  await confirm.locator('button[data-action="cancel"]').click();
  await confirm.waitFor({ state: "detached" });
  check((await rest("GET", `/terminals/${doomed.id}`)).terminal.state === "running", "Cancel killed the terminal");

  // Kill, confirmed: SIGHUP by default; the row says so and offers Delete.
  await kill.click();
  await confirm.locator('button[data-action="confirm"]').click();
  await waitFor("the row to say how it ended", async () => (await row.locator(".state").textContent()) === "killed (SIGHUP)");
  const ended = (await rest("GET", `/terminals/${doomed.id}`)).terminal;
  check(ended.state === "exited" && ended.exitSignal === 1, `killed with ${JSON.stringify(ended)}`);
  const remove = row.locator('button[data-action="delete"]');
  await remove.waitFor();
  check((await kill.count()) === 0, "no Kill once it ended");

  // Delete, confirmed: the row goes at once, and stays gone.
  await remove.click();
  await confirm.waitFor();
  check(/Delete this terminal/.test(await confirm.textContent()), "the delete confirmation");
  await confirm.locator('button[data-action="confirm"]').click();
  await row.waitFor({ state: "detached", timeout: 2000 });
  const gone = await fetch(`${env.url}/api/v1/terminals/${doomed.id}`, { headers: { Authorization: `Bearer ${env.token}` } });
  check(gone.status === 404, `the server still has it: ${gone.status}`);

  // The other row was never rebuilt, and a selection in it survives refreshes.
  await page.evaluate((id) => getSelection().selectAllChildren(document.querySelector(`tr[data-terminal="${id}"] a`)), kept.id);
  await sleep(3000 + 500);
  check((await row.count()) === 0, "the deleted terminal came back");
  const after = await page.evaluate((id) => ({
    selection: getSelection().toString(),
    marked: document.querySelector(`tr[data-terminal="${id}"]`)?.marked ?? null,
  }), kept.id);
  check(after.marked === "yes", "the other terminal's row was rebuilt");
  check(after.selection === "keep-me-selected", `the selection is ${JSON.stringify(after.selection)}`);

  // A read token watches: no Kill, no Delete.
  const { secret: readToken } = await rest("POST", "/tokens", { scope: "read", name: "reader" });
  const reader = await newPage(browser, DESKTOP);
  await signIn(reader, readToken);
  await reader.waitForSelector(`tr[data-terminal="${kept.id}"]`);
  await reader.waitForSelector(".read-only-note:not([hidden])");
  await sleep(500);
  check((await reader.locator("button[data-action]").count()) === 0, "a read token is offered Kill or Delete");
  noProblems(page);
  noProblems(reader);
  report({});
}

/**
 * The server refuses a kill (here the host went away: 409 host_offline):
 * the page shows the server's reason under the row, across refreshes,
 * until the user dismisses it; the row stays.
 */
export async function kill_refused_shows_the_server_error(browser) {
  const t = await restTerminal({ argv: ["sh"], title: "host-goes-away" });
  await terminalInState(t.id, "running");
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  const row = page.locator(`tr[data-terminal="${t.id}"]`);
  await row.locator('button[data-action="kill"]').waitFor();
  await askHarness("stop-daemon");
  await page.waitForSelector(`.host.offline[data-host="${env.hostId}"]`);
  await row.locator('button[data-action="kill"]').click();
  await page.locator(`tr.row-confirm[data-for="${t.id}"] button[data-action="confirm"]`).click();
  const problem = page.locator(`tr.row-problem[data-for="${t.id}"]`);
  await problem.waitFor();
  const text = await problem.locator("[role=alert]").textContent();
  check(/^Could not kill the terminal: the host is offline/.test(text), `the page says ${text}`);
  await sleep(3000 + 500);
  check(await problem.isVisible(), "the reason went away with a list refresh");
  check((await row.locator('button[data-action="kill"]').count()) === 1, "the row still offers Kill");
  await problem.locator('button[data-action="dismiss"]').click();
  await problem.waitFor({ state: "detached" });
  noProblems(page);
  report({ text });
}

/** Waits until the terminal view's header status is `text`; on timeout, says what it was. */
async function statusSays(page, text) {
  let last = null;
  await waitFor(`the status "${text}"`, async () => (last = await page.locator(".status").textContent()) === text).catch((e) => {
    throw new Error(`${e.message}; it says ${JSON.stringify(last)}`);
  });
}

/**
 * A terminal ended by a signal: the header names it ("killed by SIGHUP"),
 * read from the REST resource since the socket's `exit` carries only a
 * code; for a terminal opened after it was killed too.
 */
export async function killed_terminal_header_names_the_signal(browser) {
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  const id = await startTerminal(page, "sh");
  await rest("POST", `/terminals/${id}/kill`);
  await statusSays(page, "killed by SIGHUP");

  const t = await restTerminal({ argv: ["sh"] });
  await terminalInState(t.id, "running");
  await rest("POST", `/terminals/${t.id}/kill`, { signal: "KILL" });
  await terminalInState(t.id, "exited");
  await page.goto(`${env.url}/#/t/${t.id}`);
  await statusSays(page, "killed by SIGKILL");
  noProblems(page);
  report({});
}

/**
 * A− and A+ change the font and leave the focus on the terminal: keys
 * typed next reach the shell, and a space does not press A+ again.
 */
export async function font_buttons_leave_the_keys_to_the_terminal(browser) {
  const page = await newPage(browser, DESKTOP);
  await signInAndSeeHost(page);
  await startTerminal(page, "sh");
  await page.click(".screen");
  const before = await page.evaluate(() => window.tether.view.term.options.fontSize);
  await page.click(".font-up");
  await page.keyboard.type("echo after-$((40+2)) ");
  await page.keyboard.press("Enter");
  await waitForLine(page, /^after-42/);
  const after = await page.evaluate(() => window.tether.view.term.options.fontSize);
  check(after === before + 1, `one click, one step: ${before} -> ${after}`);
  const focused = await page.evaluate(() => document.activeElement?.className ?? "");
  check(!focused.includes("font-up"), `the focus stayed off the button (${focused})`);
  noProblems(page);
  report({ before, after });
}

/**
 * A viewer whose screen is smaller than the grid another viewer holds
 * keeps the cursor in view: its screen box scrolls to where output goes.
 */
export async function a_larger_held_grid_keeps_the_cursor_in_view(browser) {
  const first = await newPage(browser, DESKTOP);
  await signInAndSeeHost(first);
  const id = await startTerminal(first, "sh");
  const big = await holdsTheGrid(first);

  const small = await newPage(browser, { viewport: { width: 520, height: 320 } });
  await signIn(small);
  await small.waitForSelector(".home");
  await openTerminal(small, id);
  await small.waitForSelector(".held-bar:not([hidden])");
  await waitFor("the holder's grid on the small page", async () => {
    const s = await screen(small);
    return s.cols === big.cols && s.rows === big.rows ? s : null;
  });
  await typeLine(first, `seq 1 ${big.rows * 2}; echo end-$((6*7))`);
  await waitForLine(small, /^end-42/);
  const s = await waitFor("the cursor in view on the small page", async () => {
    const state = await screen(small);
    return state.cursorShown ? state : null;
  });
  const scrolled = await small.evaluate(() => document.querySelector(".screen").scrollTop);
  check(scrolled > 0, `the screen box scrolled down to the cursor (${scrolled}px)`);
  await small.screenshot({ path: shot("small-viewer-follows-cursor.png") });
  noProblems(small);
  report({ grid: `${s.cols}x${s.rows}`, scrolled });
}
