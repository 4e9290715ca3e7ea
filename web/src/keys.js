// The row of keys a phone's soft keyboard lacks (docs/WEB.md, "Phones"),
// and the Ctrl and Alt latches: tap Ctrl, then a letter, and the letter
// goes out as its control character.

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

  /** Applies and releases the latches to what the user typed. */
  apply(data) {
    if (!this.ctrl && !this.alt) return data;
    let out = data;
    if (this.ctrl) out = ctrlOf(data) ?? data;
    if (this.alt) out = "\x1b" + out;
    this.ctrl = false;
    this.alt = false;
    this.onChange();
    return out;
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
        send(modifiers.apply(application ? `\x1bO${final}` : `\x1b[${final}`));
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
