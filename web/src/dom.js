// A few lines of DOM building, so the page needs no framework.

/** `el("button", {type: "button", className: "x"}, "text", child)`. */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "className" || key === "hidden" || key === "disabled" || key === "value" || key === "selected") node[key] = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/**
 * Makes `fresh` the children of `parent`, in order, keeping every old child
 * that equals a fresh one (the same outerHTML) instead of it: a refresh
 * then touches only what changed, and a selection, the focus or an open
 * menu in an unchanged child survives it.
 */
export function reconcile(parent, fresh) {
  const old = new Map();
  for (const child of parent.children) {
    const same = old.get(child.outerHTML);
    if (same) same.push(child);
    else old.set(child.outerHTML, [child]);
  }
  const nodes = fresh.map((node) => old.get(node.outerHTML)?.shift() ?? node);
  nodes.forEach((node, i) => {
    if (parent.children[i] !== node) parent.insertBefore(node, parent.children[i] ?? null);
  });
  while (parent.children.length > nodes.length) parent.lastElementChild.remove();
}

/** "3 min ago", "just now", "2 h ago", or a date. */
export function ago(iso, now = Date.now()) {
  if (!iso) return "never";
  const seconds = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (seconds < 45) return "just now";
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min ago`;
  const hours = Math.round(minutes / 60);
  if (hours < 48) return `${hours} h ago`;
  return new Date(iso).toLocaleDateString();
}

/** Splits a command line into argv: spaces separate, quotes group, backslash escapes; a quote left open throws. */
export function splitArgv(line) {
  const argv = [];
  let current = "";
  let quote = null;
  let started = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote) {
      if (c === quote) quote = null;
      else if (c === "\\" && quote === '"' && i + 1 < line.length) current += line[++i];
      else current += c;
    } else if (c === "'" || c === '"') {
      quote = c;
      started = true;
    } else if (c === "\\" && i + 1 < line.length) {
      current += line[++i];
      started = true;
    } else if (/\s/.test(c)) {
      if (started) argv.push(current);
      current = "";
      started = false;
    } else {
      current += c;
      started = true;
    }
  }
  // As a shell would: a quote left open is a mistake, not a word.
  if (quote) throw new Error(`the command has a ${quote} quote that is not closed`);
  if (started) argv.push(current);
  return argv;
}
