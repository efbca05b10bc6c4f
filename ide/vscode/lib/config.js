// lib/config.js: reads the job list from .gpusync/config (git-config-style INI, see README.md) for
// the Run Job quick pick. Only [job "NAME"] sections matter here; the CLI stays the authority on
// the file (a job it rejects is reported by `gpusync run`).
'use strict';

const fs = require('fs');
const path = require('path');

// Strips an inline comment (" # ..." or " ; ...") and surrounding blanks from a value.
function cleanValue(raw) {
  return raw.replace(/\s+[#;].*$/, '').trim();
}

// Returns [{name, command, gpus}] in file order, from the text of a config file.
function parseJobs(text) {
  const jobs = [];
  let job = null;
  for (const rawLine of text.split(/\r?\n/)) {
    const line = rawLine.trim();
    if (!line || line.startsWith('#') || line.startsWith(';')) continue;
    const section = /^\[\s*([^\s\]"]+)(?:\s+"([^"]*)")?\s*\]$/.exec(line);
    if (section) {
      job =
        section[1] === 'job' && section[2] !== undefined
          ? { name: section[2], command: null, gpus: null }
          : null;
      if (job) jobs.push(job);
      continue;
    }
    const kv = /^([A-Za-z0-9_-]+)\s*=\s*(.*)$/.exec(line);
    if (job && kv) {
      if (kv[1] === 'command') job.command = cleanValue(kv[2]);
      else if (kv[1] === 'gpus') job.gpus = cleanValue(kv[2]);
    }
  }
  return jobs;
}

// The project root for a folder: the folder or its nearest parent with a .gpusync/config, as the
// CLI finds it (like git); null when there is none.
function findProject(dir) {
  for (
    let d = dir ? path.resolve(dir) : null;
    d;
    d = path.dirname(d) === d ? null : path.dirname(d)
  )
    if (fs.existsSync(path.join(d, '.gpusync', 'config'))) return d;
  return null;
}

function hasProject(dir) {
  return findProject(dir) !== null;
}

// The jobs of the project that holds `dir`; [] when there is none or it cannot be read.
function readJobs(dir) {
  try {
    return parseJobs(fs.readFileSync(path.join(findProject(dir), '.gpusync', 'config'), 'utf8'));
  } catch (e) {
    return [];
  }
}

module.exports = { parseJobs, readJobs, hasProject, findProject };
