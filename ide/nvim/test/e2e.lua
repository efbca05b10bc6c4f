-- test/e2e.lua: drives the plugin inside the real `nvim --headless` against the sandbox server
-- (started by ../test.sh, which sets GS_PROJECT, GS_REMOTE and GPUSYNC_BIN). Each step waits for
-- an observable result (a file on the server, a buffer line, a notification) with vim.wait, which
-- runs the event loop, so job callbacks arrive while it waits. GS_NVIM_STEPS limits the steps
-- ("login", "slow", "sync", "run" or "reattach"; default all).
local gs = require('gpusync')
local project, remote = vim.env.GS_PROJECT, vim.env.GS_REMOTE
local only = vim.env.GS_NVIM_STEPS or 'login,slow,sync,run,reattach'
local failures, notes = 0, {}

-- Every notification, kept for assertions and echoed for the test log.
vim.notify = function(msg, level)
  table.insert(notes, { msg = msg, level = level or vim.log.levels.INFO })
  io.stdout:write(string.format('  notify[%d] %s\n', level or 2, msg))
end

local function ok(cond, what)
  io.stdout:write((cond and 'ok     ' or 'FAILED ') .. what .. '\n')
  if not cond then
    failures = failures + 1
  end
  return cond
end

local function wait(ms, cond)
  return vim.wait(ms, cond, 20)
end

-- The first notification containing text (a Lua pattern when pattern is true) at level.
local function noted(text, level, pattern)
  for _, n in ipairs(notes) do
    if n.msg:find(text, 1, not pattern) and (not level or n.level == level) then
      return n
    end
  end
  return nil
end

local function read(path)
  local f = io.open(path, 'r')
  if not f then
    return nil
  end
  local s = f:read('*a')
  f:close()
  return s
end

local function write(path, text)
  local f = assert(io.open(path, 'w'))
  f:write(text)
  f:close()
end

local function buffer_text(name)
  local buf = vim.fn.bufnr(name)
  if buf == -1 then
    return ''
  end
  return table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
end

local function has_event(kind, path)
  for _, ev in ipairs(gs.state.events) do
    if ev.event == kind and (not path or ev.path == path) then
      return true
    end
  end
  return false
end

-- :Gpusync stop, then wait until the daemon has exited and released its lock (watch --stop
-- returns before that), so that the next :Gpusync watch starts a new one.
local function stop_and_wait()
  local out = vim.fn.system({ 'sh', '-c', 'cd "$1" && exec "$2" status --json', 'sh', gs.root(), vim.env.GPUSYNC_BIN })
  local okj, st = pcall(vim.fn.json_decode, out)
  st = okj and st or nil
  vim.cmd('Gpusync stop')
  ok(wait(10000, function() return gs.state.events_job == nil end), 'the daemon stops')
  if type(st) == 'table' and st.pid then
    wait(10000, function() return vim.loop.kill(st.pid, 0) ~= 0 end)
  end
end

local function step_sync()
  vim.cmd('Gpusync watch')
  ok(wait(60000, function() return noted('watching (daemon pid') ~= nil end), ':Gpusync watch starts the daemon')
  ok(wait(10000, function() return gs.state.events_job ~= nil and gs.state.sync ~= 'connecting' end),
    'the event stream is followed and the state seeded from status --json')

  vim.cmd('edit ' .. project .. '/hello.py')
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { 'print("hello from nvim")' })
  vim.cmd('silent write')
  local want = 'print("hello from nvim")\n'
  ok(wait(15000, function() return read(remote .. '/hello.py') == want end),
    ':w puts the buffer on the server (' .. remote .. '/hello.py)')
  ok(wait(10000, function() return has_event('synced', 'hello.py') end), 'a "synced" event names hello.py')
  ok(wait(10000, function() return gs.statusline():find('up to date') ~= nil end),
    'the statusline reads "up to date" (' .. gs.statusline() .. ')')

  vim.cmd('Gpusync push')
  ok(wait(20000, function() return noted('pushed: sent') ~= nil end), ':Gpusync push reports what it sent')
  -- the push fenced the daemon's agent out (one writer per server tree), so the daemon
  -- reconnects and re-checks the tree: ask again until it has settled, as a user would
  local asked = 0
  ok(wait(10000, function()
    if noted('up_to_date, connected') then return true end
    if vim.loop.now() - asked > 1000 then
      asked = vim.loop.now()
      vim.cmd('Gpusync status')
    end
    return false
  end), ':Gpusync status reports the daemon state')
  vim.cmd('Gpusync doctor')
  ok(wait(30000, function() return buffer_text('gpusync://doctor'):find('%[ok') ~= nil end),
    ':Gpusync doctor fills gpusync://doctor with checks')

  -- The server has a directory where we save a file: the directory is kept as a conflict copy.
  vim.fn.mkdir(remote .. '/clash', 'p')
  write(remote .. '/clash/keep', 'x')
  vim.cmd('edit ' .. project .. '/clash')
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { 'a file here, a directory there' })
  vim.cmd('silent write')
  ok(wait(15000, function() return noted('conflict on clash', vim.log.levels.WARN) ~= nil end),
    'a conflict raises a warning naming the file')
  ok(gs.statusline():find('conflict clash', 1, true) ~= nil, 'the statusline shows the conflict (' .. gs.statusline() .. ')')
  ok(wait(15000, function() return read(remote .. '/clash') == 'a file here, a directory there\n' end),
    'after the conflict the server has the saved buffer')
  ok(gs.statusline():find('| 1 conflict copy', 1, true) ~= nil,
    'the statusline counts the conflict copies kept on the server (' .. gs.statusline() .. ')')
  vim.cmd('Gpusync status')
  ok(wait(10000, function() return noted("clash (the server's copy is clash.gpusync-conflict-", vim.log.levels.WARN) ~= nil end),
    ':Gpusync status lists the conflict copy')
  -- An editor that starts after the conflict learns of it from status --json.
  gs.state.conflicts = {}
  stop_and_wait()
  vim.cmd('Gpusync watch')
  ok(wait(30000, function() return gs.statusline():find('| 1 conflict copy', 1, true) ~= nil end),
    'a fresh watch shows the conflict copy recorded before (' .. gs.statusline() .. ')')
  vim.fn.system({ vim.env.GPUSYNC_BIN, 'status', '--ack', '--json' })
  vim.cmd('Gpusync status')
  ok(wait(10000, function() return gs.statusline():find('conflict cop', 1, true) == nil end),
    'once acknowledged (status --ack) the count goes (' .. gs.statusline() .. ')')

  -- A directory gpusync made is replaced on the server by a link into /proc, where nothing can be
  -- created: the next save into it fails, with an error notification.
  vim.fn.mkdir(project .. '/ro', 'p')
  write(project .. '/ro/a.txt', 'a\n')
  ok(wait(15000, function() return read(remote .. '/ro/a.txt') == 'a\n' end), 'a new folder reaches the server')
  vim.fn.delete(remote .. '/ro', 'rf')
  vim.loop.fs_symlink('/proc/1', remote .. '/ro')
  vim.cmd('edit ' .. project .. '/ro/b.txt')
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { 'b' })
  vim.cmd('silent write')
  ok(wait(15000, function() return noted('error on ro/b.txt', vim.log.levels.ERROR) ~= nil end),
    'a failed upload raises an error naming the file')
  ok(gs.statusline():find('error b.txt', 1, true) ~= nil, 'the statusline shows the error (' .. gs.statusline() .. ')')
  -- The daemon retries the upload every few seconds, and each retry sends the error again: the
  -- user is told once.
  local function count_errors()
    local events, notes_n = 0, 0
    for _, ev in ipairs(gs.state.events) do
      events = events + ((ev.event == 'error' and ev.path == 'ro/b.txt') and 1 or 0)
    end
    for _, n in ipairs(notes) do
      notes_n = notes_n + (n.msg:find('error on ro/b.txt', 1, true) and 1 or 0)
    end
    return events, notes_n
  end
  ok(wait(30000, function() return count_errors() >= 2 end), 'the daemon retried the failed upload')
  local events_n, notes_n = count_errors()
  ok(notes_n == 1, string.format('the same error is notified once (%d notifications for %d error events)', notes_n, events_n))
  os.remove(remote .. '/ro')
  vim.cmd('bwipeout!')
  vim.fn.delete(project .. '/ro', 'rf')
end

local function step_run()
  -- A [job] of the config, picked the way a user would: :Gpusync run with no arguments asks.
  local cfg = assert(io.open(project .. '/.gpusync/config', 'a'))
  cfg:write('\n[job "hello"]\n    command = echo "job hello on rank $RANK"\n')
  cfg:close()
  ok(vim.deep_equal(gs.jobs(), { 'hello', 'train' }), 'the jobs come from the config, plus train')
  local asked = {}
  vim.ui.select = function(items, _, on_choice)
    asked.items = items
    on_choice('hello')
  end
  vim.ui.input = function(_, on_confirm)
    on_confirm('cpu=2')
  end
  vim.cmd('Gpusync run')
  ok(wait(60000, function() return gs.state.last_run ~= nil end), ':Gpusync run with no arguments asks, then starts the job')
  ok(asked.items and vim.tbl_contains(asked.items, 'hello'), 'the choice offered the config\'s jobs')
  ok(wait(60000, function()
    local t = buffer_text('gpusync://logs/' .. gs.state.last_run)
    return t:find('job hello on rank 0') and t:find('job hello on rank 1') and t:find('ended: exit 0')
  end), 'the job ran on the 2 CPU ranks asked for, into its log buffer')
  gs.state.last_run = nil

  vim.cmd([[Gpusync run cpu=2 -- sh -c 'echo "hello from rank $RANK of $WORLD_SIZE"']])
  ok(wait(60000, function() return gs.state.last_run ~= nil end), ':Gpusync run starts a CPU run')
  local name = 'gpusync://logs/' .. tostring(gs.state.last_run)
  ok(wait(60000, function()
    local t = buffer_text(name)
    return t:find('hello from rank 0 of 2') and t:find('hello from rank 1 of 2')
  end), 'its log buffer fills with both ranks\' output')
  ok(wait(30000, function() return buffer_text(name):find('ended: exit 0') ~= nil end),
    'the log buffer says the run ended with exit 0')
  ok(vim.fn.bufwinid(name) ~= -1, 'the log buffer is shown in a window')
  ok(gs.statusline():find('run ' .. gs.state.last_run .. ': ended', 1, true) ~= nil,
    'the statusline names the run (' .. gs.statusline() .. ')')

  vim.cmd('Gpusync logs')
  ok(wait(30000, function()
    local t = buffer_text('gpusync://logs/latest')
    return t:find('hello from rank 1 of 2') and t:find('ended: exit 0')
  end), ':Gpusync logs follows the newest run in gpusync://logs/latest')

  local first = gs.state.last_run
  vim.cmd([[Gpusync run cpu=1 -- sh -c 'echo started; exec sleep 600']])
  ok(wait(60000, function() return gs.state.last_run ~= first and gs.state.run_active end), 'a long run starts')
  local long = 'gpusync://logs/' .. tostring(gs.state.last_run)
  ok(wait(30000, function() return buffer_text(long):find('started') ~= nil end), 'its log buffer shows it started')
  -- Following the same run again replaces the follower; the old one's end must not show.
  vim.cmd('Gpusync logs ' .. gs.state.last_run)
  ok(wait(30000, function() return buffer_text(long):find('started') ~= nil end), 'following it again refills its buffer')
  vim.cmd('Gpusync stoprun')
  ok(wait(30000, function() return noted('stopped run ' .. gs.state.last_run) ~= nil end),
    ':Gpusync stoprun stops it')
  ok(wait(30000, function() return buffer_text(long):find('ended: exit') ~= nil end),
    'the log follower ends when the run is stopped')
  ok(wait(10000, function() return noted('was stopped', vim.log.levels.WARN) ~= nil end),
    'a run stopped from here is reported as stopped, not as a failure')
  local _, ends = buffer_text(long):gsub('ended: exit', '')
  ok(ends == 1 and noted('ended with exit code') == nil,
    'the replaced follower left no end line or error behind (' .. ends .. ' end lines)')
  local ps = vim.fn.json_decode(vim.fn.system({ vim.env.GPUSYNC_BIN, 'ps', '--json' }))
  local state_of = {}
  for _, r in ipairs(ps.runs or {}) do
    state_of[r.id] = r.state
  end
  ok(state_of[gs.state.last_run] ~= nil and state_of[gs.state.last_run] ~= 'running',
    'gpusync ps no longer shows it running (' .. tostring(state_of[gs.state.last_run]) .. ')')
end

-- The second project, reached through the WAN simulator (../test-lib.sh): a large save over a slow
-- link, and a run's logs when the link is cut.
local function wansim(...)
  return vim.fn.system(vim.list_extend({ vim.env.GS_WANSIM, '--ctl', vim.env.GS_WANSIM_CTL }, { ... }))
end

local function step_slow()
  local slow, sremote = vim.env.GS_SLOW_PROJECT, vim.env.GS_SLOW_REMOTE
  if not slow then
    io.stdout:write('skip   the slow-link steps: no wansim in this build\n')
    return
  end
  vim.cmd('edit ' .. slow .. '/first.txt')
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { 'first' })
  vim.cmd('silent write')
  vim.cmd('Gpusync watch')
  ok(wait(60000, function() return gs.state.sync == 'up_to_date' end), 'the slow project is up to date')
  wansim('rate', '2')
  -- About 4 MB of hex (some 2 MB compressed) at 2 Mbit/s: several seconds on the link.
  vim.cmd('edit ' .. slow .. '/data.csv')
  math.randomseed(1)
  local lines = {}
  for i = 1, 40000 do
    local t = {}
    for j = 1, 12 do
      t[j] = string.format('%08x', math.random(0, 2 ^ 31))
    end
    lines[i] = table.concat(t, ',')
  end
  vim.api.nvim_buf_set_lines(0, 0, -1, false, lines)
  vim.cmd('silent write')
  local seen
  ok(wait(5000, function()
    seen = gs.statusline()
    return seen:find('syncing 1', 1, true) ~= nil and not vim.loop.fs_stat(sremote .. '/data.csv')
  end), 'while a large save is on its way the statusline reads "syncing 1" (' .. tostring(seen) .. ')')
  wansim('rate', '0')
  ok(wait(60000, function() return vim.loop.fs_stat(sremote .. '/data.csv') ~= nil and gs.state.sync == 'up_to_date' end),
    'once it is on the server the statusline reads "up to date" (' .. gs.statusline() .. ')')
  vim.cmd('bwipeout!')
  vim.cmd('edit ' .. slow .. '/first.txt')
  stop_and_wait()
  vim.cmd('edit ' .. project .. '/hello.py')
end

-- `logs -f` exits 1 when the server has no run yet and 255 when the connection fails: neither is
-- the end of a run.
local function step_lost()
  local slow = vim.env.GS_SLOW_PROJECT
  if not slow then
    io.stdout:write('skip   the cut-link steps: no wansim in this build\n')
    return
  end
  vim.cmd('edit ' .. slow .. '/first.txt')
  -- Before any run here: `logs -f` fails (exit 1), the CLI's error, not a run that ended.
  local buf = gs.logs()
  ok(wait(30000, function() return noted('logs of run latest failed', vim.log.levels.ERROR) ~= nil end),
    'logs with no run on the server says the CLI\'s error')
  ok(buffer_text('gpusync://logs/latest'):find('ended') == nil and noted('ended with exit code') == nil,
    'and does not say a run ended (' .. buffer_text('gpusync://logs/latest') .. ')')
  vim.api.nvim_buf_delete(buf, { force = true })

  -- A run goes on while its logs' connection fails: the log buffer must not call it ended.
  vim.cmd([[Gpusync run cpu=1 -- sh -c 'echo tick; exec sleep 600']])
  ok(wait(60000, function() return gs.state.last_run ~= nil and gs.state.run_active end), 'a long run starts')
  local id = gs.state.last_run
  local name = 'gpusync://logs/' .. tostring(id)
  ok(wait(30000, function() return buffer_text(name):find('tick') ~= nil end), 'its logs show it started')
  wansim('cut')
  gs.logs(id)
  ok(wait(30000, function() return buffer_text(name):find('lost the connection', 1, true) ~= nil end),
    'a follower whose connection fails says it lost the connection (' .. buffer_text(name) .. ')')
  ok(noted('lost the connection to the run\'s logs (it may still be running; :Gpusync logs ' .. id .. ' reattaches)',
    vim.log.levels.WARN) ~= nil, 'and warns that the run may still be running')
  ok(buffer_text(name):find('ended') == nil and noted('ended with exit code') == nil and
    gs.statusline():find(id .. ': running', 1, true) ~= nil,
    'nothing says the run ended (' .. gs.statusline() .. ')')
  wansim('restore')
  vim.cmd('Gpusync stoprun ' .. id)
  ok(wait(30000, function() return noted('stopped run ' .. id) ~= nil end), 'the run is stopped once the link is back')
  gs.state.last_run, gs.state.run_active = nil, false
  vim.cmd('edit ' .. project .. '/hello.py')
end

-- Two projects watched from one editor: each has its own event stream, and the statusline shows
-- the current buffer's project (here the slow project's link is cut: it cannot be up to date).
local function step_two()
  local slow = vim.env.GS_SLOW_PROJECT
  if not slow then
    io.stdout:write('skip   the two-project steps: no wansim in this build\n')
    return
  end
  wansim('cut')
  vim.cmd('edit ' .. project .. '/two.txt')
  vim.cmd('Gpusync watch')
  ok(wait(60000, function() return gs.state.sync == 'up_to_date' end), 'project A is up to date')
  local a_job = gs.state.events_job
  vim.cmd('edit ' .. slow .. '/two.txt')
  vim.cmd('Gpusync watch')
  ok(wait(30000, function() return gs.state.events_job ~= nil end), 'project B\'s events are followed too')
  ok(gs.state.events_job ~= a_job, 'by a stream of its own')
  ok(wait(10000, function() return gs.statusline():find('up to date', 1, true) == nil end),
    'in B, whose server is cut off, the statusline is not A\'s "up to date" (' .. gs.statusline() .. ')')
  vim.cmd('edit ' .. project .. '/two.txt')
  ok(gs.statusline():find('up to date', 1, true) ~= nil, 'back in A it reads A\'s "up to date" (' .. gs.statusline() .. ')')
  wansim('restore')
  vim.cmd('edit ' .. slow .. '/two.txt')
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { 'two' })
  vim.cmd('silent write')
  ok(wait(60000, function() return gs.state.sync == 'up_to_date' end),
    'once B\'s link is back B\'s own stream says up to date (' .. gs.statusline() .. ')')
  stop_and_wait()
  vim.cmd('edit ' .. project .. '/two.txt')
  ok(gs.state.events_job == a_job and gs.state.sync == 'up_to_date', 'stopping B leaves A\'s stream as it was')
  stop_and_wait()
  vim.cmd('edit ' .. project .. '/hello.py')
end

-- A first connection whose login is refused: the daemon was started from a HOME without the key,
-- so it never connects, and the stream never says so. The statusline must not stay "connecting…".
local function step_login()
  local nokey = vim.env.GS_WORK .. '/nokey'
  vim.fn.mkdir(nokey .. '/.ssh', 'p')
  write(nokey .. '/.ssh/known_hosts', read(vim.env.HOME .. '/.ssh/known_hosts') or '')
  vim.cmd('edit ' .. project .. '/login.txt')
  local home = vim.env.HOME
  vim.env.HOME = nokey
  vim.cmd('Gpusync watch')
  ok(wait(30000, function() return gs.state.events_job ~= nil end), 'a daemon that cannot log in is followed')
  vim.env.HOME = home
  ok(wait(10000, function() return gs.state.sync == 'disconnected' end),
    'a refused first login reads "disconnected", not "connecting…" (' .. gs.statusline() .. ')')
  ok(wait(5000, function() return noted('disconnected: authentication to', vim.log.levels.WARN) ~= nil end),
    'and a warning says why, in status --json\'s last_error')
  stop_and_wait()
  vim.cmd('edit ' .. project .. '/hello.py')
end

-- gpusync ARGS run from a shell in dir, outside the editor: its last JSON object, or {}.
local function outside(dir, ...)
  local out = vim.fn.system(vim.list_extend({ 'sh', '-c', 'cd "$1" && shift && exec "$@"', 'sh', dir,
    vim.env.GPUSYNC_BIN }, { ... }))
  local lines = vim.split(vim.trim(out), '\n')
  local okj, obj = pcall(vim.fn.json_decode, lines[#lines])
  return okj and type(obj) == 'table' and obj or {}
end

-- The pid of dir's daemon, or nil when none runs.
local function daemon_pid(dir)
  local st = outside(dir, 'status', '--json')
  return st.daemon == true and st.pid or nil
end

local function gone(pid)
  return wait(10000, function() return vim.loop.kill(pid, 0) ~= 0 end)
end

-- Saves the current buffer as text, then waits for dir's server copy and a "synced" event that
-- came after the save (the event list is emptied first).
local function save_reported(dir, rdir, name, text, what)
  gs.state.events = {}
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { text })
  vim.cmd('silent write')
  ok(wait(15000, function() return read(rdir .. '/' .. name) == text .. '\n' and has_event('synced', name) end),
    what .. ': a save reaches the server and is reported (' .. gs.statusline() .. ')')
end

-- The daemon's stream ends (killed, or stopped from a shell) and a daemon is started again from a
-- shell: the statusline reads "off" meanwhile, then follows the new daemon. setup() looks after
-- every project opened here, so a daemon started from a shell after the project was opened is
-- followed too.
local function step_reattach()
  gs.setup({})
  vim.cmd('edit ' .. project .. '/again.txt')
  vim.cmd('Gpusync watch')
  ok(wait(60000, function() return gs.state.sync == 'up_to_date' end), 'watching, up to date')

  local pid = daemon_pid(project)
  vim.loop.kill(pid, 'sigkill')
  ok(wait(10000, function() return gs.state.sync == 'off' and gs.state.events_job == nil end),
    'a killed daemon reads "off" (' .. gs.statusline() .. ')')
  gone(pid)
  ok(outside(project, 'watch', '-d', '--json').pid ~= nil, 'a daemon is started again from a shell')
  ok(wait(15000, function() return gs.statusline():find('gpusync: up to date', 1, true) ~= nil end),
    'after a kill, the daemon started from a shell is followed: "up to date" (' .. gs.statusline() .. ')')
  save_reported(project, remote, 'again.txt', 'after the kill', 'after a kill and a restart')

  pid = daemon_pid(project)
  ok(outside(project, 'watch', '--stop', '--json').was_running == true, 'the daemon is stopped from a shell')
  ok(wait(10000, function() return gs.state.sync == 'off' end),
    'a daemon stopped from a shell reads "off" (' .. gs.statusline() .. ')')
  gone(pid)
  ok(outside(project, 'watch', '-d', '--json').pid ~= nil, 'and started again from a shell')
  ok(wait(15000, function() return gs.statusline():find('gpusync: up to date', 1, true) ~= nil end),
    'after a stop, the daemon started from a shell is followed: "up to date" (' .. gs.statusline() .. ')')
  save_reported(project, remote, 'again.txt', 'after the restart', 'after a stop and a restart')

  -- :Gpusync stop holds (nothing here starts a daemon again), but one started from a shell later
  -- is followed, as any daemon of the project is.
  stop_and_wait()
  ok(gs.state.sync == 'off' and daemon_pid(project) == nil, ':Gpusync stop: "off", and no daemon runs')
  ok(outside(project, 'watch', '-d', '--json').pid ~= nil, 'a daemon is started from a shell after :Gpusync stop')
  ok(wait(15000, function() return gs.statusline():find('gpusync: up to date', 1, true) ~= nil end),
    'it is followed: "up to date" (' .. gs.statusline() .. ')')
  stop_and_wait()

  -- A project opened here that no daemon ever ran for in this editor.
  local other, oremote = vim.env.GS_SLOW_PROJECT, vim.env.GS_SLOW_REMOTE
  if other then
    vim.cmd('edit ' .. other .. '/late.txt')
    ok(gs.state.sync == 'off', 'a project opened with no daemon reads "off" (' .. gs.statusline() .. ')')
    ok(outside(other, 'watch', '-d', '--json').pid ~= nil, 'its daemon is started from a shell afterwards')
    ok(wait(15000, function() return gs.statusline():find('gpusync: up to date', 1, true) ~= nil end),
      'a daemon started from a shell after the project was opened is followed (' .. gs.statusline() .. ')')
    save_reported(other, oremote, 'late.txt', 'late', 'a daemon started after the project was opened')
    stop_and_wait()
  end
  vim.cmd('edit ' .. project .. '/hello.py')
end

-- The parts that need no server: argument parsing, completion, and the refusal outside a project.
local function step_offline()
  ok(vim.deep_equal(gs._split_words([[run cpu=2 -- sh -c 'echo "a b" $RANK']]),
    { 'run', 'cpu=2', '--', 'sh', '-c', 'echo "a b" $RANK' }), 'arguments split like a shell, quotes kept whole')
  local spec = gs._parse_run({ 'train', '2', '--', '--epochs', '1' })
  ok(spec.job == 'train' and vim.deep_equal(spec.flags, { '--gpus', '2' }) and
    vim.deep_equal(spec.rest, { '--epochs', '1' }), 'run [job] [gpus] -- args parses')
  ok(vim.deep_equal(gs._parse_run({ 'cpu=3' }).flags, { '--cpu', '3' }), 'cpu=N asks for CPU ranks')
  ok(gs._parse_run({ '--bogus' }) == nil, 'an unknown flag is refused')
  ok(vim.deep_equal(gs.complete('st', 'Gpusync st'), { 'status', 'stop', 'stoprun' }), 'subcommands complete')
  local cwd = vim.fn.getcwd()
  vim.cmd('cd /')
  vim.cmd('Gpusync push')
  ok(wait(2000, function() return noted('no .gpusync/config', vim.log.levels.ERROR) ~= nil end),
    'outside a project a command says to run gpusync init')
  vim.cmd('cd ' .. vim.fn.fnameescape(cwd))
  vim.cmd('Gpusync frobnicate')
  ok(wait(2000, function() return noted('unknown subcommand', vim.log.levels.ERROR) ~= nil end),
    'an unknown subcommand is an error')
end

-- :Gpusync gpu: one `gpusync top` sample in the statusline (this server may have no GPU: then the
-- summary says why).
local function step_gpu()
  vim.cmd('Gpusync gpu')
  ok(wait(30000, function() return gs.state.gpu ~= nil end), ':Gpusync gpu reads a sample of gpusync top')
  local g = gs.state.gpu or ''
  ok((g:find('^GPU%d') or g:find('^no GPUs')) and gs.statusline():find(g, 1, true) ~= nil,
    'the statusline shows the GPU summary (' .. gs.statusline() .. ')')
end

local function main()
  step_offline()
  step_gpu()
  if only:find('login') then
    step_login()
  end
  if only:find('slow') then
    step_lost()
    step_slow()
    step_two()
  end
  if only:find('sync') then
    step_sync()
  end
  if only:find('run') then
    step_run()
  end
  if only:find('reattach') then
    step_reattach()
  end
  vim.cmd('Gpusync stop')
  ok(wait(10000, function() return gs.state.sync == 'off' and gs.state.events_job == nil end),
    ':Gpusync stop ends the daemon; the statusline reads off')
  ok(wait(5000, function() return noted('stopped watching') ~= nil end),
    ':Gpusync stop says it stopped')
  ok(gs.stopped_message({ was_running = true, unsent = 2, unchecked = false })
      :find('2 changes were not sent', 1, true) ~= nil,
    'a stop that left changes unsent says how many')
  io.stdout:write(string.format('%d failure(s)\n', failures))
  vim.cmd(failures == 0 and 'qall!' or 'cquit 1')
end

local okay, err = pcall(main)
if not okay then
  io.stdout:write('FAILED with a Lua error: ' .. tostring(err) .. '\n')
  vim.cmd('cquit 2')
end
