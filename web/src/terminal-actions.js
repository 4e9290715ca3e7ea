// The terminal list's Kill and Delete: which one a terminal offers, the
// in-page confirmation before either (not window.confirm, which phones and
// tests handle badly), the server's refusal under the row until the user
// dismisses it, and a deleted terminal leaving the list at once.
//
// What is asked, in flight or refused lives here, not in the DOM: the list
// is built again from the server's data every 3 s (dom.js `reconcile`
// keeps the rows that did not change), so a confirmation made by editing a
// row would vanish at the next refresh. One click listener on the list
// serves every row, so rows kept across refreshes need none of their own.

import { el } from "./dom.js";

/** Signals the Kill confirmation offers; the first is the server's default (docs/REST.md, ".../kill"). */
const KILL_SIGNALS = [
  ["HUP", "SIGHUP (hang up, as closing a window)"],
  ["TERM", "SIGTERM"],
  ["INT", "SIGINT (Ctrl-C)"],
  ["KILL", "SIGKILL (cannot be ignored)"],
];
/** After a kill is accepted the row stays `running` until the exit is reported; meanwhile the button says so. */
const KILL_PATIENCE_MS = 5000;

const WORDS = {
  kill: { button: "Kill", busy: "Killing…", ask: "Kill this terminal?", failed: "Could not kill the terminal" },
  delete: {
    button: "Delete",
    busy: "Deleting…",
    ask: "Delete this terminal and its final screen? This cannot be undone.",
    failed: "Could not delete the terminal",
  },
};

/**
 * What a terminal in `state` offers: Kill while it may run, Delete once it
 * cannot (the server refuses DELETE while `launching` or `running`, and
 * kill otherwise; docs/REST.md).
 */
export function actionFor(state) {
  if (state === "launching" || state === "running") return "kill";
  if (state === "pending" || state === "exited" || state === "error") return "delete";
  return null;
}

export class TerminalActions {
  /**
   * `client` is the page's api(token); `changed()` draws the list again
   * from the data it has, `refresh()` reads the list again now.
   */
  constructor(client, { changed, refresh }) {
    Object.assign(this, { client, changed, refresh });
    this.asking = null; // {id, action}: the confirmation on screen
    this.busy = new Map(); // id -> action: a request in flight
    this.killSent = new Map(); // id -> when a kill was accepted
    this.errors = new Map(); // id -> the server's refusal, shown until dismissed
    this.deleted = new Set(); // ids deleted here, hidden whatever a refresh in flight read
  }

  /** The terminals to list: those not deleted here. */
  visible(terminals) {
    return terminals.filter((t) => !this.deleted.has(t.id));
  }

  /** The row's Actions cell: the button its state offers, or what is under way. */
  cell(t) {
    const cell = el("td", { className: "actions" });
    const action = actionFor(t.state);
    const killing = action === "kill" && Date.now() - (this.killSent.get(t.id) ?? -Infinity) < KILL_PATIENCE_MS;
    const busy = this.busy.get(t.id) ?? (killing ? "kill" : null);
    if (busy) cell.append(el("button", { type: "button", className: `action ${busy}`, disabled: true }, WORDS[busy].busy));
    else if (action) {
      const open = this.asking?.id === t.id && this.asking.action === action;
      cell.append(el("button", { type: "button", className: `action ${action}`, "data-action": action, "aria-expanded": String(open) }, WORDS[action].button));
    }
    return cell;
  }

  /** Rows that go under the terminal's row (spanning `columns`): the confirmation, the refusal. */
  rowsAfter(t, columns) {
    const rows = [];
    const action = actionFor(t.state);
    if (this.asking?.id === t.id && this.asking.action === action && !this.busy.has(t.id)) {
      rows.push(el("tr", { className: "row-confirm", "data-for": t.id }, el("td", { colspan: columns }, this.confirmation(action))));
    }
    const error = this.errors.get(t.id);
    if (error) {
      const dismiss = el("button", { type: "button", "data-action": "dismiss" }, "Dismiss");
      rows.push(el("tr", { className: "row-problem", "data-for": t.id }, el("td", { colspan: columns }, el("div", { className: "action-problem" }, el("span", { role: "alert" }, error), dismiss))));
    }
    return rows;
  }

  confirmation(action) {
    const signal =
      action === "kill"
        ? el("select", { className: "kill-signal", "aria-label": "Signal" }, ...KILL_SIGNALS.map(([value, label]) => el("option", { value }, label)))
        : null;
    return el(
      "div",
      { className: "confirm", role: "group", "aria-label": WORDS[action].ask },
      el("span", {}, WORDS[action].ask),
      signal,
      el("button", { type: "button", className: `confirm-yes ${action}`, "data-action": "confirm" }, WORDS[action].button),
      el("button", { type: "button", className: "confirm-no", "data-action": "cancel" }, "Cancel"),
    );
  }

  /** Forgets a kill's "Killing…" once its terminal no longer runs. */
  forgetEnded(terminals) {
    for (const t of terminals) if (actionFor(t.state) !== "kill") this.killSent.delete(t.id);
  }

  /** A click in the list: one of the buttons above, or anything else (ignored). */
  onClick(event) {
    const button = event.target.closest?.("button[data-action]");
    const row = button?.closest("tr[data-terminal], tr[data-for]");
    if (!row) return;
    const id = row.dataset.terminal ?? row.dataset.for;
    const what = button.dataset.action;
    if (what === "kill" || what === "delete") {
      const open = this.asking?.id === id && this.asking.action === what;
      this.asking = open ? null : { id, action: what };
      this.errors.delete(id);
      this.changed();
      if (!open) row.parentElement?.querySelector(`tr.row-confirm[data-for="${id}"] .confirm-no`)?.focus();
    } else if (what === "cancel") {
      this.cancel();
    } else if (what === "dismiss") {
      this.errors.delete(id);
      this.changed();
    } else if (what === "confirm" && this.asking?.id === id) {
      this.run(id, this.asking.action, row.querySelector("select.kill-signal")?.value);
    }
  }

  /** Escape closes the confirmation. */
  onKey(event) {
    if (event.key === "Escape" && this.asking) this.cancel();
  }

  cancel() {
    this.asking = null;
    this.changed();
  }

  async run(id, action, signal) {
    this.asking = null;
    this.busy.set(id, action);
    this.changed();
    try {
      if (action === "kill") {
        await this.client.killTerminal(id, signal);
        this.killSent.set(id, Date.now());
      } else {
        await this.client.deleteTerminal(id);
        this.deleted.add(id);
      }
    } catch (err) {
      this.errors.set(id, `${WORDS[action].failed}: ${err.message}`);
    } finally {
      this.busy.delete(id);
      this.changed();
      this.refresh();
    }
  }
}
