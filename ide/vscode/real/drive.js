// real/drive.js: drives the installed extension in a real VS Code (code-server) through headless
// Chromium and the DevTools protocol (puppeteer-core), the way a user would: the command palette,
// the editor, quick picks, the status bar and the Output panel. Run by ../test-real.sh, which
// starts code-server and the sandbox server and sets the environment read below.
//   GS_URL: the workbench URL with ?folder=; GS_PROJECT / GS_REMOTE: the local and server trees;
//   GPUSYNC_BIN: the CLI (for checks the extension does not make); GS_SHOTS: screenshot folder.
'use strict';

const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const puppeteer = require('puppeteer-core');

const WAIT_MS = 30000;
const env = {
  url: process.env.GS_URL,
  project: process.env.GS_PROJECT,
  remote: process.env.GS_REMOTE,
  bin: process.env.GPUSYNC_BIN,
  shots: process.env.GS_SHOTS,
  chromium: process.env.GS_CHROMIUM || '/usr/bin/chromium',
};
const SYNC_ITEM = '[id$="gpusync.status"]'; // the status bar entry ids end with the item's id
const GPU_ITEM = '[id$="gpusync.gpu"]';

function step(what) {
  console.log(`drive.js: ${what}`);
}

// Runs `gpusync CMD --json ARGS` in the project (checks the extension does not make itself).
function cliJson(args) {
  const out = execFileSync(env.bin, [args[0], '--json'].concat(args.slice(1)), {
    cwd: env.project,
    encoding: 'utf8',
  });
  return JSON.parse(out.trim().split('\n').pop());
}

function remoteFile(rel) {
  const p = path.join(env.remote, rel);
  return fs.existsSync(p) ? fs.readFileSync(p, 'utf8') : null;
}

// Polls pred() every 50 ms (a file on the server, a process state: no event tells us) until true.
async function until(pred, what, ms = WAIT_MS) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

// Records every text the sync item shows, in page.__gsHistory, as the workbench renders it.
async function recordStatusHistory(page) {
  await page.waitForSelector(SYNC_ITEM, { timeout: WAIT_MS });
  await page.evaluate((sel) => {
    window.__gsHistory = [];
    const note = () => {
      const el = document.querySelector(sel);
      const t = el ? el.textContent.trim() : '';
      const h = window.__gsHistory;
      if (t && h[h.length - 1] !== t) h.push(t);
    };
    note();
    const bar = document.getElementById('workbench.parts.statusbar');
    new MutationObserver(note).observe(bar, {
      subtree: true,
      childList: true,
      characterData: true,
      attributes: true,
    });
  }, SYNC_ITEM);
}

function history(page) {
  return page.evaluate(() => window.__gsHistory.slice());
}

// Waits until the status history, from index `from` on, has an entry matching each regex in order.
async function waitForStates(page, from, regexes, what) {
  const sources = regexes.map((r) => r.source);
  try {
    await page.waitForFunction(
      (start, srcs) => {
        let i = start;
        for (const s of srcs) {
          const re = new RegExp(s);
          while (i < window.__gsHistory.length && !re.test(window.__gsHistory[i])) i++;
          if (i >= window.__gsHistory.length) return false;
        }
        return true;
      },
      { timeout: WAIT_MS, polling: 'mutation' },
      from,
      sources,
    );
  } catch (e) {
    throw new Error(
      `status bar never showed ${what}; it showed ${JSON.stringify(await history(page))}`,
    );
  }
}

async function press(page, chord) {
  const keys = chord.split('+');
  for (const k of keys) await page.keyboard.down(k);
  for (const k of keys.reverse()) await page.keyboard.up(k);
}

// Types into the open quick input and accepts the row whose label contains `label`.
async function pickInQuickInput(page, typed, label) {
  const input = '.quick-input-widget .quick-input-box input';
  await page.waitForSelector(input, { visible: true, timeout: WAIT_MS });
  await page.type(input, typed);
  await page.waitForFunction(
    (want) => {
      const row = document.querySelector('.quick-input-list .monaco-list-row.focused');
      return row && (row.getAttribute('aria-label') || row.textContent).includes(want);
    },
    { timeout: WAIT_MS, polling: 100 },
    label,
  );
  await page.keyboard.press('Enter');
}

async function runCommand(page, title) {
  step(`command palette: ${title}`);
  await press(page, 'F1');
  await pickInQuickInput(page, title, title);
}

// Opens `rel` with Quick Open, replaces its text with `text` by typing, and saves it.
async function editAndSave(page, rel, text) {
  step(`edit and save ${rel}`);
  await press(page, 'Control+p');
  await pickInQuickInput(page, rel, rel);
  await page.waitForFunction(
    (name) => {
      const tab = document.querySelector('.tabs-container .tab.active');
      const ed = document.activeElement;
      return tab && tab.textContent.includes(name) && ed && ed.closest('.monaco-editor');
    },
    { timeout: WAIT_MS, polling: 100 },
    rel,
  );
  await press(page, 'Control+a');
  await page.keyboard.type(text);
  await press(page, 'Control+s');
  await page.waitForFunction(() => !document.querySelector('.tabs-container .tab.active.dirty'), {
    timeout: WAIT_MS,
    polling: 100,
  });
}

async function outputText(page) {
  return page.evaluate(() => {
    const lines = document.querySelector('.part.panel .monaco-editor .view-lines');
    return lines ? lines.innerText.replace(/\u00a0/g, ' ') : '';
  });
}

async function screenshot(page, name, selector) {
  if (!env.shots) return;
  fs.mkdirSync(env.shots, { recursive: true });
  const file = path.join(env.shots, `${name}.png`);
  if (selector) await (await page.$(selector)).screenshot({ path: file });
  else await page.screenshot({ path: file });
  step(`screenshot ${file}`);
}

async function openWorkbench(browser) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1400, height: 900 });
  page.on('pageerror', (e) => console.log(`drive.js: page error: ${e.message}`));
  step(`open ${env.url}`);
  await page.goto(env.url, { waitUntil: 'domcontentloaded', timeout: 60000 });
  await page.waitForSelector('.monaco-workbench .part.statusbar', { timeout: 60000 });
  // The extension activates on workspaceContains:.gpusync/config: its item appears on its own.
  step('wait for the extension to activate (its status bar item)');
  await page.waitForSelector(SYNC_ITEM, { timeout: 60000 });
  return page;
}

async function watchAndEdit(page) {
  assert.match(await page.$eval(SYNC_ITEM, (e) => e.textContent), /not watching/);
  await recordStatusHistory(page);
  await runCommand(page, 'gpusync: Start Watching');
  await waitForStates(
    page,
    0,
    [/connecting|connected/, /up to date/],
    'connecting, then up to date',
  );
  await editAndSave(page, 'edited.py', 'x = 41\n');
  await until(() => remoteFile('edited.py') === 'x = 41\n', 'the saved bytes on the server');
  // No event marks the start of a batch (docs/json-contract.md): "syncing N" shows from the
  // batch's first file on the server until its end, so a single small file goes straight to
  // "up to date". A batch of large files keeps "syncing" up long enough for the workbench to paint.
  step('four 16 MiB files in one batch: syncing, then up to date');
  const mark = (await history(page)).length;
  const names = ['w0.bin', 'w1.bin', 'w2.bin', 'w3.bin'];
  // written beside the project, then moved in, so that they land in the same batch
  const stage = fs.mkdtempSync(path.join(path.dirname(env.project), 'stage-'));
  for (const n of names) fs.writeFileSync(path.join(stage, n), crypto.randomBytes(16 << 20));
  for (const n of names) fs.renameSync(path.join(stage, n), path.join(env.project, n));
  await waitForStates(page, mark, [/syncing \d/, /up to date/], 'syncing, then up to date');
  const size = (n) =>
    fs.existsSync(path.join(env.remote, n)) ? fs.statSync(path.join(env.remote, n)).size : -1;
  await until(() => names.every((n) => size(n) === 16 << 20), 'the four files on the server');
  await screenshot(page, 'status-bar', '#workbench\\.parts\\.statusbar');
}

async function conflict(page) {
  step('edit edited.py on the server, then save another version in the editor');
  fs.writeFileSync(path.join(env.remote, 'edited.py'), 'x = "changed on the server"\n');
  const mark = (await history(page)).length;
  await editAndSave(page, 'edited.py', 'x = 42\n');
  // The "conflict" state and the "idle" that ends its batch arrive together, and the workbench
  // paints the last: what the user sees is the notification and the item's problem count.
  await waitForStates(page, mark, [/up to date \(1 problem\)/], 'the problem count');
  const note = await page.waitForFunction(
    () =>
      [...document.querySelectorAll('.notification-list-item-message')]
        .map((e) => e.textContent)
        .find((t) => /conflict on edited\.py/.test(t)),
    { timeout: WAIT_MS, polling: 100 },
  );
  assert.match(await note.jsonValue(), /kept as edited\.py\.gpusync-conflict-/);
  await screenshot(page, 'conflict');
  await until(() => remoteFile('edited.py') === 'x = 42\n', 'the editor copy on the server');
  const kept = fs
    .readdirSync(env.remote)
    .filter((f) => f.startsWith('edited.py.gpusync-conflict-'));
  assert.equal(kept.length, 1, `one server copy kept: ${kept}`);
  assert.equal(remoteFile(kept[0]), 'x = "changed on the server"\n');
}

async function runJob(page) {
  fs.appendFileSync(
    path.join(env.project, '.gpusync', 'config'),
    '\n[job "hello"]\n\tcommand = echo hello from rank $RANK of $WORLD_SIZE\n',
  );
  await runCommand(page, 'gpusync: Run Job');
  await pickInQuickInput(page, 'hello', 'hello');
  await pickInQuickInput(page, '2 CPU', '2 CPU ranks');
  step('wait for both ranks in the "gpusync logs" output channel');
  try {
    await until(async () => {
      const t = await outputText(page);
      return (
        /hello from rank 0 of 2/.test(t) &&
        /hello from rank 1 of 2/.test(t) &&
        /exit status 0/.test(t)
      );
    }, "the ranks' output");
  } catch (e) {
    throw new Error(
      `${e.message}; the Output panel shows: ${JSON.stringify(await outputText(page))}`,
    );
  }
  await screenshot(page, 'logs-channel');
}

async function stopRun(page) {
  const started = cliJson(['run', '--cpu', '1', '--detach', '--', 'sleep', '120']);
  assert.equal(started.ok, true);
  const state = () => (cliJson(['ps']).runs.find((r) => r.id === started.id) || {}).state;
  try {
    await runCommand(page, 'gpusync: Stop Run');
    await pickInQuickInput(page, started.id, started.id);
    await until(() => state() && state() !== 'running', `run ${started.id} to stop`);
  } finally {
    if (state() === 'running') cliJson(['stop', started.id]); // not left behind when this failed
  }
}

async function showGpus(page) {
  await runCommand(page, 'gpusync: Show GPUs');
  try {
    await page.waitForFunction(
      (sel) => /GPU\d|no GPUs/.test((document.querySelector(sel) || {}).textContent || ''),
      { timeout: WAIT_MS, polling: 100 },
      GPU_ITEM,
    );
  } catch (e) {
    throw new Error(`the GPU status bar item never showed a summary (${e.message})`);
  }
}

async function main() {
  const browser = await puppeteer.launch({
    executablePath: env.chromium,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--window-size=1400,900'],
  });
  let page;
  try {
    page = await openWorkbench(browser);
    await watchAndEdit(page);
    await conflict(page);
    await runJob(page);
    await stopRun(page);
    await showGpus(page);
    step(`status bar history: ${JSON.stringify(await history(page))}`);
    console.log('drive.js: ok');
  } catch (e) {
    if (page) await screenshot(page, 'failure').catch(() => {});
    throw e;
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(`drive.js: FAILED: ${e.stack || e.message}`);
  process.exit(1);
});
