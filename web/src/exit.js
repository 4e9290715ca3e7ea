// How a terminal ended, in words: "exited with code 3", "killed by
// SIGHUP". The viewer socket's `exit` message carries only the exit code
// (null when a signal ended the process, docs/PROTOCOL.md); the REST
// terminal resource has both `exitCode` and `exitSignal` (docs/REST.md,
// "Terminal"), so the view asks it when the socket's message says no more.

/**
 * Signal numbers that mean the same signal on Linux, macOS and the BSDs
 * (POSIX leaves the numbers open; these are the historical ones every
 * platform kept). Others differ between platforms (10 is SIGUSR1 on Linux,
 * SIGBUS on macOS), and the page does not know the host's numbering, so
 * they are shown as numbers.
 */
const SIGNAL_NAMES = {
  1: "SIGHUP",
  2: "SIGINT",
  3: "SIGQUIT",
  4: "SIGILL",
  5: "SIGTRAP",
  6: "SIGABRT",
  8: "SIGFPE",
  9: "SIGKILL",
  11: "SIGSEGV",
  13: "SIGPIPE",
  14: "SIGALRM",
  15: "SIGTERM",
};

const known = (v) => v !== null && v !== undefined;
const defaultSleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
/** "SIGHUP" for 1, "signal 42" for a number without a portable name. */
export function signalName(signal) {
  return SIGNAL_NAMES[signal] ?? `signal ${signal}`;
}

/** The terminal view's status for an ended terminal: "exited with code 3", "killed by SIGHUP", or "exited" when neither is known. */
export function describeExit({ exitCode, exitSignal } = {}) {
  if (known(exitCode)) return `exited with code ${exitCode}`;
  if (known(exitSignal)) return `killed by ${signalName(exitSignal)}`;
  return "exited";
}

/** The same, short enough for the terminal list's State column: "exited (3)", "killed (SIGHUP)". */
export function shortExit({ exitCode, exitSignal } = {}) {
  if (known(exitCode)) return `exited (${exitCode})`;
  if (known(exitSignal)) return `killed (${signalName(exitSignal)})`;
  return "exited";
}

/** Whether an `exit` message already says how the terminal ended. */
export function exitIsComplete(msg) {
  return known(msg.exitCode) || known(msg.exitSignal);
}

/**
 * Reads how the terminal ended from its REST resource: `fetchTerminal()`
 * resolves to it. The server records the exit before it tells viewers, but
 * a resource read in the same instant may still say `running`, so it asks
 * again a few times (`tries`, `waitMs` apart) before giving up. Resolves to
 * {exitCode, exitSignal}, or null when the resource never said `exited`.
 */
export async function exitFromResource(fetchTerminal, { tries = 5, waitMs = 300, sleep = defaultSleep } = {}) {
  for (let i = 0; i < tries; i++) {
    if (i > 0) await sleep(waitMs);
    let terminal;
    try {
      terminal = await fetchTerminal();
    } catch (_) {
      continue; // a network blip: the next try may reach it
    }
    if (terminal?.state === "exited") return { exitCode: terminal.exitCode ?? null, exitSignal: terminal.exitSignal ?? null };
  }
  return null;
}
