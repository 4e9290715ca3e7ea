// The row of keys a phone's soft keyboard lacks (docs/WEB.md, "Phones"),
// and the Ctrl and Alt latches: tap Ctrl, then a letter, and the letter
// goes out as its control character. A latched arrow goes out as the
// modified arrow xterm sends (Ctrl+← is `ESC [ 1 ; 5 D`).

const ARROWS = { "←": "D", "↑": "A", "→": "C", "↓": "B" };

/** The control character for `ch` under Ctrl, or null if it has none. */
export function ctrlOf(ch) {
  if (ch.length !== 1) return null;
  const code = ch.charCodeAt(0);
  if (ch === " " || ch === "@" || ch === "2") return "\x00";
  if (ch === "?" || ch === "8") return "\x7f";
  if (code >= 97 && code <= 122) return String.fromCharCode(code - 96); // a-z
  if (code >= 64 && code <= 95) return String.fromCharCode(code - 64); // @A-Z[\]^_
  if (ch >= "3" && ch <= "7") return String.fromCharCode(code - 24); // ^[ ^\ ^] ^^ ^_
  return null;
}

/**
 * The bytes of an arrow key (`final` is A, B, C or D): with Ctrl or Alt the
 * xterm modified form `ESC [ 1 ; m final` (m = 1 + 2·Alt + 4·Ctrl), else
 * `ESC O final` in the application cursor-key mode and `ESC [ final` outside it.
 */
export function arrowSequence(final, { ctrl = false, alt = false, application = false } = {}) {
  const modifier = 1 + (alt ? 2 : 0) + (ctrl ? 4 : 0);
  if (modifier > 1) return `\x1b[1;${modifier}${final}`;
  return application ? `\x1bO${final}` : `\x1b[${final}`;
}

export class Modifiers {
  constructor(onChange) {
    this.ctrl = false;
    this.alt = false;
    this.onChange = onChange;
  }

  toggle(name) {
    this[name] = !this[name];
    this.onChange();
  }

  /**
   * Applies the latches to what the user typed and releases them. They
   * modify one key: the first character (a soft keyboard may hand over a
   * whole word at once); the rest goes out as typed.
   */
  apply(data) {
    if (!this.ctrl && !this.alt) return data;
    const [first, ...rest] = data;
    let out = first ?? "";
    if (this.ctrl) out = ctrlOf(out) ?? out;
    if (this.alt) out = "\x1b" + out;
    this.release();
    return out + rest.join("");
  }

  /** Lets go of both latches. */
  release() {
    this.ctrl = false;
    this.alt = false;
    this.onChange();
  }
}

/**
 * Builds the key row. `send(data)` sends input; `term` is the xterm.js
 * terminal (for the cursor-key mode and focus).
 */
export function keyRow(term, modifiers, send) {
  const row = document.createElement("div");
  row.className = "key-row";
  row.setAttribute("role", "toolbar");
  row.setAttribute("aria-label", "Extra keys");
  const keys = [
    ["Esc", () => send(modifiers.apply("\x1b"))],
    ["Tab", () => send(modifiers.apply("\t"))],
    ["Ctrl", () => modifiers.toggle("ctrl"), "ctrl"],
    ["Alt", () => modifiers.toggle("alt"), "alt"],
    ...Object.entries(ARROWS).map(([label, final]) => [
      label,
      () => {
        const application = term.modes.applicationCursorKeysMode;
        send(arrowSequence(final, { ctrl: modifiers.ctrl, alt: modifiers.alt, application }));
        if (modifiers.ctrl || modifiers.alt) modifiers.release();
      },
    ]),
    ["|", () => send(modifiers.apply("|"))],
    ["~", () => send(modifiers.apply("~"))],
    ["/", () => send(modifiers.apply("/"))],
  ];
  const latchButtons = {};
  for (const [label, action, latch] of keys) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = label;
    button.tabIndex = -1;
    button.dataset.key = label;
    // Keep the focus (and the soft keyboard) on the terminal.
    button.addEventListener("pointerdown", (e) => e.preventDefault());
    button.addEventListener("mousedown", (e) => e.preventDefault());
    button.addEventListener("click", () => {
      action();
      term.focus();
    });
    if (latch) latchButtons[latch] = button;
    row.append(button);
  }
  const render = () => {
    for (const [name, button] of Object.entries(latchButtons)) {
      button.classList.toggle("latched", modifiers[name]);
      button.setAttribute("aria-pressed", String(modifiers[name]));
    }
  };
  return { element: row, render };
}
