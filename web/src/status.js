// What the terminal view's header and notice say while it waits for
// something (docs/WEB.md, "Terminal view"), as plain logic the unit tests
// can reach without a browser.

import { describeExit } from "./exit.js";
import { HELD_INPUT_LIMIT } from "./viewer-socket.js";

/**
 * What the header's status and the notice say (docs/WEB.md, "Terminal
 * view"). `state` is the socket's (connecting, reconnecting, live, ended)
 * or "exited" (then `exitCode` or `exitSignal` says how, exit.js);
 * `termState` and `hostState` come from the last `status`; `heldBytes` is
 * the input waiting for the stream and `droppedBytes` what did not fit,
 * told at once (a paste too large for the hold is dropped whole, never cut).
 * `kind` names the notice: "connection" and "host" go away by themselves
 * once the stream is live, "final" stays.
 */
export function describeStatus({
  state,
  attempt,
  termState,
  hostState,
  exitCode,
  exitSignal,
  endMessage,
  heldBytes = 0,
  droppedBytes = 0,
}) {
  const held =
    (heldBytes > 0 ? ` What you type is held (${heldBytes} bytes so far) and sent once it is back.` : "") +
    (droppedBytes > 0 ? ` ${droppedBytes} bytes did not fit in the ${HELD_INPUT_LIMIT}-byte hold and will not be sent.` : "");
  if (state === "exited") return { text: describeExit({ exitCode, exitSignal }) };
  if (state === "ended") {
    return { text: termState === "error" ? "failed to start" : "disconnected", notice: endMessage, kind: "final" };
  }
  if (termState === "pending") {
    const when = hostState === "offline" ? "it starts when its host comes online" : "its host is starting it";
    return { text: "pending", notice: `The terminal has not started yet: ${when}.${held}`, kind: "host" };
  }
  if (hostState === "offline") {
    return { text: "host offline", notice: `The host is offline; the terminal comes back when it reconnects.${held}`, kind: "host" };
  }
  if (state === "live") return { text: "live" };
  if (state === "reconnecting") {
    return { text: attempt ? `reconnecting (try ${attempt})` : "reconnecting", notice: `Connection lost; reconnecting…${held}`, kind: "connection" };
  }
  return { text: "connecting", notice: held ? held.trim() : null, kind: "connection" };
}
