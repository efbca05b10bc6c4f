// test/extension.test.js: the extension driven end to end: the REAL gpusync binary ($GPUSYNC_BIN)
// against the sandbox sshd (scripts/sandbox-server.sh), with the server's tree checked directly on
// this machine's filesystem.
//
// test/vscode-fake.js stands in for the `vscode` module: it records what the extension shows
// (status bar, output channels, notifications) and answers prompts from queues; everything below
// the extension's calls to the VS Code API is real. What a user sees in a real VS Code (watching,
// an edit saved in the editor, the status bar's states, a conflict, Run Job, Stop Run, Show GPUs)
// is tested there, by ../test-real.sh; these cover the rest in seconds, without a browser.
//
// A second project whose server is reached through the build's WAN simulator (tests/tools/wansim,
// slowProject()) lets the tests slow or cut a link; those tests are skipped when the build has no
// wansim. openWindow() "reopens the window" on other folders (a multi-root workspace, too).
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync, spawn } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const vscodeFake = require('./vscode-fake');

vscodeFake.install();
const { fake } = vscodeFake;

const REPO = path.resolve(__dirname, '..', '..', '..');
const SANDBOX = path.join(REPO, 'scripts', 'sandbox-server.sh');
const WAIT_MS = 30000;

function gpusyncBin() {
  const bin =
    process.env.GPUSYNC_BIN ||
    (process.env.GS_BUILD_DIR ? path.join(process.env.GS_BUILD_DIR, 'cli', 'gpusync') : null);
  if (!bin || !fs.existsSync(bin))
    throw new Error(
      'set GPUSYNC_BIN to the built gpusync binary (or GS_BUILD_DIR to the build folder)',
    );
  return bin;
}

const env = { tmp: null, sandbox: null, project: null, remote: null, port: null, bin: null };
// The second project, reached through the build's WAN simulator (slowProject()).
const slow = { project: null, remote: null, ctl: null, wansim: null, child: null };
let extension;
let api;

// Resolves once pred() is true, re-checking after every visible change; rejects after `ms`.
function waitFor(pred, what, ms = WAIT_MS) {
  return new Promise((resolve, reject) => {
    const check = () => {
      let v;
      try {
        v = pred();
      } catch (e) {
        v = false;
      }
      if (v) {
        clearTimeout(timer);
        fake.changes.off('change', check);
        resolve(v);
      }
    };
    const timer = setTimeout(() => {
      fake.changes.off('change', check);
      reject(
        new Error(
          `timed out waiting for ${what}; status bar history: ${JSON.stringify(statusItem().history.slice(-10))}; messages: ${JSON.stringify(fake.messages.slice(-5))}`,
        ),
      );
    }, ms);
    fake.changes.on('change', check);
    check();
  });
}

function statusItem() {
  return fake.statusItems[fake.statusItems.length - 1];
}

function channel(name) {
  return fake.channels.get(name);
}

// Runs the CLI directly (for checks the extension does not make itself), in `cwd` (default: the
// first project).
function cliJson(args, cwd = env.project) {
  const out = execFileSync(env.bin, [args[0], '--json'].concat(args.slice(1)), {
    cwd,
    encoding: 'utf8',
  });
  return JSON.parse(out.trim().split('\n').pop());
}

// The WAN simulator the build makes (tests/tools/wansim): null when this build has none.
function wansimBin() {
  const bin = path.join(path.dirname(path.dirname(env.bin)), 'tests', 'tools', 'wansim');
  return fs.existsSync(bin) ? bin : null;
}

// A second project, `slow.project` (remote `slow.remote`), whose server is reached through
// wansim, so that a test can slow its link (`wansim('rate', '2')`, Mbit/s) or cut it
// (`wansim('cut')`, then `wansim('restore')`). Made once, by the first test that needs it; null
// when the build has no wansim (those tests are skipped).
async function slowProject() {
  if (slow.project) return slow;
  const bin = wansimBin();
  if (!bin) return null;
  slow.wansim = bin;
  slow.ctl = path.join(env.tmp, 'wansim.sock');
  slow.child = spawn(
    bin,
    ['--listen', '127.0.0.1:0', '--target', `127.0.0.1:${env.port}`, '--control', slow.ctl],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const port = await new Promise((resolve, reject) => {
    let out = '';
    slow.child.stdout.on('data', (d) => {
      out += d;
      const m = /^port (\d+)\n/.exec(out);
      if (m) resolve(m[1]);
    });
    slow.child.on('exit', (code) => reject(new Error(`wansim exited with status ${code}`)));
  });
  const project = path.join(env.tmp, 'slow');
  fs.mkdirSync(project);
  execFileSync(
    env.bin,
    ['init', `root@127.0.0.1:${port}`, '--accept-new-host-key', '--path', `${env.tmp}/remote-slow`],
    { cwd: project, stdio: 'ignore' },
  );
  slow.project = project;
  slow.remote = path.join(env.tmp, 'remote-slow');
  return slow;
}

function wansim(...args) {
  execFileSync(slow.wansim, ['--ctl', slow.ctl].concat(args), { stdio: 'ignore' });
}

// "Closes the window" (disposes every activation so far) and opens one on the folders `dirs`, no
// editor open (gpusync.watchOnOpen off);
// resolves the new activation's API once it has read the projects' status.
async function openWindow(dirs) {
  for (const s of contexts.flatMap((c) => c.subscriptions)) s.dispose();
  fake.settings['gpusync.watchOnOpen'] = false; // the tests start watching themselves
  fake.activeTextEditor = undefined;
  vscodeFake.setWorkspaceFolders(dirs); // no window listens yet
  const ctx = vscodeFake.makeContext();
  contexts.push(ctx);
  const opened = extension.activate(ctx);
  await opened.ready;
  return opened;
}

// Stop Watching from the extension, then wait until the daemon's process has exited (and
// released its lock), so that the next Start Watching starts a new one.
async function stopWatchingAndWait(dir) {
  const st = JSON.parse(
    execFileSync(env.bin, ['status', '--json'], { cwd: dir, encoding: 'utf8' }).trim(),
  );
  const stopped = await vscodeFake.commands.executeCommand('gpusync.stopWatching');
  assert.equal(stopped && stopped.was_running, true, 'the daemon was running');
  assert.equal(await processGone(st.pid), true, `the daemon (pid ${st.pid}) exits`);
}

function remoteFile(rel) {
  return fs.readFileSync(path.join(env.remote, rel), 'utf8');
}

// Resolves once process `pid` has exited. `watch --stop` answers when the daemon closes its
// socket, a moment before the process ends, and node cannot wait on a process that is not its
// child (no pidfd), so this looks at /proc every 20 ms, up to WAIT_MS.
async function processGone(pid) {
  const end = Date.now() + WAIT_MS;
  while (isAlive(pid)) {
    if (Date.now() > end) return false;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return true;
}

// Whether `pid` is a live process (a zombie left for init to reap counts as gone).
function isAlive(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch (e) {
    return false;
  }
}

before(() => {
  env.bin = gpusyncBin();
  env.tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'gs-vscode-'));
  env.sandbox = path.join(env.tmp, 'sandbox');
  env.project = path.join(env.tmp, 'project');
  env.remote = path.join(env.tmp, 'remote');
  fs.mkdirSync(env.project);
  const out = execFileSync(SANDBOX, ['start', '--dir', env.sandbox], { encoding: 'utf8' });
  const vars = Object.fromEntries(
    out
      .trim()
      .split('\n')
      .map((l) => l.split('=')),
  );
  env.port = vars.GS_SANDBOX_PORT;
  // The child processes inherit this: the sandbox's key, an empty known_hosts, no agent.
  process.env.HOME = vars.GS_SANDBOX_HOME;
  delete process.env.SSH_AUTH_SOCK;
  delete process.env.GPUSYNC_PASSWORD;
  fake.workspaceFolders = [{ uri: { fsPath: env.project }, name: 'project', index: 0 }];
  fake.settings['gpusync.path'] = env.bin;
  extension = require('../extension');
});

after(() => {
  try {
    if (fs.existsSync(path.join(env.project, '.gpusync', 'config')))
      execFileSync(env.bin, ['watch', '--stop'], { cwd: env.project, stdio: 'ignore' });
  } catch (e) {
    /* already stopped */
  }
  for (const s of contexts.flatMap((c) => c.subscriptions)) s.dispose();
  if (slow.project)
    try {
      execFileSync(env.bin, ['watch', '--stop'], { cwd: slow.project, stdio: 'ignore' });
    } catch (e) {
      /* already stopped */
    }
  if (slow.child) slow.child.kill('SIGTERM');
  if (env.sandbox) execFileSync(SANDBOX, ['stop', env.sandbox], { stdio: 'ignore' });
  if (env.tmp) fs.rmSync(env.tmp, { recursive: true, force: true });
});

const context = vscodeFake.makeContext();
const contexts = [context]; // every activation's context, disposed at the end

test('activation registers every command the manifest declares', async () => {
  api = extension.activate(context);
  await api.ready;
  const manifest = JSON.parse(fs.readFileSync(path.join(__dirname, '..', 'package.json'), 'utf8'));
  const declared = manifest.contributes.commands.map((c) => c.command).sort();
  assert.deepEqual([...fake.commands.keys()].sort(), declared);
  for (const id of [
    'gpusync.init',
    'gpusync.startWatching',
    'gpusync.stopWatching',
    'gpusync.push',
    'gpusync.runJob',
    'gpusync.showLogs',
    'gpusync.stopRun',
    'gpusync.doctor',
  ])
    assert.ok(declared.includes(id), `${id} is declared`);
  assert.match(statusItem().text, /not watching/);
  assert.equal(statusItem().command, 'gpusync.showDetails');
  const settings = manifest.contributes.configuration.properties;
  assert.equal(settings['gpusync.watchOnOpen'].default, false);
  assert.equal(settings['gpusync.path'].type, 'string');
});

test('Initialise asks to trust the unknown host key, then writes the project config', async () => {
  fake.answers.inputBox.push(`root@127.0.0.1:${env.port}`, env.remote);
  fake.answers.message.push((text) => (/Trust this server/.test(text) ? 'Trust' : undefined));
  const r = await vscodeFake.commands.executeCommand('gpusync.init');
  assert.ok(r, `init failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  assert.equal(r.remote_path, env.remote);
  assert.ok(fake.messages.some((m) => m.level === 'warning' && /known_hosts/.test(m.text)));
  assert.match(
    fs.readFileSync(path.join(env.project, '.gpusync', 'config'), 'utf8'),
    new RegExp(`port = ${env.port}`),
  );
  assert.ok(fs.statSync(env.remote).isDirectory());
});

test('Push puts a new file on the server', async () => {
  fs.writeFileSync(path.join(env.project, 'pushed.py'), 'print("pushed")\n');
  const r = await vscodeFake.commands.executeCommand('gpusync.push');
  assert.ok(r && r.ok, `push failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  assert.equal(remoteFile('pushed.py'), 'print("pushed")\n');
  assert.ok(fake.messages.some((m) => m.level === 'info' && /pushed 1 file/.test(m.text)));
});

// A single small file's "synced" and the "idle" after it arrive together: the fake records the
// brief "syncing 1" but a real workbench never paints it, so this waits only for "up to date"
// (test-real.sh sees "syncing N" with a batch of large files).
test('Start Watching, then an edit: the status bar comes back to up to date and the file is on the server', async () => {
  const r = await vscodeFake.commands.executeCommand('gpusync.startWatching');
  assert.ok(r && r.pid > 0, `watch failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  await waitFor(() => /up to date|connected/.test(statusItem().text), 'the first state');
  const mark = statusItem().history.length;
  fs.writeFileSync(path.join(env.project, 'edited.py'), 'x = 1\n');
  // the item already said "up to date": wait for the one that ends this edit's batch
  await waitFor(
    () =>
      remoteFile('edited.py') === 'x = 1\n' &&
      statusItem()
        .history.slice(mark)
        .some((t) => /up to date/.test(t)),
    '"up to date" with edited.py on the server',
  );
  assert.equal(remoteFile('edited.py'), 'x = 1\n');
  // a trailing event of the same save (its close, after the batch had read the file) may start a
  // batch that finds nothing to send: the state comes back to up to date, it is not asserted at
  // the instant the text was seen
  await waitFor(() => api.state() === 'up_to_date', 'the daemon state up_to_date');
});

test('a conflict raises a notification that names the file', async () => {
  fs.writeFileSync(path.join(env.project, 'shared.py'), 'v = 1\n');
  const mark = statusItem().history.length;
  await waitFor(
    () =>
      fs.existsSync(path.join(env.remote, 'shared.py')) &&
      statusItem()
        .history.slice(mark)
        .some((t) => /up to date/.test(t)),
    'shared.py synced',
  );
  fs.writeFileSync(path.join(env.remote, 'shared.py'), 'v = "changed on the server"\n');
  fs.writeFileSync(path.join(env.project, 'shared.py'), 'v = 2\n');
  const note = await waitFor(
    () => fake.messages.find((m) => m.level === 'warning' && /conflict/.test(m.text)),
    'the conflict notification',
  );
  assert.match(note.text, /shared\.py/);
  assert.match(note.text, /shared\.py\.gpusync-conflict-/);
  await waitFor(() => /up to date/.test(statusItem().text), 'up to date after the conflict');
  assert.match(statusItem().text, /1 problem\) \| 1 conflict copy$/);
  assert.equal(remoteFile('shared.py'), 'v = 2\n');
  const kept = fs
    .readdirSync(env.remote)
    .filter((f) => f.startsWith('shared.py.gpusync-conflict-'));
  assert.equal(kept.length, 1);
  assert.equal(remoteFile(kept[0]), 'v = "changed on the server"\n');
  // Clicking the item shows the details and clears the badge.
  const lines = await vscodeFake.commands.executeCommand('gpusync.showDetails');
  assert.ok(lines.some((l) => /conflict: shared\.py/.test(l)));
  assert.doesNotMatch(statusItem().text, /problem/);
});

test('Doctor writes every check to the output channel', async () => {
  const r = await vscodeFake.commands.executeCommand('gpusync.doctor');
  assert.ok(
    r && Array.isArray(r.checks),
    `doctor failed: ${JSON.stringify(fake.messages.slice(-2))}`,
  );
  assert.match(channel('gpusync').text, /ok\s+ssh\s+root@127\.0\.0\.1/);
  assert.ok(fake.messages.some((m) => /gpusync doctor: \d+ ok/.test(m.text)));
});

test('Stop Watching stops the daemon and the status bar says so', async () => {
  const before = cliJson(['status']);
  assert.equal(before.daemon, true);
  const r = await vscodeFake.commands.executeCommand('gpusync.stopWatching');
  assert.ok(r && r.was_running === true, `stop failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  await waitFor(() => /not watching/.test(statusItem().text), '"not watching"');
  assert.equal(cliJson(['status']).daemon, false);
  assert.equal(await processGone(before.pid), true);
});

test('Start Watching right after Stop Watching starts a new daemon', async () => {
  const r = await vscodeFake.commands.executeCommand('gpusync.startWatching');
  assert.ok(r && r.pid > 0, `watch failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  assert.equal(cliJson(['status']).pid, r.pid);
  const stopped = await vscodeFake.commands.executeCommand('gpusync.stopWatching');
  assert.equal(stopped.was_running, true);
});

test('with gpusync.watchOnOpen set, opening the workspace starts watching', async () => {
  for (const s of context.subscriptions) s.dispose(); // "close the window"
  fake.settings['gpusync.watchOnOpen'] = true;
  const reopened = vscodeFake.makeContext();
  contexts.push(reopened);
  const again = extension.activate(reopened);
  await again.ready;
  const st = cliJson(['status']);
  assert.equal(st.daemon, true);
  await waitFor(
    () => /up to date|connected|syncing/.test(statusItem().text),
    'the new window to follow the daemon',
  );
  const stopped = await vscodeFake.commands.executeCommand('gpusync.stopWatching');
  assert.equal(stopped.was_running, true);
  assert.equal(await processGone(st.pid), true);
});

// During a slow upload the daemon sends no "synced" until the file is on the server, but
// "progress" every 250 ms: the status bar must say "syncing 1", not the "up to date" of the batch
// before.
test('a large file on a slow link reads "syncing 1" until it is on the server', async (t) => {
  if (!(await slowProject())) return t.skip('no wansim in this build');
  api = await openWindow([slow.project]);
  fs.writeFileSync(path.join(slow.project, 'first.txt'), 'first\n');
  const r = await vscodeFake.commands.executeCommand('gpusync.startWatching');
  assert.ok(r && r.pid > 0, `watch failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  await waitFor(
    () => api.state() === 'up_to_date' && fs.existsSync(path.join(slow.remote, 'first.txt')),
    'the slow project up to date',
  );
  wansim('rate', '2');
  // About 4 MB of hex (some 2 MB compressed) at 2 Mbit/s: several seconds on the link.
  const hex = crypto.randomBytes(2 << 20).toString('hex');
  const data = hex.replace(/(.{96})/g, '$1\n');
  fs.writeFileSync(path.join(slow.project, 'data.csv'), data);
  const dataOnServer = () => fs.existsSync(path.join(slow.remote, 'data.csv'));
  await waitFor(
    () => /syncing 1$/.test(statusItem().text) && !dataOnServer(),
    '"syncing 1" while data.csv is on its way',
  );
  assert.match(statusItem().tooltip, /MiB sent/);
  wansim('rate', '0');
  await waitFor(
    () => dataOnServer() && api.state() === 'up_to_date',
    'up to date once data.csv is on the server',
    60000,
  );
  assert.equal(fs.statSync(path.join(slow.remote, 'data.csv')).size, data.length);
  await stopWatchingAndWait(slow.project);
});

// `logs -f` exits 1 when the server has no run yet: the CLI's error, not the end of a run.
test('Show Logs before any run says why it cannot follow, not that a run ended', async () => {
  api = await openWindow([env.project]);
  assert.deepEqual(cliJson(['ps']).runs, []);
  const r = await vscodeFake.commands.executeCommand('gpusync.showLogs');
  const note = fake.messages.find(
    (m) => m.level === 'error' && /logs of run latest failed: /.test(m.text),
  );
  assert.ok(note, `an error notification: ${JSON.stringify(fake.messages.slice(-2))}`);
  assert.match(channel('gpusync logs').text, /\[gpusync: logs of run latest failed: .+\]/);
  assert.doesNotMatch(channel('gpusync logs').text, /ended/);
  assert.equal(r.outcome, 'failed');
});

// A run goes on while the connection its logs come over fails (`logs -f` exits 255): the channel
// and the notification say the connection was lost, and nothing says the run ended.
test('a run whose logs lose the connection is not called ended', async (t) => {
  if (!(await slowProject())) return t.skip('no wansim in this build');
  api = await openWindow([slow.project]);
  fake.answers.quickPick.push(
    (items) => items.find((i) => i.label === 'Command...'),
    (items) => items.find((i) => i.label === '2 CPU ranks'),
  );
  fake.answers.inputBox.push('echo tick; exec sleep 600');
  const started = await vscodeFake.commands.executeCommand('gpusync.runJob');
  assert.ok(started && started.run.id, `run failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  const id = started.run.id;
  try {
    await waitFor(() => /tick/.test(channel('gpusync logs').text), 'the run to print tick');
    wansim('cut');
    const mark = fake.messages.length;
    const r = await vscodeFake.commands.executeCommand('gpusync.showLogs', id);
    const text = channel('gpusync logs').text;
    assert.match(text, /lost the connection to the run's logs \(it may still be running/);
    assert.doesNotMatch(text, /ended/);
    const notes = fake.messages.slice(mark);
    assert.ok(
      notes.some(
        (m) => m.level === 'warning' && m.text.includes(`run ${id}: lost the connection`),
      ),
      `a warning: ${JSON.stringify(notes)}`,
    );
    assert.ok(!notes.some((m) => /ended/.test(m.text)), JSON.stringify(notes));
    assert.deepEqual([r.code, r.outcome], [255, 'lost']);
    assert.equal((await started.logs).outcome, 'replaced');
  } finally {
    wansim('restore');
    cliJson(['stop', id], slow.project);
  }
  assert.notEqual(cliJson(['ps'], slow.project).runs.find((x) => x.id === id).state, 'running');
});

// A multi-root workspace: each folder with a .gpusync/config is a project with its own daemon and
// event stream, and the status bar shows the project of the active editor. Project B's link is
// cut, so B cannot be up to date while A is.
test('two folders: two streams; the status bar shows the active editor\'s project', async (t) => {
  if (!(await slowProject())) return t.skip('no wansim in this build');
  const a = (f) => path.join(env.project, f);
  const b = (f) => path.join(slow.project, f);
  wansim('cut');
  try {
    api = await openWindow([env.project]);
    const ra = await vscodeFake.commands.executeCommand('gpusync.startWatching');
    assert.ok(ra && ra.pid > 0, `watch A failed: ${JSON.stringify(fake.messages.slice(-2))}`);
    await waitFor(() => /up to date/.test(statusItem().text), 'project A up to date');
    vscodeFake.setWorkspaceFolders([env.project, slow.project]); // B's folder added
    vscodeFake.openEditor(a('two.txt'));
    assert.match(statusItem().text, /up to date/);
    vscodeFake.openEditor(b('two.txt'));
    assert.match(statusItem().text, /not watching/, 'in B, not A\'s state');
    const rb = await vscodeFake.commands.executeCommand('gpusync.startWatching');
    assert.ok(rb && rb.pid > 0, `watch B failed: ${JSON.stringify(fake.messages.slice(-2))}`);
    assert.notEqual(rb.pid, ra.pid, 'B has its own daemon');
    assert.equal(cliJson(['status'], slow.project).pid, rb.pid);
    await waitFor(() => /connecting|disconnected/.test(statusItem().text), 'B connecting');
    vscodeFake.openEditor(a('two.txt'));
    assert.match(statusItem().text, /up to date/, 'back in A: A\'s up to date');
  } finally {
    wansim('restore');
  }
  // B's own stream: once its link is back, a save in B reaches B's server and B reads up to date.
  vscodeFake.openEditor(b('two.txt'));
  fs.writeFileSync(b('two.txt'), 'two\n');
  await waitFor(
    () => fs.existsSync(path.join(slow.remote, 'two.txt')) && /up to date/.test(statusItem().text),
    'B up to date with two.txt on its server',
    60000,
  );
  await stopWatchingAndWait(slow.project);
  assert.match(statusItem().text, /not watching/);
  vscodeFake.openEditor(a('two.txt'));
  assert.match(statusItem().text, /up to date/, 'stopping B leaves A followed');
  assert.equal(cliJson(['status']).daemon, true);
  await stopWatchingAndWait(env.project);
});

// A daemon started from a HOME without the key never logs in, and the event stream never says so
// (it says "connected" once a session is up): the status bar must not stay "connecting".
test('a refused first login reads disconnected, with the reason', async () => {
  api = await openWindow([env.project]);
  const home = process.env.HOME;
  const nokey = path.join(env.tmp, 'nokey');
  fs.mkdirSync(path.join(nokey, '.ssh'), { recursive: true });
  fs.copyFileSync(path.join(home, '.ssh', 'known_hosts'), path.join(nokey, '.ssh', 'known_hosts'));
  const mark = fake.messages.length;
  let r;
  process.env.HOME = nokey; // the daemon inherits it
  try {
    r = await vscodeFake.commands.executeCommand('gpusync.startWatching');
  } finally {
    process.env.HOME = home;
  }
  assert.ok(r && r.pid > 0, `watch failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  await waitFor(() => /disconnected/.test(statusItem().text), '"disconnected"', 15000);
  const note = await waitFor(
    () =>
      fake.messages
        .slice(mark)
        .find((m) => m.level === 'warning' && /^gpusync: disconnected: /.test(m.text)),
    'the warning',
    5000,
  );
  assert.equal(note.text, `gpusync: disconnected: ${cliJson(['status']).last_error}`);
  assert.match(note.text, /authentication/);
  await stopWatchingAndWait(env.project);
});

// status --json lists the conflict copies the daemon kept (until `status --ack`, even after the
// daemon stopped): the one of 'a conflict raises a notification...' is still listed here.
test('the conflict copies status --json lists show until status --ack clears them', async () => {
  const listed = cliJson(['status']).conflicts;
  assert.equal(listed.length, 1);
  assert.equal(cliJson(['status']).daemon, false);
  // a window opened after the conflict, with no daemon, learns of the copy from status
  api = await openWindow([env.project]);
  assert.match(statusItem().text, /not watching \| 1 conflict copy$/);
  const mark = fake.messages.length;
  const lines = await vscodeFake.commands.executeCommand('gpusync.showDetails');
  const line = lines.find((l) => /conflict copy kept on the server/.test(l));
  assert.ok(line, JSON.stringify(lines));
  assert.ok(line.includes(`shared.py (the server's copy is ${listed[0].kept})`), line);
  assert.match(line, /gpusync status --ack clears/);
  const note = fake.messages.slice(mark).find((m) => m.text.includes(listed[0].kept));
  assert.equal(note && note.level, 'warning', JSON.stringify(fake.messages.slice(mark)));
  // acknowledged: the next click reads status again and the count goes
  cliJson(['status', '--ack']);
  await vscodeFake.commands.executeCommand('gpusync.showDetails');
  assert.doesNotMatch(statusItem().text, /conflict cop/);
});

// A folder gpusync made is replaced on the server by a link into /proc, where nothing can be
// created: the upload of a new file in it fails, and the daemon retries it every few seconds,
// sending the error again each time. The user is told once.
test('a failed upload is notified once, not at every retry of the daemon', async () => {
  api = await openWindow([env.project]);
  const r = await vscodeFake.commands.executeCommand('gpusync.startWatching');
  assert.ok(r && r.pid > 0, `watch failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  fs.mkdirSync(path.join(env.project, 'ro'));
  fs.writeFileSync(path.join(env.project, 'ro', 'a.txt'), 'a\n');
  await waitFor(() => remoteFile('ro/a.txt') === 'a\n', 'ro/a.txt on the server');
  fs.rmSync(path.join(env.remote, 'ro'), { recursive: true });
  fs.symlinkSync('/proc/1', path.join(env.remote, 'ro'));
  const errorEvents = () =>
    channel('gpusync')
      .text.split('\n')
      .filter((l) => l.startsWith('event: '))
      .map((l) => JSON.parse(l.slice('event: '.length)))
      .filter((ev) => ev.event === 'error' && ev.path === 'ro/b.txt').length;
  const notes = () => fake.messages.filter((m) => /error syncing ro\/b\.txt/.test(m.text));
  try {
    fs.writeFileSync(path.join(env.project, 'ro', 'b.txt'), 'b\n');
    await waitFor(() => notes().length > 0, 'the error notification');
    assert.equal(notes()[0].level, 'error');
    assert.match(statusItem().text, /error ro\/b\.txt/);
    await waitFor(() => errorEvents() >= 2, 'the daemon to retry the upload', 60000);
    assert.equal(notes().length, 1, `${errorEvents()} error events: ${JSON.stringify(notes())}`);
    const lines = await vscodeFake.commands.executeCommand('gpusync.showDetails');
    assert.equal(lines.filter((l) => l.startsWith('error: ro/b.txt')).length, 1, lines.join('\n'));
  } finally {
    fs.unlinkSync(path.join(env.remote, 'ro'));
    fs.rmSync(path.join(env.project, 'ro'), { recursive: true });
  }
  await stopWatchingAndWait(env.project);
});

// `gpusync watch -d` from a terminal in dir: its reply. A daemon that was just killed or stopped
// can hold its lock a moment after /proc shows it gone (a zombie main thread whose other threads
// are still exiting): "conflict" is retried for up to WAIT_MS, as docs/json-contract.md says.
async function watchFromTerminal(dir) {
  const end = Date.now() + WAIT_MS;
  for (;;) {
    try {
      return cliJson(['watch', '-d'], dir);
    } catch (e) {
      const reply = JSON.parse(String(e.stdout || '{}').trim().split('\n').pop() || '{}');
      if (reply.error !== 'conflict' || Date.now() > end) throw e;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

// Starts dir's daemon from a terminal (not from the extension), then waits for the status bar to
// read "up to date" and for a save of `name` to reach the server (`remoteDir`) with a "synced"
// event from the new daemon's stream.
async function startedFromTerminal(dir, remoteDir, name, text) {
  const r = await watchFromTerminal(dir);
  assert.ok(r.pid > 0, JSON.stringify(r));
  await waitFor(
    () => /up to date/.test(statusItem().text),
    `"up to date" from the daemon started from a terminal (pid ${r.pid})`,
    15000,
  );
  const mark = channel('gpusync').text.length;
  const synced = () =>
    channel('gpusync')
      .text.slice(mark)
      .split('\n')
      .filter((l) => l.startsWith('event: '))
      .some((l) => {
        const ev = JSON.parse(l.slice('event: '.length));
        return ev.event === 'synced' && ev.path === name;
      });
  fs.writeFileSync(path.join(dir, name), text);
  await waitFor(
    () => fs.readFileSync(path.join(remoteDir, name), 'utf8') === text && synced(),
    `${name} on the server and its "synced" event`,
    15000,
  );
  return r;
}

// The daemon's stream ends (kill -9, or `watch --stop` from a terminal) and a daemon is started
// again from a terminal: the status bar reads "not watching" meanwhile, then follows the new one.
test('a daemon killed, or stopped from a terminal, and started again there is followed', async () => {
  api = await openWindow([env.project]);
  const r = await vscodeFake.commands.executeCommand('gpusync.startWatching');
  assert.ok(r && r.pid > 0, `watch failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  await waitFor(() => api.state() === 'up_to_date', 'watching, up to date');
  process.kill(r.pid, 'SIGKILL');
  await waitFor(() => /not watching/.test(statusItem().text), '"not watching" after kill -9');
  assert.equal(await processGone(r.pid), true);
  const again = await startedFromTerminal(env.project, env.remote, 'again.txt', 'after the kill\n');
  assert.equal(cliJson(['watch', '--stop']).was_running, true);
  await waitFor(() => /not watching/.test(statusItem().text), '"not watching" after a stop');
  assert.equal(await processGone(again.pid), true);
  await startedFromTerminal(env.project, env.remote, 'again.txt', 'after the stop\n');
  await stopWatchingAndWait(env.project);
});

// Stop Watching stops the daemon, and nothing starts one again; a daemon started from a terminal
// afterwards is followed like any other (a status bar saying "not watching" while one syncs would
// be the surprise).
test('after Stop Watching, a daemon started from a terminal is followed', async () => {
  api = await openWindow([env.project]);
  const r = await vscodeFake.commands.executeCommand('gpusync.startWatching');
  assert.ok(r && r.pid > 0, `watch failed: ${JSON.stringify(fake.messages.slice(-2))}`);
  await waitFor(() => api.state() === 'up_to_date', 'watching, up to date');
  await stopWatchingAndWait(env.project);
  assert.match(statusItem().text, /not watching/);
  assert.equal(cliJson(['status']).daemon, false);
  await startedFromTerminal(env.project, env.remote, 'again.txt', 'after Stop Watching\n');
  await stopWatchingAndWait(env.project);
});

// A window opened on two projects while no daemon ran: a daemon started later from a terminal is
// followed in each of them, the project not shown too.
test('every project of the window follows a daemon started from a terminal after it opened', async () => {
  const late = path.join(env.tmp, 'late');
  const lateRemote = path.join(env.tmp, 'remote-late');
  fs.mkdirSync(late);
  execFileSync(env.bin, ['init', `root@127.0.0.1:${env.port}`, '--path', lateRemote], {
    cwd: late,
    stdio: 'ignore',
  });
  api = await openWindow([env.project, late]);
  try {
    vscodeFake.openEditor(path.join(late, 'late.txt'));
    assert.match(statusItem().text, /not watching/);
    vscodeFake.openEditor(path.join(env.project, 'late.txt'));
    assert.match(statusItem().text, /not watching/);
    const rl = await watchFromTerminal(late); // while the other project is shown
    assert.ok(rl.pid > 0, JSON.stringify(rl));
    await startedFromTerminal(env.project, env.remote, 'late.txt', 'shown\n');
    vscodeFake.openEditor(path.join(late, 'late.txt'));
    await waitFor(() => /up to date/.test(statusItem().text), 'the other project up to date');
    const mark = fake.messages.length;
    assert.equal(cliJson(['watch', '--stop'], late).was_running, true);
    await waitFor(() => /not watching/.test(statusItem().text), '"not watching" after its stop');
    await startedFromTerminal(late, lateRemote, 'late.txt', 'late\n');
    assert.deepEqual(fake.messages.slice(mark), [], 'nothing to notify');
  } finally {
    execFileSync(env.bin, ['watch', '--stop'], { cwd: late, stdio: 'ignore' });
  }
  vscodeFake.openEditor(path.join(env.project, 'late.txt')); // Stop Watching acts on it
  await stopWatchingAndWait(env.project);
});

// A run followed in the "gpusync logs" channel that ends with a non-zero status failed: an error
// notification says so (the channel alone is easy to miss). A run ended by Stop Run is told as
// stopped, a warning, not as a failure.
test('a followed run that fails raises an error; one stopped with Stop Run a warning', async () => {
  api = await openWindow([env.project]);
  const runCommand = async (line) => {
    fake.answers.quickPick.push(
      (items) => items.find((i) => i.label === 'Command...'),
      (items) => items.find((i) => i.label === '2 CPU ranks'),
    );
    fake.answers.inputBox.push(line);
    const started = await vscodeFake.commands.executeCommand('gpusync.runJob');
    assert.ok(started && started.run.id, `run failed: ${JSON.stringify(fake.messages.slice(-2))}`);
    return started;
  };
  let mark = fake.messages.length;
  const failing = await runCommand('echo failing; exit 3');
  const end = await failing.logs;
  assert.deepEqual([end.code, end.outcome], [3, 'ended']);
  assert.match(channel('gpusync logs').text, /\[gpusync: run \S+ ended: exit status 3\]/);
  let notes = fake.messages.slice(mark);
  const note = notes.find((m) => m.level === 'error');
  assert.ok(note, `an error notification: ${JSON.stringify(notes)}`);
  const id = failing.run.id; // either rank can fail first
  assert.match(
    note.text,
    new RegExp(`^gpusync: run ${id} failed: exit status 3 \\(rank [01] failed first\\)$`),
  );

  const long = await runCommand('echo started; exec sleep 600');
  await waitFor(() => /started/.test(channel('gpusync logs').text), 'the run to print started');
  mark = fake.messages.length;
  fake.answers.quickPick.push((items) => items.find((i) => i.label === long.run.id));
  const stopped = await vscodeFake.commands.executeCommand('gpusync.stopRun');
  assert.equal(stopped && stopped.id, long.run.id);
  const end2 = await long.logs;
  assert.equal(end2.outcome, 'ended');
  notes = fake.messages.slice(mark);
  assert.ok(
    notes.some(
      (m) =>
        m.level === 'warning' &&
        m.text === `gpusync: run ${long.run.id} was stopped (exit status ${end2.code})`,
    ),
    JSON.stringify(notes),
  );
  assert.ok(!notes.some((m) => m.level === 'error'), JSON.stringify(notes));
});
