// test/vscode-fake.js: a small stand-in for the `vscode` module, for the quick tests (the real VS
// Code test is ../test-real.sh, which runs code-server in headless Chromium). It implements just
// the API the extension uses, records everything the extension shows (status bar text, output
// channels, notifications) and answers prompts from queues the tests fill. Every visible change
// emits 'change' on `fake.changes`, so tests wait for what a user would see instead of sleeping.
'use strict';

const { EventEmitter } = require('events');

const changes = new EventEmitter();
changes.setMaxListeners(100);

const fake = {
  changes,
  commands: new Map(), // id -> handler
  statusItems: [],
  channels: new Map(), // name -> channel
  messages: [], // {level, text, items}
  answers: { inputBox: [], quickPick: [], message: [] }, // queues of answers (values or functions)
  settings: {}, // "gpusync.path" -> value
  workspaceFolders: [],
  activeTextEditor: undefined,
  listeners: { activeEditor: new Set(), folders: new Set() },
};

function changed(what) {
  changes.emit('change', what);
}

// Takes the next answer from a queue; a function is called with the prompt's arguments.
function answer(queue, ...args) {
  if (!queue.length) return undefined;
  const a = queue.shift();
  return typeof a === 'function' ? a(...args) : a;
}

class Disposable {
  constructor(fn) {
    this.fn = fn;
  }
  dispose() {
    if (this.fn) this.fn();
    this.fn = null;
  }
}

class ThemeColor {
  constructor(id) {
    this.id = id;
  }
}

// Both of VS Code's overloads: (alignment, priority) and (id, alignment, priority).
function createStatusBarItem(...args) {
  const id = typeof args[0] === 'string' ? args.shift() : undefined;
  const [alignment, priority] = args;
  let text = '';
  const item = {
    id,
    name: undefined,
    alignment,
    priority,
    history: [], // every text it has shown, in order
    tooltip: undefined,
    command: undefined,
    backgroundColor: undefined,
    visible: false,
    get text() {
      return text;
    },
    set text(t) {
      text = t;
      item.history.push(t);
      changed('status');
    },
    show() {
      item.visible = true;
    },
    hide() {
      item.visible = false;
    },
    dispose() {
      item.visible = false;
    },
  };
  fake.statusItems.push(item);
  return item;
}

// An event of the API: subscribing adds `fn` to `set` until the returned Disposable is disposed.
function event(set) {
  return (fn) => {
    set.add(fn);
    return new Disposable(() => set.delete(fn));
  };
}

// The user opens `file` in an editor (it becomes the active one).
function openEditor(file) {
  fake.activeTextEditor = { document: { uri: { fsPath: file, scheme: 'file' } } };
  for (const fn of [...fake.listeners.activeEditor]) fn(fake.activeTextEditor);
  changed('editor');
}

// The user adds or removes workspace folders: `dirs` (paths) are the folders from now on.
function setWorkspaceFolders(dirs) {
  const before = fake.workspaceFolders;
  fake.workspaceFolders = dirs.map((d, index) => ({
    uri: { fsPath: d },
    name: require('path').basename(d),
    index,
  }));
  const has = (list, f) => list.some((g) => g.uri.fsPath === f.uri.fsPath);
  const change = {
    added: fake.workspaceFolders.filter((f) => !has(before, f)),
    removed: before.filter((f) => !has(fake.workspaceFolders, f)),
  };
  for (const fn of [...fake.listeners.folders]) fn(change);
  changed('folders');
}

// The workspace folder that holds `uri`, as VS Code picks it (the innermost).
function getWorkspaceFolder(uri) {
  const inside = (dir) => uri.fsPath === dir || uri.fsPath.startsWith(`${dir}/`);
  const holding = fake.workspaceFolders.filter((f) => inside(f.uri.fsPath));
  holding.sort((a, b) => b.uri.fsPath.length - a.uri.fsPath.length);
  return holding[0];
}

function createOutputChannel(name) {
  const ch = {
    name,
    text: '',
    shown: false,
    append(s) {
      ch.text += s;
      changed('output');
    },
    appendLine(s) {
      ch.append(`${s}\n`);
    },
    clear() {
      ch.text = '';
    },
    show() {
      ch.shown = true;
    },
    hide() {
      ch.shown = false;
    },
    dispose() {},
  };
  fake.channels.set(name, ch);
  return ch;
}

function message(level) {
  return (text, ...items) => {
    fake.messages.push({ level, text, items });
    changed('message');
    return Promise.resolve(answer(fake.answers.message, text, items));
  };
}

const vscode = {
  Disposable,
  ThemeColor,
  StatusBarAlignment: { Left: 1, Right: 2 },
  commands: {
    registerCommand(id, fn) {
      if (fake.commands.has(id)) throw new Error(`command '${id}' already exists`);
      fake.commands.set(id, fn);
      return new Disposable(() => fake.commands.delete(id));
    },
    executeCommand(id, ...args) {
      const fn = fake.commands.get(id);
      if (!fn) return Promise.reject(new Error(`command '${id}' not found`));
      return Promise.resolve(fn(...args));
    },
    getCommands() {
      return Promise.resolve([...fake.commands.keys()]);
    },
  },
  window: {
    createStatusBarItem,
    createOutputChannel,
    showInformationMessage: message('info'),
    showWarningMessage: message('warning'),
    showErrorMessage: message('error'),
    showQuickPick(items, options) {
      return Promise.resolve(items).then((list) => answer(fake.answers.quickPick, list, options));
    },
    showInputBox(options) {
      return Promise.resolve(answer(fake.answers.inputBox, options));
    },
    get activeTextEditor() {
      return fake.activeTextEditor;
    },
    onDidChangeActiveTextEditor: event(fake.listeners.activeEditor),
  },
  workspace: {
    get workspaceFolders() {
      return fake.workspaceFolders;
    },
    getWorkspaceFolder,
    onDidChangeWorkspaceFolders: event(fake.listeners.folders),
    getConfiguration(section) {
      return {
        get(key, def) {
          const v = fake.settings[`${section}.${key}`];
          return v === undefined ? def : v;
        },
      };
    },
  },
};

// The extension context activate() receives.
function makeContext() {
  return { subscriptions: [], extensionPath: require('path').join(__dirname, '..') };
}

// Lets `require('vscode')` anywhere resolve to this fake.
function install() {
  const Module = require('module');
  const resolve = Module._resolveFilename;
  Module._resolveFilename = function (request, ...rest) {
    if (request === 'vscode') return __filename;
    return resolve.call(this, request, ...rest);
  };
}

module.exports = vscode;
module.exports.fake = fake;
module.exports.makeContext = makeContext;
module.exports.install = install;
module.exports.openEditor = openEditor;
module.exports.setWorkspaceFolders = setWorkspaceFolders;
