// lib/syncstate.js: the sync state shown in the status bar, computed from `gpusync status --json`
// (the starting point) and the `gpusync events --json` stream (every change after it). Pure: no
// VS Code API here, so the rules are easy to read and to test.
'use strict';

// Kinds of state, in the words the status bar uses.
const OFF = 'off'; // no daemon (or not followed)
const CONNECTING = 'connecting';
const CONNECTED = 'connected';
const SYNCING = 'syncing';
const UP_TO_DATE = 'up_to_date';
const CONFLICT = 'conflict';
const ERROR = 'error';
const DISCONNECTED = 'disconnected';

const MAX_PROBLEMS = 50; // kept for the details view; older ones drop off

class SyncState {
  constructor() {
    this.kind = OFF;
    this.target = null;
    this.syncedInBatch = 0; // paths synced since the last "idle": the N of "syncing N"
    this.batch = null; // the last "progress" of the batch under way (or status's batch), until idle
    this.lastPath = null;
    this.lastMessage = null;
    this.problems = []; // {kind: 'conflict'|'error', path, detail, time}, unseen by the user
    this.conflicts = []; // conflict copies kept on the server, not acknowledged: {path, kept}
    // path ('' for none) -> the messages of its errors already reported: the daemon retries a
    // failed operation every few seconds, and each retry sends the error again
    this.failing = new Map();
    this.recent = []; // the last events, newest last, for the details view
  }

  // Seeds the state from a `status --json` reply (daemon running or not).
  applyStatus(st) {
    this.setConflicts(st && st.conflicts);
    if (!st || st.daemon !== true) {
      this.kind = OFF;
      return;
    }
    this.target = st.target || this.target;
    this.lastMessage = st.last_error || null;
    if (st.state === 'up_to_date') this.kind = UP_TO_DATE;
    else if (st.state === 'syncing') this.kind = SYNCING;
    else if (st.state === 'disconnected') this.kind = DISCONNECTED;
    else this.kind = CONNECTING;
    this.syncedInBatch = 0;
    this.batch = st.batch && typeof st.batch === 'object' ? st.batch : null;
  }

  // Applies one event object; returns a problem {kind, path, detail} that deserves a
  // notification, or null.
  applyEvent(ev) {
    this.recent.push(ev);
    if (this.recent.length > 20) this.recent.shift();
    switch (ev.event) {
      case 'connected':
        this.kind = CONNECTED;
        this.target = ev.target || this.target;
        this.lastMessage = null;
        return null;
      case 'disconnected':
        this.kind = DISCONNECTED;
        this.lastMessage = ev.message || null;
        return null;
      case 'synced':
      case 'deleted':
      case 'renamed':
        this.kind = SYNCING;
        this.syncedInBatch++;
        this.lastPath = ev.path;
        this.failing.delete(ev.path);
        if (ev.from) this.failing.delete(ev.from);
        return null;
      // A batch that runs longer than 250 ms says so every 250 ms: a large file still on its
      // way (its "synced" comes only at its end) reads as syncing, not as the "up to date" of
      // the batch before.
      case 'progress':
        this.kind = SYNCING;
        this.batch = ev;
        return null;
      case 'idle':
        this.kind = UP_TO_DATE;
        this.syncedInBatch = 0;
        this.batch = null;
        this.lastMessage = null;
        this.failing.clear(); // the server matches: every error has cleared
        return null;
      case 'conflict':
        if (!this.conflicts.some((c) => c.kept === ev.kept))
          this.conflicts.push({ path: ev.path, kept: ev.kept });
        return this.addProblem(CONFLICT, ev.path, ev.kept);
      case 'error':
        return this.addError(ev.path, ev.message);
      default:
        return null; // a newer daemon's event: ignore it, as the contract allows
    }
  }

  // The conflict copies `status --json` lists (they outlive the daemon, until `status --ack`);
  // anything but an array leaves the list as it was.
  setConflicts(list) {
    if (!Array.isArray(list)) return;
    this.conflicts = list
      .filter((c) => c && typeof c === 'object')
      .map((c) => ({ path: c.path, kept: c.kept }));
  }

  // An error is reported once (a problem, a notification) until it clears: the path syncs, an
  // "idle" says the server matches, or a new stream starts. A retry's error only shows.
  addError(path, message) {
    const key = path || '';
    const seen = this.failing.get(key) || new Set();
    this.failing.set(key, seen);
    if (!seen.has(message)) {
      seen.add(message);
      return this.addProblem(ERROR, path, message);
    }
    this.kind = ERROR;
    this.lastPath = path || null;
    this.lastMessage = message || null;
    return null;
  }

  addProblem(kind, path, detail) {
    const p = { kind, path: path || null, detail: detail || null, time: new Date() };
    this.kind = kind;
    this.lastPath = path || null;
    this.lastMessage = detail || null;
    this.problems.push(p);
    if (this.problems.length > MAX_PROBLEMS) this.problems.shift();
    return p;
  }

  // The daemon went away (the events stream ended).
  stopped() {
    this.kind = OFF;
    this.syncedInBatch = 0;
    this.batch = null;
    this.failing.clear(); // the next stream reports its errors anew
  }

  // The user has seen the problems (clicked the item).
  acknowledge() {
    this.problems = [];
  }

  // The N of "syncing N": the files of the batch, those sent so far or the operations the
  // daemon planned for it (progress), so that one large file on its way reads "syncing 1".
  syncingCount() {
    const planned = this.batch ? Number(this.batch.ops_total) || 0 : 0;
    return Math.max(this.syncedInBatch, planned);
  }

  // "syncing", with how far the batch has got when the daemon said (bytes sent of bytes to send).
  syncingTooltip(where) {
    const b = this.batch;
    if (!b || !(Number(b.bytes_total) > 0)) return `syncing${where}`;
    const mb = (n) => (Number(n) / 1048576).toFixed(1);
    return `syncing${where}: ${mb(b.bytes)} of ${mb(b.bytes_total)} MiB sent`;
  }

  // {text, tooltip, severity: 'normal'|'warning'|'error'} for the status bar.
  view() {
    const n = this.problems.length;
    const badge = n ? ` (${n} problem${n === 1 ? '' : 's'})` : '';
    const where = this.target ? ` to ${this.target}` : '';
    const views = {
      [OFF]: ['$(circle-slash) gpusync: not watching', 'gpusync watch is not running here'],
      [CONNECTING]: ['$(sync~spin) gpusync: connecting', `connecting${where}`],
      [CONNECTED]: ['$(plug) gpusync: connected', `connected${where}`],
      [SYNCING]: [
        `$(sync~spin) gpusync: syncing ${this.syncingCount()}`,
        this.syncingTooltip(where),
      ],
      [UP_TO_DATE]: ['$(check) gpusync: up to date', `the server matches this workspace${where}`],
      [CONFLICT]: [`$(warning) gpusync: conflict ${this.lastPath || ''}`.trim(), this.lastMessage],
      [ERROR]: [`$(error) gpusync: error ${this.lastPath || ''}`.trim(), this.lastMessage],
      [DISCONNECTED]: ['$(debug-disconnect) gpusync: disconnected', this.lastMessage],
    };
    const [text, tip] = views[this.kind];
    const copies = this.conflicts.length;
    let severity = 'normal';
    if (this.kind === ERROR || this.kind === DISCONNECTED) severity = 'error';
    else if (this.kind === CONFLICT || n || copies) severity = 'warning';
    // conflict and error name their file already; other states carry the problem count
    let shown = this.kind === CONFLICT || this.kind === ERROR ? text : text + badge;
    if (copies) shown += ` | ${copies} conflict cop${copies === 1 ? 'y' : 'ies'}`;
    return { text: shown, tooltip: `${tip || ''}\nclick for details`.trim(), severity };
  }

  // A few lines for the details view.
  details() {
    const lines = [this.view().text.replace(/^\$\([^)]*\) gpusync: /, '')];
    if (this.lastMessage) lines.push(`last message: ${this.lastMessage}`);
    for (const p of this.problems)
      lines.push(`${p.kind}: ${p.path || '(no file)'}${p.detail ? ` — ${p.detail}` : ''}`);
    const copies = this.conflicts.length;
    if (copies) {
      const each = this.conflicts.map((c) => `${c.path} (the server's copy is ${c.kept})`);
      lines.push(
        `${copies} conflict cop${copies === 1 ? 'y' : 'ies'} kept on the server ` +
          `(gpusync status --ack clears): ${each.join(', ')}`,
      );
    }
    return lines;
  }
}

// What `watch --stop --json` answered, for a notification: "stopped" alone reads as "and every
// change was sent", which is not so when the daemon was stopped in the middle of an upload.
function stoppedMessage(r) {
  if (!r || !r.was_running) return 'gpusync: no watch was running';
  const unsent = Number(r.unsent) || 0;
  if (unsent > 0) {
    const one = unsent === 1;
    return (
      `gpusync: stopped watching; ${unsent} change${one ? ' was' : 's were'} not sent ` +
      `(gpusync: Push sends ${one ? 'it' : 'them'})`
    );
  }
  if (r.unchecked)
    return 'gpusync: stopped watching before every file was checked (gpusync: Push checks them)';
  return 'gpusync: stopped watching';
}

module.exports = {
  stoppedMessage,
  SyncState,
  OFF,
  CONNECTING,
  CONNECTED,
  SYNCING,
  UP_TO_DATE,
  CONFLICT,
  ERROR,
  DISCONNECTED,
};
