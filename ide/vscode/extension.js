// extension.js: the gpusync VS Code extension. It stays thin: every action is a call to the
// gpusync CLI (lib/cli.js, spawn with an argument vector), whose --json output is the contract
// (docs/json-contract.md). The status bar follows `gpusync events --json` (lib/syncstate.js): one
// stream per project of the window (each workspace folder with a .gpusync/config), and it shows
// the project of the active editor. A project's daemon is followed whenever one runs: one started
// from a terminal after the window opened, and a new one after a daemon stopped, was killed or
// crashed (lookAll); the extension never starts one by itself (except gpusync.watchOnOpen).
'use strict';

const fs = require('fs');
const path = require('path');
const vscode = require('vscode');

const cli = require('./lib/cli');
const { readJobs, hasProject, findProject } = require('./lib/config');
const { SyncState, OFF, CONNECTING, DISCONNECTED, stoppedMessage } = require('./lib/syncstate');

const CONNECT_RECHECK_MS = 2000; // while "connecting": how often status --json is read again
// While a project's daemon is not followed, its control socket is looked at (a stat, no process)
// this often: a daemon that starts, from here or from a terminal, binds a new one.
const REATTACH_MS = 2000;
// A socket that did not answer (left behind by a daemon that was killed) is tried again this
// seldom.
const STALE_RETRY_MS = 60000;

const GPU_CHOICES = [
  { label: '1 GPU', args: ['--gpus', '1'] },
  { label: '2 GPUs', args: ['--gpus', '2'] },
  { label: '4 GPUs', args: ['--gpus', '4'] },
  { label: '8 GPUs', args: ['--gpus', '8'] },
  { label: '2 CPU ranks', description: 'no GPU', args: ['--cpu', '2'] },
  { label: '4 CPU ranks', args: ['--cpu', '4'] },
];
const COMMAND_ITEM = {
  label: 'Command...',
  description: 'run any command line in the remote project',
};

// One project of the window (a root with a .gpusync/config): its sync state and the
// `gpusync events --json` child that feeds it.
class Project {
  constructor(root) {
    this.root = root;
    this.state = new SyncState();
    this.events = null; // the `gpusync events --json` child
    this.sawEvent = false; // an event came since the stream started
    this.recheck = null; // the timer that reads status again while connecting
    this.triedId = null; // the control socket the last stream was started on (socketId)
    this.triedAt = 0; // and when (Date.now())
  }
}

// The identity of the control socket of the project at root, or null when there is none. A
// daemon that starts binds a new socket (it unlinks the one a killed daemon left), so a new inode
// or mtime means a new daemon to follow.
function socketId(root) {
  let st;
  try {
    st = fs.statSync(path.join(root, '.gpusync', 'daemon.sock'), { bigint: true });
  } catch (e) {
    return null;
  }
  return st.isSocket() ? `${st.ino}:${st.mtimeNs}` : null;
}

// One per window: owns the status bar item, the output channels and the CLI processes it follows.
class Gpusync {
  constructor(context) {
    this.context = context;
    this.projects = new Map(); // root -> Project, each project followed (or once followed) here
    this.none = new SyncState(); // what the status bar shows outside any project: not watching
    this.folder = null; // the workspace folder of the last active editor that had one
    this.logs = null; // the `gpusync logs -f` child
    this.lastRun = null; // id of the last run started from here
    // The GPU summary of the last "Show GPUs" (gpusync top), hidden until there is one.
    // Items get ids and names: VS Code lists them by name in the status bar's menu (where a user
    // can hide each one) and keeps that choice per id.
    this.gpuItem = vscode.window.createStatusBarItem(
      'gpusync.gpu',
      vscode.StatusBarAlignment.Left,
      9,
    );
    this.gpuItem.name = 'gpusync GPUs';
    this.gpuItem.command = 'gpusync.gpu';
    this.output = vscode.window.createOutputChannel('gpusync');
    this.logChannel = vscode.window.createOutputChannel('gpusync logs');
    this.item = vscode.window.createStatusBarItem(
      'gpusync.status',
      vscode.StatusBarAlignment.Left,
      10,
    );
    this.item.name = 'gpusync sync state';
    this.item.command = 'gpusync.showDetails';
    context.subscriptions.push(this.output, this.logChannel, this.item, this.gpuItem, {
      dispose: () => this.dispose(),
    });
    this.onEditor(vscode.window.activeTextEditor);
    context.subscriptions.push(
      vscode.window.onDidChangeActiveTextEditor((editor) => this.onEditor(editor)),
      vscode.workspace.onDidChangeWorkspaceFolders((change) => this.onFolders(change)),
    );
    this.render();
    this.item.show();
    // One timer looks after every project of the window (lookAll); never what keeps node running.
    this.looker = setInterval(() => this.lookAll(), REATTACH_MS);
    if (this.looker.unref) this.looker.unref();
  }

  // ---- projects ----

  // The project the user is in, where commands run and whose state the status bar shows: that of
  // the active editor's workspace folder (the folder, or the parent the CLI finds a
  // .gpusync/config in), else of the first folder that has one, else the first folder.
  root() {
    const dirs = (vscode.workspace.workspaceFolders || []).map((f) => f.uri.fsPath);
    if (this.folder && dirs.includes(this.folder)) return findProject(this.folder) || this.folder;
    for (const d of dirs) {
      const root = findProject(d);
      if (root) return root;
    }
    return dirs.length ? dirs[0] : null;
  }

  // The roots of the window's projects, once each (two folders of one project are one project).
  projectRoots() {
    const roots = (vscode.workspace.workspaceFolders || []).map((f) => findProject(f.uri.fsPath));
    return [...new Set(roots.filter(Boolean))];
  }

  project(root) {
    let p = this.projects.get(root);
    if (!p) {
      p = new Project(root);
      this.projects.set(root, p);
    }
    return p;
  }

  // The active editor changed: its workspace folder's project is the one shown (an editor
  // outside the workspace, or none, leaves the last one shown).
  onEditor(editor) {
    const uri = editor && editor.document && editor.document.uri;
    const folder = uri && vscode.workspace.getWorkspaceFolder(uri);
    if (!folder || folder.uri.fsPath === this.folder) return;
    this.folder = folder.uri.fsPath;
    this.render();
  }

  // Folders added to the workspace are opened as at start; a removed project stops being followed
  // (its daemon keeps running).
  onFolders(change) {
    const keep = new Set(this.projectRoots());
    for (const p of this.projects.values()) if (!keep.has(p.root)) this.stopEvents(p.root);
    for (const f of change.added || []) {
      const root = findProject(f.uri.fsPath);
      if (root) this.openProject(root);
    }
    this.render();
  }

  // ---- the CLI ----

  bin() {
    const p = vscode.workspace.getConfiguration('gpusync').get('path', 'gpusync') || 'gpusync';
    // A relative path with a slash is relative to the workspace; a bare name is looked up in PATH.
    return p.includes('/') && !path.isAbsolute(p) && this.root() ? path.join(this.root(), p) : p;
  }

  // Runs `gpusync CMD --json ARGS...` in `cwd` (default: the workspace); resolves the reply,
  // rejects a GpusyncError.
  async json(args, input, cwd = this.root()) {
    this.output.appendLine(`$ gpusync ${cli.jsonArgs(args).join(' ')}`);
    try {
      return await cli.runJson(this.bin(), args, { cwd, input });
    } catch (e) {
      this.output.appendLine(`  failed: ${e.message}`);
      throw e;
    }
  }

  requireProject(root = this.root()) {
    if (hasProject(root)) return true;
    vscode.window.showErrorMessage(
      'gpusync: this workspace is not a gpusync project; run "gpusync: Initialise" first.',
    );
    return false;
  }

  // ---- status bar ----

  // Shows the state of the project the user is in.
  render() {
    const p = this.projects.get(this.root());
    const v = (p ? p.state : this.none).view();
    this.item.text = v.text;
    this.item.tooltip = v.tooltip;
    this.item.backgroundColor =
      v.severity === 'normal'
        ? undefined
        : new vscode.ThemeColor(
            v.severity === 'error'
              ? 'statusBarItem.errorBackground'
              : 'statusBarItem.warningBackground',
          );
  }

  // " in FOLDER" in a window of several folders (where a file name alone is ambiguous), else "".
  where(root) {
    const folders = vscode.workspace.workspaceFolders || [];
    return root && folders.length > 1 ? ` in ${path.basename(root)}` : '';
  }

  notify(problem, root) {
    const where = this.where(root);
    const file = (problem.path || '(no file)') + where;
    if (problem.kind === 'conflict') {
      vscode.window.showWarningMessage(
        `gpusync: conflict on ${file}: it was changed on the server; the server's copy is kept as ${problem.detail}`,
      );
    } else {
      vscode.window.showErrorMessage(
        `gpusync: error syncing ${file}: ${problem.detail || 'failed'}`,
      );
    }
  }

  onEventLine(p, line) {
    const ev = cli.parseContractLine(line);
    if (!ev || typeof ev.event !== 'string') return;
    p.sawEvent = true;
    this.output.appendLine(`event: ${line}`);
    const problem = p.state.applyEvent(ev);
    this.render();
    if (problem) this.notify(problem, p.root);
  }

  // Follows the events of the project's daemon (once); the stream ends when the daemon stops.
  async followEvents(root = this.root()) {
    const p = this.project(root);
    if (p.events) return;
    p.sawEvent = false;
    p.triedId = socketId(root);
    p.triedAt = Date.now();
    const child = cli.follow(this.bin(), ['events', '--json'], {
      cwd: root,
      onLine: (l) => this.onEventLine(p, l),
      onErrLine: (l) => this.output.appendLine(`events: ${l}`),
      onExit: () => {
        if (p.events !== child) return; // stopped here already
        p.events = null;
        p.state.stopped();
        this.render();
      },
    });
    p.events = child;
    await this.seed(p, child);
    this.recheckWhileConnecting(p, child);
  }

  // The stream carries changes only: the starting point comes from status --json (unless an
  // event already said more). A first connection that fails (a refused login) sends no event at
  // all: a status that says disconnected is warned about here, with its reason.
  async seed(p, child) {
    let st;
    try {
      st = await this.json(['status'], undefined, p.root);
    } catch (e) {
      return; // shown in the output channel; the events decide
    }
    if (p.events !== child || (p.sawEvent && p.state.kind !== CONNECTING)) return;
    const was = p.state.kind;
    p.state.applyStatus(st);
    this.render();
    if (p.state.kind === DISCONNECTED && was !== DISCONNECTED && typeof st.last_error === 'string')
      vscode.window.showWarningMessage(
        `gpusync: disconnected${this.where(p.root)}: ${st.last_error}`,
      );
  }

  // The stream says "connected" once the session is up, but nothing when the first attempt
  // fails (a wrong password, no key accepted): while the project reads "connecting", status is
  // read again every CONNECT_RECHECK_MS, until the state moves on or the stream ends. So too
  // while it reads "not watching" with the stream alive (a status read as the daemon started).
  recheckWhileConnecting(p, child) {
    if (p.events !== child || (p.state.kind !== CONNECTING && p.state.kind !== OFF)) return;
    p.recheck = setTimeout(async () => {
      p.recheck = null;
      if (p.events !== child) return;
      await this.seed(p, child);
      this.recheckWhileConnecting(p, child);
    }, CONNECT_RECHECK_MS);
    if (p.recheck.unref) p.recheck.unref(); // never what keeps node running
  }

  // The looker's tick: follows the daemon of each project of the window whose daemon is not
  // followed and whose control socket is new, or did not answer long enough ago (a killed
  // daemon's). A stat per project, no process. It never starts a daemon, so Stop Watching holds
  // until a daemon is started elsewhere (a terminal), which is then followed. Until status
  // --json says a daemon runs, the project reads "not watching" (seed), and a status reply that
  // comes after the stream ended is dropped there.
  lookAll() {
    for (const root of this.projectRoots()) {
      const p = this.project(root);
      if (p.events) continue;
      const id = socketId(root);
      if (id && (id !== p.triedId || Date.now() - p.triedAt >= STALE_RETRY_MS))
        this.followEvents(root).catch((e) => this.output.appendLine(`events: ${e.message}`));
    }
  }

  stopEvents(root) {
    const p = this.projects.get(root);
    if (!p) return;
    if (p.events) p.events.kill('SIGTERM');
    clearTimeout(p.recheck);
    p.events = p.recheck = null;
    p.state.stopped();
    this.render();
  }

  // ---- commands ----

  async init() {
    const target = await vscode.window.showInputBox({
      prompt: 'Server to sync with: [user@]host[:port]',
      placeHolder: 'root@connect.example.com:22',
      ignoreFocusOut: true,
    });
    if (!target) return null;
    const remote = await vscode.window.showInputBox({
      prompt:
        'Project directory on the server (empty: gpusync/<folder name> under the remote home)',
      ignoreFocusOut: true,
    });
    const args = ['init', target].concat(remote ? ['--path', remote] : []);
    try {
      return await this.initWithPrompts(args);
    } catch (e) {
      vscode.window.showErrorMessage(`gpusync: initialise failed: ${e.message}`);
      return null;
    }
  }

  // Runs init; asks before trusting an unknown host key and for a password to install a key.
  async initWithPrompts(args) {
    let input;
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        const r = await this.json(args, input);
        vscode.window.showInformationMessage(
          `gpusync: initialised for ${r.target} (${r.remote_path}), auth ${r.auth}`,
        );
        return r;
      } catch (e) {
        if (e.errorName === 'unknown host key' && !args.includes('--accept-new-host-key')) {
          const pick = await vscode.window.showWarningMessage(
            `${e.message}\nTrust this server's key?`,
            'Trust',
            'Cancel',
          );
          if (pick !== 'Trust') return null;
          args = args.concat(['--accept-new-host-key']);
        } else if (e.errorName === 'authentication failed' && input === undefined) {
          const pw = await vscode.window.showInputBox({
            prompt: 'SSH password (used once to install a gpusync key on the server)',
            password: true,
            ignoreFocusOut: true,
          });
          if (!pw) return null;
          args = args.concat(['--install-key', '--password-stdin']);
          input = `${pw}\n`;
        } else {
          throw e;
        }
      }
    }
    return null;
  }

  async startWatching(root = this.root()) {
    if (!this.requireProject(root)) return null;
    let reply = null;
    try {
      reply = await this.startDaemon(root);
      vscode.window.showInformationMessage(`gpusync: watching (daemon pid ${reply.pid})`);
    } catch (e) {
      if (e.errorName !== 'conflict') {
        // "conflict" here means a daemon already runs: follow it
        vscode.window.showErrorMessage(`gpusync: cannot start watching: ${e.message}`);
        return null;
      }
    }
    await this.followEvents(root);
    return reply;
  }

  // `watch -d`. Right after `watch --stop` the old daemon can hold its lock for a moment after
  // it stopped serving ("conflict" while status says no daemon): try again for up to 3 s.
  async startDaemon(root) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.json(['watch', '-d'], undefined, root);
      } catch (e) {
        if (e.errorName !== 'conflict' || attempt >= 30) throw e;
        const st = await this.json(['status'], undefined, root).catch(() => ({ daemon: true }));
        if (st.daemon) throw e; // a daemon really runs
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
  }

  async stopWatching() {
    const root = this.root();
    if (!this.requireProject(root)) return null;
    try {
      const r = await this.json(['watch', '--stop'], undefined, root);
      this.stopEvents(root);
      vscode.window.showInformationMessage(stoppedMessage(r));
      return r;
    } catch (e) {
      vscode.window.showErrorMessage(`gpusync: cannot stop watching: ${e.message}`);
      return null;
    }
  }

  async push() {
    if (!this.requireProject()) return null;
    let r;
    try {
      r = await this.json(['push']);
    } catch (e) {
      if (!e.reply || !Array.isArray(e.reply.failures)) {
        vscode.window.showErrorMessage(`gpusync: push failed: ${e.message}`);
        return null;
      }
      r = e.reply; // some operations failed: the summary says which
    }
    for (const c of r.conflicts || [])
      this.notify({ kind: 'conflict', path: c.path, detail: c.kept });
    for (const f of r.failures || [])
      this.notify({ kind: 'error', path: f.path, detail: `${f.op}: ${f.error}` });
    const msg = `gpusync: pushed ${r.sent} file${r.sent === 1 ? '' : 's'} (${r.bytes} bytes), deleted ${r.deleted}, renamed ${r.renamed} in ${r.seconds} s`;
    if (r.ok) vscode.window.showInformationMessage(msg);
    return r;
  }

  async pickJob(root) {
    const jobs = readJobs(root);
    const items = jobs.map((j) => ({
      label: j.name,
      description: j.command || '',
      detail: j.gpus ? `gpus = ${j.gpus}` : undefined,
      job: j,
    }));
    if (!jobs.some((j) => j.name === 'train'))
      items.push({
        label: 'train',
        description: 'the bundled trainer (Fashion-MNIST)',
        job: { name: 'train' },
      });
    items.push(COMMAND_ITEM);
    const pick = await vscode.window.showQuickPick(items, {
      placeHolder: 'Job to run on the server',
    });
    if (!pick) return null;
    if (pick === COMMAND_ITEM || pick.label === COMMAND_ITEM.label) {
      const line = await vscode.window.showInputBox({
        prompt: 'Command line to run in the remote project',
      });
      return line ? { label: line, args: ['--', 'sh', '-c', line] } : null;
    }
    return { label: pick.label, job: pick.job, args: [pick.label] };
  }

  async pickCount(job) {
    const items = GPU_CHOICES.slice();
    if (job && job.gpus) items.unshift({ label: `job default (gpus = ${job.gpus})`, args: [] });
    const pick = await vscode.window.showQuickPick(items, {
      placeHolder: 'GPUs (or CPU ranks) for the run',
    });
    return pick ? pick.args : null;
  }

  async runJob() {
    const root = this.root();
    if (!this.requireProject(root)) return null;
    const what = await this.pickJob(root);
    if (!what) return null;
    const count = await this.pickCount(what.job);
    if (!count) return null;
    let r;
    try {
      r = await this.json(['run'].concat(count, ['--detach'], what.args), undefined, root);
    } catch (e) {
      vscode.window.showErrorMessage(`gpusync: run failed: ${e.message}`);
      return null;
    }
    this.lastRun = r.id;
    vscode.window.showInformationMessage(
      `gpusync: run ${r.id} started: ${r.ranks} rank${r.ranks === 1 ? '' : 's'} (MASTER_PORT ${r.master_port})`,
    );
    const logs = this.showLogs(r.id, root);
    return { run: r, logs };
  }

  // Follows a run's logs in the "gpusync logs" channel. Returns a promise of how the follower
  // ended: {code, outcome}, outcome 'ended' (the run ended; code is its exit status), 'lost'
  // (exit 255: the connection failed, the run may go on), 'failed' (the CLI's own error, such as
  // no run on the server yet) or 'replaced' (another Show Logs took the channel).
  showLogs(runId, root = this.root()) {
    if (!this.requireProject(root)) return Promise.resolve(null);
    // A follower already on the channel is replaced: forget it first, so that its exit (which
    // comes later) neither writes into the fresh channel nor reports the run as ended.
    const old = this.logs;
    this.logs = null;
    if (old) old.kill('SIGTERM');
    const id = typeof runId === 'string' ? runId : this.lastRun;
    const args = ['logs', '-f'].concat(id ? [id] : []);
    this.logChannel.clear();
    this.logChannel.appendLine(`$ gpusync ${args.join(' ')}`);
    this.logChannel.show(true);
    return new Promise((resolve) => {
      const stderr = [];
      const child = cli.follow(this.bin(), args, {
        cwd: root,
        onLine: (l) => this.logs === child && this.logChannel.appendLine(l),
        onErrLine: (l) => {
          stderr.push(l);
          if (this.logs === child) this.logChannel.appendLine(l);
        },
        onExit: (code) => {
          if (this.logs !== child) {
            resolve({ code, outcome: 'replaced' });
            return;
          }
          this.logs = null;
          resolve(this.logsEnded(id, code, stderr, root));
        },
      });
      this.logs = child;
    });
  }

  // Says how `logs -f [id]` ended: the run's own status when the run ended; 255 when the
  // connection failed (the run may well go on); any other status is told apart from a run that
  // failed by asking `ps --json` whether the run is still running (docs/json-contract.md). A run
  // that ended with a non-zero status is notified (failedRun), not only written in the channel.
  async logsEnded(id, code, stderr, root) {
    const label = id || 'latest';
    const say = (line) => this.logChannel.appendLine(`[gpusync: ${line}]`);
    if (code === 255) {
      const msg =
        "lost the connection to the run's logs (it may still be running; " +
        'gpusync: Show Logs reattaches)';
      say(msg);
      vscode.window.showWarningMessage(`gpusync: run ${label}: ${msg}`);
      return { code, outcome: 'lost' };
    }
    const run = code === 0 ? null : await this.endedRun(id, root);
    if (code !== 0 && !run) {
      const why = stderr.join('\n').trim().replace(/^gpusync: /, '') || `exit status ${code}`;
      say(`logs of run ${label} failed: ${why}`);
      vscode.window.showErrorMessage(`gpusync: logs of run ${label} failed: ${why}`);
      return { code, outcome: 'failed' };
    }
    say(`run ${label} ended: exit status ${code}`);
    if (run) this.failedRun(run, code);
    return { code, outcome: 'ended' };
  }

  // The run (the newest when `id` is null) as `ps --json` lists it, when it is no longer running;
  // else (still running, not listed, ps failed) null.
  async endedRun(id, root) {
    try {
      const runs = (await this.json(['ps'], undefined, root)).runs || [];
      const run = id ? runs.find((r) => r.id === id) : runs[0];
      return run && run.state !== 'running' ? run : null;
    } catch (e) {
      return null;
    }
  }

  // Tells the user that a run followed here ended with a non-zero status: an error naming the
  // run, its status and what ps --json says of it (the rank that failed first, an OOM kill); a
  // run that was stopped (Stop Run, `gpusync stop`) is a warning that says so, not a failure.
  failedRun(run, code) {
    if (run.state === 'stopped') {
      vscode.window.showWarningMessage(`gpusync: run ${run.id} was stopped (exit status ${code})`);
      return;
    }
    const why = [];
    if (Number.isInteger(run.failed_rank)) {
      why.push(`rank ${run.failed_rank} failed first`);
      const rank = (run.ranks || []).find((r) => r.rank === run.failed_rank);
      if (rank && rank.oom) why.push('killed out of memory');
    }
    if (run.state !== 'failed') why.push(`state ${run.state}`);
    const more = why.length ? ` (${why.join(', ')})` : '';
    vscode.window.showErrorMessage(`gpusync: run ${run.id} failed: exit status ${code}${more}`);
  }

  async stopRun() {
    const root = this.root();
    if (!this.requireProject(root)) return null;
    let runs;
    try {
      runs = (await this.json(['ps'], undefined, root)).runs.filter((r) => r.state === 'running');
    } catch (e) {
      vscode.window.showErrorMessage(`gpusync: cannot list runs: ${e.message}`);
      return null;
    }
    if (!runs.length) {
      vscode.window.showInformationMessage('gpusync: no run is running');
      return null;
    }
    const pick = await vscode.window.showQuickPick(
      runs.map((r) => ({
        label: r.id,
        description: [r.name, r.command && [].concat(r.command).join(' ')]
          .filter(Boolean)
          .join(' · '),
        run: r,
      })),
      { placeHolder: 'Run to stop' },
    );
    if (!pick) return null;
    try {
      const r = await this.json(['stop', pick.label], undefined, root);
      vscode.window.showInformationMessage(`gpusync: stopped run ${r.id}`);
      return r;
    } catch (e) {
      vscode.window.showErrorMessage(`gpusync: cannot stop ${pick.label}: ${e.message}`);
      return null;
    }
  }

  async doctor() {
    if (!this.requireProject()) return null;
    let r;
    try {
      r = await this.json(['doctor']);
    } catch (e) {
      if (!e.reply || !Array.isArray(e.reply.checks)) {
        vscode.window.showErrorMessage(`gpusync: doctor failed: ${e.message}`);
        return null;
      }
      r = e.reply; // a failed check: still a full report
    }
    this.output.appendLine('gpusync doctor:');
    for (const c of r.checks)
      this.output.appendLine(
        `  ${c.status.padEnd(5)} ${c.name.padEnd(8)} ${c.detail}${c.hint ? `  (hint: ${c.hint})` : ''}`,
      );
    this.output.show(true);
    const count = (s) => r.checks.filter((c) => c.status === s).length;
    const msg = `gpusync doctor: ${count('ok')} ok, ${count('warn')} warnings, ${count('fail')} failed`;
    if (r.ok) vscode.window.showInformationMessage(msg);
    else vscode.window.showErrorMessage(msg);
    return r;
  }

  // One sample of `gpusync top`: "GPU0 87% 31.2/79.6 GiB 250 W 64°C | GPU1 ..." in the status
  // bar (clicking it samples again); the full sample goes to the output channel.
  async gpu() {
    if (!this.requireProject()) return null;
    let r;
    try {
      r = await this.json(['top', '--count', '1']);
    } catch (e) {
      vscode.window.showErrorMessage(`gpusync: cannot read the server's GPUs: ${e.message}`);
      return null;
    }
    this.gpuItem.text = r.gpu_summary;
    this.gpuItem.tooltip = r.gpu_error || `gpusync top at ${r.time} (click to refresh)`;
    this.gpuItem.show();
    return r;
  }

  // The item's click: the project's state, its problems and the conflict copies status --json
  // lists now (read again: `gpusync status --ack` may have cleared them since).
  async showDetails() {
    const root = this.root();
    if (hasProject(root)) {
      try {
        const st = await this.json(['status'], undefined, root);
        this.project(root).state.setConflicts(st.conflicts);
      } catch (e) {
        /* shown in the output channel; the list stays as it was */
      }
    }
    const p = this.projects.get(root);
    const state = p ? p.state : this.none;
    const lines = state.details();
    this.output.appendLine(`gpusync status${p ? ` of ${p.root}` : ''}:`);
    for (const l of lines) this.output.appendLine(`  ${l}`);
    this.output.show(true);
    state.acknowledge();
    this.render();
    const level = state.conflicts.length ? 'showWarningMessage' : 'showInformationMessage';
    vscode.window[level](`gpusync: ${lines.join('; ')}`);
    return lines;
  }

  // On open: each project of the window is opened.
  async onOpen() {
    await Promise.all(this.projectRoots().map((root) => this.openProject(root)));
  }

  // Follows the project's daemon if one runs, or starts one when gpusync.watchOnOpen says so.
  async openProject(root) {
    let st = null;
    try {
      st = await this.json(['status'], undefined, root);
    } catch (e) {
      return;
    }
    // the conflict copies kept while no editor was open are shown, daemon or not
    this.project(root).state.setConflicts(st.conflicts);
    this.render();
    if (st.daemon) await this.followEvents(root);
    else if (vscode.workspace.getConfiguration('gpusync').get('watchOnOpen', false))
      await this.startWatching(root);
  }

  dispose() {
    clearInterval(this.looker);
    for (const p of this.projects.values()) {
      if (p.events) p.events.kill('SIGTERM');
      clearTimeout(p.recheck);
      p.events = p.recheck = null;
    }
    if (this.logs) this.logs.kill('SIGTERM');
    this.logs = null;
  }

  // The state of the project the user is in (its kind, as lib/syncstate.js names it).
  currentState() {
    const p = this.projects.get(this.root());
    return (p ? p.state : this.none).kind;
  }
}

function activate(context) {
  const g = new Gpusync(context);
  const commands = {
    'gpusync.init': () => g.init(),
    'gpusync.startWatching': () => g.startWatching(),
    'gpusync.stopWatching': () => g.stopWatching(),
    'gpusync.push': () => g.push(),
    'gpusync.runJob': () => g.runJob(),
    'gpusync.showLogs': (id) => g.showLogs(id),
    'gpusync.stopRun': () => g.stopRun(),
    'gpusync.doctor': () => g.doctor(),
    'gpusync.gpu': () => g.gpu(),
    'gpusync.showDetails': () => g.showDetails(),
  };
  for (const [id, fn] of Object.entries(commands))
    context.subscriptions.push(vscode.commands.registerCommand(id, fn));
  const ready = g.onOpen();
  return { ready, state: () => g.currentState(), isWatching: () => g.currentState() !== OFF };
}

function deactivate() {
  // the subscriptions' dispose() ends the followed processes; the daemon keeps running
}

module.exports = { activate, deactivate };
