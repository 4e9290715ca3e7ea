// Helpers for the browser tests (tests/web_browser.rs runs them): a real
// Chromium (Debian's /usr/bin/chromium) driven by playwright-core, against
// the real `tether serve` and `tether daemon` that the Rust harness
// started. The harness passes what a case needs as JSON in TETHER_WEB_TEST.
//
// The screen is read from xterm.js's buffer (window.tether.screen()), never
// from pixels.

import { chromium } from "playwright-core";
import { createInterface } from "node:readline";

export const env = JSON.parse(process.env.TETHER_WEB_TEST || "{}");
export const CHROMIUM = process.env.TETHER_CHROMIUM || "/usr/bin/chromium";
const WAIT_MS = 20000;

export function check(condition, message) {
  if (!condition) throw new Error(message);
}

export async function launch() {
  return chromium.launch({
    executablePath: CHROMIUM,
    // As root (scripts/test in CI) Chromium's sandbox cannot start.
    chromiumSandbox: false,
    args: ["--disable-dev-shm-usage"],
  });
}

export const DESKTOP = { viewport: { width: 1100, height: 720 } };
export const PHONE = {
  viewport: { width: 390, height: 844 },
  deviceScaleFactor: 3,
  isMobile: true,
  hasTouch: true,
  userAgent:
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Mobile Safari/537.36",
};

/**
 * A page in a new browser context. Fails the case on a page error or a
 * Content-Security-Policy violation, and on any request to another origin.
 */
export async function newPage(browser, options = DESKTOP, base = env.url) {
  const context = await browser.newContext(options);
  const page = await context.newPage();
  const origin = new URL(base).origin;
  page.problems = [];
  page.on("pageerror", (e) => page.problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error" && !/WebSocket|Failed to load resource/.test(m.text())) page.problems.push(`console: ${m.text()}`);
    if (/Content Security Policy/i.test(m.text())) page.problems.push(`CSP: ${m.text()}`);
  });
  page.on("websocket", (ws) => {
    if (env.token && ws.url().includes(env.token)) page.problems.push(`token in a WebSocket URL: ${ws.url()}`);
  });
  page.on("request", (r) => {
    if (env.token && r.url().includes(env.token)) page.problems.push(`token in a URL: ${r.url()}`);
    const url = new URL(r.url());
    if (!["data:", "blob:"].includes(url.protocol) && url.origin !== origin && url.origin.replace(/^ws/, "http") !== origin) {
      page.problems.push(`third-party request: ${r.url()}`);
    }
  });
  return page;
}

export function noProblems(page) {
  check(page.problems.length === 0, `the page had problems:\n${page.problems.join("\n")}`);
}

export async function waitFor(what, fn, timeout = WAIT_MS) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    last = await fn();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export async function signIn(page, token = env.token, base = env.url) {
  await page.goto(base + "/");
  await page.fill("#token", token);
  await page.click("form.signin button[type=submit]");
}

export async function signInAndSeeHost(page, base = env.url) {
  await signIn(page, env.token, base);
  await page.waitForSelector(`.host.online[data-host="${env.hostId}"]`, { timeout: WAIT_MS });
}

/** Starts a terminal with the page's form; resolves to its id once live. */
export async function startTerminal(page, command = "") {
  await page.waitForSelector(`#start-host option[value="${env.hostId}"]`, { state: "attached" });
  await page.selectOption("#start-host", env.hostId);
  await page.waitForSelector('#start-dir option[value="/tmp"]', { state: "attached" });
  await page.selectOption("#start-dir", "/tmp");
  await page.fill("#start-command", command);
  await page.click("form.start button[type=submit]");
  await page.waitForFunction(() => /^#\/t\//.test(location.hash));
  const id = await page.evaluate(() => location.hash.slice("#/t/".length));
  await waitLive(page);
  // The shell's prompt, so what the case types is not echoed ahead of it.
  await waitForLine(page, /[$#>]\s*$/);
  return id;
}

/** Opens an existing terminal's view. */
export async function openTerminal(page, id, base = env.url) {
  await page.goto(`${base}/#/t/${id}`);
  await waitLive(page);
}

export async function waitLive(page) {
  try {
    await page.waitForFunction(() => window.tether?.screen()?.state === "live", null, { timeout: WAIT_MS });
  } catch (e) {
    const s = await page.evaluate(() => window.tether?.screen() ?? null);
    const notice = await page.evaluate(() => document.querySelector(".notice")?.textContent ?? "");
    throw new Error(`not live: ${JSON.stringify(s && { ...s, lines: undefined })} notice ${JSON.stringify(notice)}; ${page.url()}`);
  }
}

export async function screen(page) {
  return page.evaluate(() => window.tether.screen());
}

export async function screenText(page) {
  return (await screen(page)).lines.join("\n");
}

/** Waits until some line of the buffer matches `pattern`; returns the state. */
export async function waitForLine(page, pattern, timeout = WAIT_MS) {
  return waitFor(
    `a line matching ${pattern}`,
    async () => {
      const s = await screen(page);
      return s.lines.some((l) => pattern.test(l)) ? s : null;
    },
    timeout,
  ).catch(async (e) => {
    throw new Error(`${e.message}; the screen:\n${(await screenText(page)).trimEnd()}`);
  });
}

/** Each of `lines` is exactly one line of the buffer: nothing lost, nothing doubled. */
export async function expectEachOnce(page, lines) {
  const have = (await screen(page)).lines.map((l) => l.trimEnd());
  for (const want of lines) {
    const n = have.filter((l) => l === want).length;
    check(n === 1, `"${want}" is on the screen ${n} times:\n${have.join("\n").trimEnd()}`);
  }
}

export async function typeLine(page, text) {
  await page.click(".screen");
  await page.keyboard.type(text);
  await page.keyboard.press("Enter");
}

/** A REST call to the server (as the case's setup, not as the page): the parsed JSON body, or throws. */
export async function rest(method, path, body, token = env.token) {
  const res = await fetch(`${env.url}/api/v1${path}`, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  check(res.ok, `${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

/** Asks the Rust side to do `what` (e.g. cut the connections) and waits until it did. */
let lines;
export async function askHarness(what) {
  lines ??= createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  process.stdout.write(`@${what}\n`);
  const { value } = await lines.next();
  check(value === `done ${what}`, `the harness answered ${value}`);
}

export function report(values) {
  process.stdout.write(`result ${JSON.stringify(values)}\n`);
}
