// lib/cli.js: every call the extension makes to the gpusync CLI goes through here: spawn() with
// an argument vector (never a shell string), JSON replies parsed as docs/json-contract.md says,
// and long-running commands (events, logs -f) read line by line.
'use strict';

const { spawn } = require('child_process');

// The contract version this extension understands (docs/json-contract.md, "v").
const CONTRACT_VERSION = 1;

// An error from the CLI: `name` is the contract's "error" field (for example "unknown host
// key"), `message` its "message" or the CLI's stderr, `code` the exit status.
class GpusyncError extends Error {
  constructor(message, name, code, reply) {
    super(message);
    this.errorName = name || null;
    this.code = code;
    this.reply = reply || null;
  }
}

// Splits a byte stream into lines; calls onLine(text) for each complete line.
function lineSplitter(onLine) {
  let pending = '';
  return {
    push(chunk) {
      pending += chunk.toString('utf8');
      let nl;
      while ((nl = pending.indexOf('\n')) >= 0) {
        const line = pending.slice(0, nl).replace(/\r$/, '');
        pending = pending.slice(nl + 1);
        onLine(line);
      }
    },
    end() {
      if (pending.length) onLine(pending);
      pending = '';
    },
  };
}

// Parses one line of --json output; returns the object, or null when the line is not one of ours
// (another version or not JSON at all).
function parseContractLine(line) {
  let obj;
  try {
    obj = JSON.parse(line);
  } catch (e) {
    return null;
  }
  if (!obj || typeof obj !== 'object' || obj.v !== CONTRACT_VERSION) return null;
  return obj;
}

// Runs `bin args` in `cwd` to completion. `input` is written to stdin (then closed). Resolves
// {code, stdout, stderr}; rejects only when the program cannot be started.
function run(bin, args, { cwd, input, env } = {}) {
  return new Promise((resolve, reject) => {
    let child;
    try {
      child = spawn(bin, args, { cwd, env: env || process.env, stdio: ['pipe', 'pipe', 'pipe'] });
    } catch (e) {
      reject(new GpusyncError(`cannot start ${bin}: ${e.message}`, 'spawn', -1));
      return;
    }
    const out = [];
    const err = [];
    child.stdout.on('data', (d) => out.push(d));
    child.stderr.on('data', (d) => err.push(d));
    child.on('error', (e) =>
      reject(new GpusyncError(`cannot start ${bin}: ${e.message} (set gpusync.path)`, 'spawn', -1)),
    );
    child.on('close', (code, signal) =>
      resolve({
        code: code === null ? 128 + (signal ? 15 : 0) : code,
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
      }),
    );
    child.stdin.on('error', () => {}); // the command may exit without reading its input
    child.stdin.end(input || '');
  });
}

// `CMD --json ARGS...`: --json goes right after the command name, so it is never taken for a
// TARGET's argument or part of `-- CMD` (run stops parsing options at its first operand).
function jsonArgs(args) {
  return [args[0], '--json'].concat(args.slice(1));
}

// Runs a --json command and returns its reply object (the last contract line on stdout). A reply
// with "ok": false, or no reply at all, rejects with a GpusyncError naming what failed.
async function runJson(bin, args, opts) {
  const r = await run(bin, jsonArgs(args), opts);
  const lines = r.stdout.split('\n').filter((l) => l.trim());
  let reply = null;
  for (const l of lines) reply = parseContractLine(l) || reply;
  const stderr = r.stderr.trim();
  if (!reply) {
    throw new GpusyncError(
      stderr || `gpusync ${args[0]} exited with status ${r.code} and no JSON reply`,
      null,
      r.code,
    );
  }
  if (reply.ok === false) {
    throw new GpusyncError(reply.message || reply.error || 'failed', reply.error, r.code, reply);
  }
  reply.exitCode = r.code;
  return reply;
}

// Starts a long-running command and calls onLine(text) per stdout line and onErrLine per stderr
// line; onExit(code) when it ends. Returns the child (kill() it to stop following).
function follow(bin, args, { cwd, onLine, onErrLine, onExit, env }) {
  const child = spawn(bin, args, {
    cwd,
    env: env || process.env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const out = lineSplitter(onLine);
  const err = lineSplitter(onErrLine || (() => {}));
  child.stdout.on('data', (d) => out.push(d));
  child.stderr.on('data', (d) => err.push(d));
  let done = false;
  const finish = (code) => {
    if (done) return;
    done = true;
    out.end();
    err.end();
    if (onExit) onExit(code);
  };
  child.on('error', (e) => {
    if (onErrLine) onErrLine(`cannot start ${bin}: ${e.message} (set gpusync.path)`);
    finish(-1);
  });
  child.on('close', (code, signal) => finish(code === null ? (signal ? 143 : 1) : code));
  return child;
}

module.exports = {
  CONTRACT_VERSION,
  GpusyncError,
  lineSplitter,
  parseContractLine,
  run,
  jsonArgs,
  runJson,
  follow,
};
