// test/units.test.js: the pure parts of the extension, without the CLI: the status-bar state
// machine (lib/syncstate.js), the job list read from .gpusync/config (lib/config.js) and the
// line and reply handling of lib/cli.js.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const { SyncState } = require('../lib/syncstate');
const { parseJobs } = require('../lib/config');
const cli = require('../lib/cli');

test('syncing N counts the paths synced since the last idle, then up to date', () => {
  const s = new SyncState();
  s.applyStatus({ v: 1, ok: true, daemon: true, state: 'up_to_date', target: 'root@h:22' });
  s.applyEvent({ v: 1, event: 'synced', path: 'a.py', ms: 4 });
  s.applyEvent({ v: 1, event: 'renamed', path: 'c.py', from: 'b.py' });
  assert.match(s.view().text, /syncing 2$/);
  s.applyEvent({ v: 1, event: 'idle' });
  assert.match(s.view().text, /up to date$/);
  s.applyEvent({ v: 1, event: 'deleted', path: 'c.py' });
  assert.match(s.view().text, /syncing 1$/);
});

test('a batch under way (progress) reads syncing with its planned operations until idle', () => {
  const s = new SyncState();
  s.applyStatus({ v: 1, ok: true, daemon: true, state: 'up_to_date', target: 'root@h:22' });
  s.applyEvent({
    v: 1,
    event: 'progress',
    ops_done: 0,
    ops_total: 1,
    bytes: 1048576,
    bytes_total: 3145728,
  });
  assert.match(s.view().text, /syncing 1$/);
  assert.match(s.view().tooltip, /1\.0 of 3\.0 MiB sent/);
  s.applyEvent({ v: 1, event: 'synced', path: 'big.bin', ms: 900 });
  assert.match(s.view().text, /syncing 1$/);
  s.applyEvent({ v: 1, event: 'idle' });
  assert.match(s.view().text, /up to date$/);
});

test('a conflict is returned for a notification and stays as a problem count until acknowledged', () => {
  const s = new SyncState();
  const p = s.applyEvent({
    v: 1,
    event: 'conflict',
    path: 'x.py',
    kept: 'x.py.gpusync-conflict-1',
  });
  assert.deepEqual([p.kind, p.path, p.detail], ['conflict', 'x.py', 'x.py.gpusync-conflict-1']);
  assert.match(s.view().text, /conflict x\.py/);
  assert.equal(s.view().severity, 'warning');
  s.applyEvent({ v: 1, event: 'idle' });
  assert.match(s.view().text, /up to date \(1 problem\)/);
  assert.ok(s.details().some((l) => l === 'conflict: x.py — x.py.gpusync-conflict-1'));
  s.acknowledge();
  assert.doesNotMatch(s.view().text, /problem/);
});

test('conflict copies come from status and conflict events, and outlive the daemon', () => {
  const s = new SyncState();
  s.applyStatus({ v: 1, ok: true, daemon: false, state: 'pending', conflicts: [] });
  s.applyEvent({ v: 1, event: 'conflict', path: 'a.py', kept: 'a.py.gpusync-conflict-1' });
  s.applyEvent({ v: 1, event: 'conflict', path: 'a.py', kept: 'a.py.gpusync-conflict-1' });
  s.applyEvent({ v: 1, event: 'idle' });
  s.acknowledge();
  assert.match(s.view().text, /up to date \| 1 conflict copy$/);
  assert.equal(s.view().severity, 'warning');
  s.stopped();
  s.applyStatus({
    v: 1,
    ok: true,
    daemon: false,
    conflicts: [
      { path: 'a.py', kept: 'a.py.gpusync-conflict-1' },
      { path: 'b.py', kept: 'b.py.gpusync-conflict-2' },
    ],
  });
  assert.match(s.view().text, /not watching \| 2 conflict copies$/);
  assert.match(s.details().pop(), /b\.py \(the server's copy is b\.py\.gpusync-conflict-2\)$/);
  s.applyStatus({ v: 1, ok: true, daemon: false, conflicts: [] });
  assert.doesNotMatch(s.view().text, /conflict/);
});

test('an error is reported once until it clears, not at every retry of the daemon', () => {
  const s = new SyncState();
  const err = { v: 1, event: 'error', path: 'ro/b.txt', message: 'permission denied' };
  assert.equal(s.applyEvent(err).kind, 'error');
  assert.equal(s.applyEvent(err), null);
  assert.match(s.view().text, /error ro\/b\.txt/);
  assert.equal(s.applyEvent({ ...err, message: 'no space left' }).detail, 'no space left');
  s.applyEvent({ v: 1, event: 'synced', path: 'ro/b.txt', ms: 3 });
  assert.equal(s.applyEvent(err).kind, 'error');
  s.applyEvent({ v: 1, event: 'idle' });
  assert.equal(s.applyEvent(err).kind, 'error');
  s.stopped();
  assert.equal(s.applyEvent(err).kind, 'error');
  assert.equal(s.problems.length, 5);
});

test('errors, disconnection and the end of the stream each have their own look', () => {
  const s = new SyncState();
  const p = s.applyEvent({ v: 1, event: 'error', path: 'big.bin', message: 'disk full' });
  assert.equal(p.kind, 'error');
  assert.match(s.view().text, /error big\.bin/);
  assert.equal(s.view().severity, 'error');
  s.applyEvent({ v: 1, event: 'disconnected', message: 'connection reset' });
  assert.match(s.view().text, /disconnected/);
  assert.match(s.view().tooltip, /connection reset/);
  s.applyEvent({ v: 1, event: 'connected', target: 'root@h:22' });
  assert.match(s.view().text, /connected/);
  assert.equal(s.applyEvent({ v: 1, event: 'from-the-future' }), null);
  s.stopped();
  assert.match(s.view().text, /not watching/);
});

test('status without a daemon means not watching; a disconnected daemon shows as such', () => {
  const s = new SyncState();
  s.applyStatus({ v: 1, ok: true, daemon: false, state: 'pending', pending: 3, ops: [] });
  assert.match(s.view().text, /not watching/);
  s.applyStatus({ v: 1, ok: true, daemon: true, state: 'disconnected', last_error: 'refused' });
  assert.match(s.view().text, /disconnected/);
});

test('jobs come from [job "NAME"] sections, with inline comments dropped', () => {
  const jobs = parseJobs(
    [
      '# gpusync project configuration',
      '[remote]',
      '\thost = h',
      '[job "train"]',
      'command = python train.py --epochs 10   # ten is enough',
      'gpus = 2',
      '[sync]',
      'exclude = data/',
      '[job "eval"]',
      '\tcommand = python eval.py',
    ].join('\n'),
  );
  assert.deepEqual(jobs, [
    { name: 'train', command: 'python train.py --epochs 10', gpus: '2' },
    { name: 'eval', command: 'python eval.py', gpus: null },
  ]);
});

test('--json goes right after the command name, before any TARGET or -- CMD', () => {
  assert.deepEqual(cli.jsonArgs(['run', '--cpu', '2', 'hello', '--', 'x']), [
    'run',
    '--json',
    '--cpu',
    '2',
    'hello',
    '--',
    'x',
  ]);
});

test('only contract lines of the known version are read; lines are split across chunks', () => {
  assert.equal(cli.parseContractLine('{"v":2,"ok":true}'), null);
  assert.equal(cli.parseContractLine('hello'), null);
  assert.deepEqual(cli.parseContractLine('{"v":1,"event":"idle"}'), { v: 1, event: 'idle' });
  const lines = [];
  const split = cli.lineSplitter((l) => lines.push(l));
  split.push(Buffer.from('{"v":1,"ev'));
  split.push(Buffer.from('ent":"idle"}\n{"v":1}\r\npartial'));
  split.end();
  assert.deepEqual(lines, ['{"v":1,"event":"idle"}', '{"v":1}', 'partial']);
});

test('a reply with ok false becomes an error that carries the contract error name', async () => {
  // a two-line script stands in for gpusync: it prints an error reply and exits 4
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gs-vscode-unit-'));
  const fakeBin = path.join(dir, 'gpusync');
  fs.writeFileSync(
    fakeBin,
    '#!/bin/sh\necho \'{"v":1,"ok":false,"error":"cannot connect","message":"no route"}\'; exit 4\n',
    { mode: 0o755 },
  );
  try {
    await assert.rejects(cli.runJson(fakeBin, ['push']), (e) => {
      assert.equal(e.errorName, 'cannot connect');
      assert.equal(e.message, 'no route');
      assert.equal(e.code, 4);
      return true;
    });
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('the project is found in the folder or a parent, as the CLI finds it', () => {
  const { findProject } = require('../lib/config');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gs-vscode-unit-'));
  try {
    fs.mkdirSync(path.join(dir, '.gpusync'));
    fs.writeFileSync(path.join(dir, '.gpusync', 'config'), '[job "a"]\ncommand = true\n');
    fs.mkdirSync(path.join(dir, 'src', 'deep'), { recursive: true });
    assert.equal(findProject(path.join(dir, 'src', 'deep')), dir);
    assert.equal(findProject(os.tmpdir()), null);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a stop says what the daemon left unsent, not only that it stopped', () => {
  const { stoppedMessage } = require('../lib/syncstate');
  assert.equal(stoppedMessage({ was_running: false }), 'gpusync: no watch was running');
  assert.equal(
    stoppedMessage({ was_running: true, unsent: 0, unchecked: false }),
    'gpusync: stopped watching',
  );
  assert.match(stoppedMessage({ was_running: true, unsent: 1 }), /1 change was not sent/);
  assert.match(stoppedMessage({ was_running: true, unsent: 3 }), /3 changes were not sent/);
  assert.match(stoppedMessage({ was_running: true, unsent: 0, unchecked: true }), /before every/);
});
