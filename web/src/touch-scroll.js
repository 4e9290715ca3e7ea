// Scrolling the scrollback with a finger. xterm.js 6.0.0 ignores touch
// drags on its viewport (xtermjs/xterm.js#5489, fixed after 6.0.0), so on
// a phone the scrollback could not be reached at all. A vertical drag on
// the terminal scrolls it by whole lines here, the content following the
// finger as in any scrolling list. Remove this once xterm.js is upgraded
// past the fix.

/** The number of lines a vertical finger move of `dy` pixels scrolls (up is positive dy). */
export function linesFor(dy, lineHeight) {
  if (!(lineHeight > 0)) return 0;
  return Math.trunc(dy / lineHeight);
}

/**
 * Listens for one-finger drags on `element` and scrolls `term` by lines.
 * Returns a function that stops listening.
 */
export function touchScroll(element, term) {
  let last = null; // {x, y} of the finger at the last scrolled line
  const lineHeight = () => {
    const screen = element.querySelector(".xterm-screen");
    return screen && term.rows ? screen.clientHeight / term.rows : 0;
  };
  const start = (e) => {
    last = e.touches.length === 1 ? { x: e.touches[0].clientX, y: e.touches[0].clientY } : null;
  };
  const move = (e) => {
    if (!last || e.touches.length !== 1) return;
    const { clientX: x, clientY: y } = e.touches[0];
    const dy = last.y - y;
    if (Math.abs(x - last.x) > Math.abs(dy)) return; // a sideways pan: the browser's
    const lines = linesFor(dy, lineHeight());
    if (lines === 0) return;
    term.scrollLines(lines);
    last = { x, y: last.y - lines * lineHeight() };
  };
  const end = () => {
    last = null;
  };
  const options = { passive: true, capture: true };
  element.addEventListener("touchstart", start, options);
  element.addEventListener("touchmove", move, options);
  element.addEventListener("touchend", end, options);
  element.addEventListener("touchcancel", end, options);
  return () => {
    element.removeEventListener("touchstart", start, options);
    element.removeEventListener("touchmove", move, options);
    element.removeEventListener("touchend", end, options);
    element.removeEventListener("touchcancel", end, options);
  };
}
