-- lua/gpusync/init.lua: the gpusync Neovim plugin. It stays thin: every action is one call to
-- the gpusync CLI (its --json output is the contract), and the statusline is fed by
-- `gpusync events --json`. Works on Neovim 0.7 and later (vim.fn.jobstart, no vim.system).
local M = {}

-- bin: the gpusync binary (default: $GPUSYNC_BIN, else "gpusync" on PATH).
-- watch_on_open: start `gpusync watch -d` when Neovim starts inside a gpusync project.
-- log_split: the command that opens a window for a log buffer.
M.config = { bin = nil, watch_on_open = false, log_split = 'botright 12split' }

-- The sync state of each project (root directory -> record): every project watched from this
-- editor has its own event stream, and the statusline shows the current buffer's project.
--   sync: off | connecting | connected | syncing | up_to_date | disconnected | conflict | error
local projects = {}

local function project(root)
  root = root or ''
  local p = projects[root]
  if not p then
    p = {
      root = root,
      sync = 'off',
      count = 0,          -- files mirrored since the last "idle"
      batch = nil,        -- the last "progress" event of the batch under way, until "idle"
      detail = nil,       -- the path or message behind conflict / error / disconnected
      events = {},        -- the last 200 events, oldest first
      conflicts = {},     -- conflict copies kept on the server, not acknowledged: { path=, kept= }
      failing = {},       -- path -> messages already notified: the daemon retries a failed
                          -- operation every few seconds, and each retry sends the error again
      events_job = nil,
      looking = false,    -- whether this editor follows the project's daemon whenever one runs
      tried_id = nil,     -- the control socket the last stream was started on (socket_id)
      tried_at = 0,       -- and when (vim.loop.now())
    }
    projects[root] = p
  end
  return p
end

-- The editor's state: the runs started here, and (read through M.state, for the statusline and
-- the tests) the sync fields of the current buffer's project.
local state = {
  last_run = nil,     -- id of the newest run started from this editor
  run_active = false,
  log_jobs = {},      -- buffer number -> job id of its `gpusync logs -f`
  stopping = {},      -- run id -> true once :Gpusync stoprun asked for it
  gpu = nil,          -- the server's one-line GPU summary from :Gpusync gpu (gpusync top)
}
local sync_fields = {
  sync = true, count = true, batch = true, detail = true, events = true, events_job = true, conflicts = true,
}
M.state = setmetatable({}, {
  __index = function(_, k)
    if sync_fields[k] then
      return project(M.root())[k]
    end
    return state[k]
  end,
  __newindex = function(_, k, v)
    if sync_fields[k] then
      project(M.root())[k] = v
    else
      state[k] = v
    end
  end,
})
M._project = project

local ERROR, WARN, INFO = vim.log.levels.ERROR, vim.log.levels.WARN, vim.log.levels.INFO
local CONNECT_RECHECK_MS = 2000 -- while "connecting…": how often status --json is read again
-- While a known project's daemon is not followed, its control socket is looked at (a stat, no
-- process) this often: a daemon that starts, from here or from a shell, makes a new one.
local REATTACH_MS = 2000
-- A socket that did not answer (left by a daemon that was killed) is tried again this seldom.
local STALE_RETRY_MS = 60000

local function bin()
  return M.config.bin or vim.env.GPUSYNC_BIN or 'gpusync'
end

-- vim.notify may not be called from a job callback in every UI: always go through the loop.
local function notify(msg, level)
  vim.schedule(function()
    vim.notify('gpusync: ' .. msg, level or INFO)
  end)
end

-- The project directory: the nearest folder at or above the current file (or cwd) holding
-- .gpusync/config. nil outside a project.
function M.root()
  local start = vim.fn.expand('%:p:h')
  if start == '' or vim.fn.isdirectory(start) == 0 then
    start = vim.fn.getcwd()
  end
  local found = vim.fn.finddir('.gpusync', start .. ';')
  if found == '' then
    return nil
  end
  local dir = vim.fn.fnamemodify(found, ':p:h:h')
  if vim.fn.filereadable(dir .. '/.gpusync/config') == 0 then
    return nil
  end
  return dir
end

-- Returns an on_stdout/on_stderr handler that calls on_line once per complete line (jobstart
-- hands over chunks whose last item is an unfinished line), and a flush for the job's end.
local function line_reader(on_line)
  local partial = ''
  local function feed(_, data)
    if not data or #data == 0 then
      return
    end
    data[1] = partial .. data[1]
    partial = table.remove(data)
    for _, l in ipairs(data) do
      on_line(l)
    end
  end
  local function flush()
    if partial ~= '' then
      on_line(partial)
      partial = ''
    end
  end
  return feed, flush
end

local function decode(line)
  local ok, obj = pcall(vim.fn.json_decode, line)
  if ok and type(obj) == 'table' then
    return obj
  end
  return nil
end

-- The last JSON object the CLI printed, or nil.
local function last_json(lines)
  for i = #lines, 1, -1 do
    local obj = decode(lines[i])
    if obj then
      return obj
    end
  end
  return nil
end

-- What went wrong, in the CLI's words: the JSON "message", else stderr.
local function failure(obj, err)
  if obj and type(obj.message) == 'string' then
    return obj.message
  end
  local text = vim.trim(table.concat(err or {}, '\n'))
  return text ~= '' and text or 'failed'
end

-- Starts `gpusync ARGS` in the project. on_done(code, stdout_lines, stderr_lines) runs when
-- it exits; opts.on_line(line, is_stderr) sees each line as it comes. Returns the job id, or
-- nil (after a notification) when there is no project or the binary cannot start.
local function cli(args, on_done, opts)
  opts = opts or {}
  local dir = opts.cwd or M.root()
  if not dir then
    notify('no .gpusync/config here or above; run `gpusync init user@host:port` first', ERROR)
    return nil
  end
  -- A streaming caller (logs -f) sees every line through on_line; keeping them too would hold a
  -- whole training log in memory twice.
  local out, err = {}, {}
  local keep = not opts.on_line
  local feed_out, flush_out = line_reader(function(l)
    if keep then
      table.insert(out, l)
    else
      opts.on_line(l, false)
    end
  end)
  local feed_err, flush_err = line_reader(function(l)
    table.insert(err, l)
    if not keep then
      opts.on_line(l, true)
    end
  end)
  local cmd = vim.list_extend({ bin() }, args)
  local ok, job = pcall(vim.fn.jobstart, cmd, {
    cwd = dir,
    on_stdout = feed_out,
    on_stderr = feed_err,
    on_exit = function(_, code)
      flush_out()
      flush_err()
      if on_done then
        on_done(code, out, err)
      end
    end,
  })
  if not ok or job <= 0 then
    notify('cannot run ' .. bin() .. ' (set require("gpusync").setup{bin=...})', ERROR)
    return nil
  end
  return job
end
M._cli = cli

local function redraw()
  vim.schedule(function()
    vim.cmd('redrawstatus!')
  end)
end

-- ---- the event stream and the statusline ----

local function remember(p, ev)
  table.insert(p.events, ev)
  if #p.events > 200 then
    table.remove(p.events, 1)
  end
end

local handlers = {
  synced = function(p, ev)
    p.sync, p.count = 'syncing', p.count + 1
    p.failing[tostring(ev.path)] = nil
  end,
  deleted = function(p, ev)
    p.sync, p.count = 'syncing', p.count + 1
    p.failing[tostring(ev.path)] = nil
  end,
  renamed = function(p, ev)
    p.sync, p.count = 'syncing', p.count + 1
    p.failing[tostring(ev.path)], p.failing[tostring(ev.from)] = nil, nil
  end,
  -- A batch that runs longer than 250 ms says so every 250 ms: a large file still on its way
  -- reads as syncing, not as the "up to date" of the batch before.
  progress = function(p, ev)
    p.sync, p.batch = 'syncing', ev
  end,
  idle = function(p)
    p.batch, p.failing = nil, {}
    if p.sync ~= 'conflict' and p.sync ~= 'error' or p.count > 0 then
      p.sync, p.detail = 'up_to_date', nil
    end
    p.count = 0
  end,
  connected = function(p, ev)
    p.sync, p.detail = 'connected', ev.target
  end,
  disconnected = function(p, ev)
    p.sync, p.detail = 'disconnected', ev.message
    notify('disconnected: ' .. tostring(ev.message), WARN)
  end,
  conflict = function(p, ev)
    p.sync, p.detail, p.count = 'conflict', ev.path, 0
    local known = false
    for _, c in ipairs(p.conflicts) do
      known = known or c.kept == ev.kept
    end
    if not known then
      table.insert(p.conflicts, { path = ev.path, kept = ev.kept })
    end
    notify(string.format('conflict on %s: the server had changed it; its copy is kept as %s',
      tostring(ev.path), tostring(ev.kept)), WARN)
  end,
  error = function(p, ev)
    local path = type(ev.path) == 'string' and ev.path or nil
    p.sync, p.detail, p.count = 'error', path or ev.message, 0
    -- Once per distinct error until it clears (the path syncs, or an idle says all is sent).
    local key, msg = path or '', tostring(ev.message)
    p.failing[key] = p.failing[key] or {}
    if not p.failing[key][msg] then
      p.failing[key][msg] = true
      notify('error' .. (path and (' on ' .. path) or '') .. ': ' .. msg, ERROR)
    end
  end,
}

local function on_event(p, ev)
  if type(ev.event) ~= 'string' then
    return
  end
  remember(p, ev)
  local h = handlers[ev.event]
  if h then
    h(p, ev)
  end
  redraw()
end

-- Seeds a project's state from `gpusync status --json` (events only report changes).
local function refresh_status(on_done, root)
  root = root or M.root()
  local p = project(root)
  cli({ 'status', '--json' }, function(code, out, err)
    local st = last_json(out)
    -- The conflict copies not acknowledged yet (status --ack): with a daemon or without.
    if code == 0 and st and type(st.conflicts) == 'table' then
      p.conflicts = {}
      for _, c in ipairs(st.conflicts) do
        if type(c) == 'table' then
          table.insert(p.conflicts, { path = c.path, kept = c.kept })
        end
      end
      redraw()
    end
    -- Only while a stream is followed: a reply that comes after the stream ended (the daemon
    -- was killed meanwhile) must not paint a live state over "off".
    if code == 0 and st and st.daemon and p.events_job then
      if p.sync == 'off' or p.sync == 'connecting' then
        p.sync = st.state == 'connecting' and 'connecting' or st.state
        p.count = st.pending or 0
        -- A first connection that failed (a refused login) sends no event: say why here.
        if p.sync == 'disconnected' and type(st.last_error) == 'string' then
          p.detail = st.last_error
          notify('disconnected: ' .. st.last_error, WARN)
        end
      end
      redraw()
    end
    if on_done then
      on_done(code, st, err)
    end
  end, { cwd = root })
end

-- The identity of the project's control socket, or nil when there is none. A daemon that starts
-- binds a new socket (it unlinks the one a killed daemon left), so a new inode or mtime means a
-- daemon to follow.
local function socket_id(root)
  local st = vim.loop.fs_stat(root .. '/.gpusync/daemon.sock')
  if not st or st.type ~= 'socket' then
    return nil
  end
  return string.format('%d:%d.%09d', st.ino, st.mtime.sec, st.mtime.nsec)
end

-- Follows the event stream of the project's daemon (does nothing if already following it), and
-- looks after the project from then on (M.look_after). quiet: a look for a daemon that may not
-- be there (a socket a killed one left): the state stays "off" until status --json says that a
-- daemon runs.
function M.follow_events(root, quiet)
  root = root or M.root()
  if not root then
    return
  end
  local p = project(root)
  if p.events_job then
    return
  end
  local feed, flush = line_reader(function(l)
    local ev = decode(l)
    if ev then
      on_event(p, ev)
    end
  end)
  p.tried_id, p.tried_at = socket_id(root), vim.loop.now()
  local ok, job = pcall(vim.fn.jobstart, { bin(), 'events', '--json' }, {
    cwd = root,
    on_stdout = feed,
    on_exit = function(id)
      flush()
      if p.events_job == id then
        p.events_job, p.sync, p.count, p.batch = nil, 'off', 0, nil
        redraw()
      end
    end,
  })
  if ok and job > 0 then
    p.events_job, p.failing = job, {}
    if not quiet then
      p.sync = 'connecting'
    end
    M.look_after(root)
    refresh_status(nil, root)
    -- The stream says "connected" once the session is up, but nothing when the first attempt
    -- fails (a wrong password, no key accepted): while still connecting, read status again.
    local timer
    timer = vim.fn.timer_start(CONNECT_RECHECK_MS, function()
      if p.events_job ~= job or (p.sync ~= 'connecting' and p.sync ~= 'off') then
        vim.fn.timer_stop(timer)
        return
      end
      refresh_status(nil, root)
    end, { ['repeat'] = -1 })
  end
end

-- Follows the project's daemon if one runs and is not followed yet: its socket is new, or the
-- one that did not answer was tried long enough ago.
local function look_once(p)
  if p.events_job then
    return
  end
  local id = socket_id(p.root)
  if id and (id ~= p.tried_id or vim.loop.now() - p.tried_at >= STALE_RETRY_MS) then
    M.follow_events(p.root, true)
  end
end

local looker = nil -- the one timer that looks after every known project

-- Follows the daemon of the project at root whenever one runs, from now on: once it is started
-- (from here or from a shell) and again after its stream ended (the daemon was stopped, killed or
-- crashed, and maybe started again). It never starts a daemon. Looks at once, then every
-- REATTACH_MS.
function M.look_after(root)
  local p = project(root)
  if not p.looking then
    p.looking = true
    vim.schedule(function()
      look_once(p)
    end)
  end
  if not looker then
    looker = vim.fn.timer_start(REATTACH_MS, function()
      for _, q in pairs(projects) do
        if q.looking then
          look_once(q)
        end
      end
    end, { ['repeat'] = -1 })
  end
end

local labels = {
  off = 'off',
  connecting = 'connecting…',
  connected = 'connected',
  up_to_date = 'up to date',
  disconnected = 'disconnected',
  conflict = 'conflict',
  error = 'error',
}

-- The statusline text, e.g. "gpusync: syncing 3" or "gpusync: up to date | run 2026…: running".
-- Use it as `set statusline+=%{v:lua.require'gpusync'.statusline()}`.
-- While syncing, N counts the files of the batch: those sent so far, or the operations the
-- daemon planned for it ("progress"), so that one large file still on its way reads "syncing 1".
local function syncing_label(p)
  local total = p.batch and tonumber(p.batch.ops_total) or 0
  return 'syncing ' .. math.max(p.count, total)
end

function M.statusline()
  local p = project(M.root())
  local s = p.sync == 'syncing' and syncing_label(p) or labels[p.sync] or p.sync
  if (p.sync == 'conflict' or p.sync == 'error') and p.detail then
    s = s .. ' ' .. vim.fn.fnamemodify(tostring(p.detail), ':t')
  end
  local text = 'gpusync: ' .. s
  local n = #p.conflicts
  if n > 0 then
    text = text .. string.format(' | %d conflict cop%s', n, n == 1 and 'y' or 'ies')
  end
  if state.last_run then
    text = text .. ' | run ' .. state.last_run .. (state.run_active and ': running' or ': ended')
  end
  if state.gpu then
    text = text .. ' | ' .. state.gpu
  end
  return text
end

-- ---- commands ----

function M.watch()
  local root = M.root()
  cli({ 'watch', '-d', '--json' }, function(code, out, err)
    local obj = last_json(out)
    if code == 0 then
      notify('watching (daemon pid ' .. tostring(obj and obj.pid) .. ')')
    elseif failure(obj, err):find('already running') then
      notify('already watching this project')
    else
      notify('watch failed: ' .. failure(obj, err), ERROR)
      return
    end
    M.follow_events(root)
  end, { cwd = root })
end

-- What `watch --stop --json` answered, for the user: "stopped" alone reads as "and every change
-- was sent", which is not so when the daemon was stopped in the middle of an upload.
function M.stopped_message(r)
  if not (r and r.was_running) then
    return 'no watch was running'
  end
  local unsent = tonumber(r.unsent) or 0
  if unsent > 0 then
    local one = unsent == 1
    return string.format('stopped watching; %d change%s not sent (:Gpusync push sends %s)',
      unsent, one and ' was' or 's were', one and 'it' or 'them')
  elseif r.unchecked == true then
    return 'stopped watching before every file was checked (:Gpusync push checks them)'
  end
  return 'stopped watching'
end

function M.stop_watching()
  local root = M.root()
  local p = project(root)
  cli({ 'watch', '--stop', '--json' }, function(code, out, err)
    local r = last_json(out)
    if code ~= 0 then
      notify('stop failed: ' .. failure(r, err), ERROR)
      return
    end
    if p.events_job then
      vim.fn.jobstop(p.events_job)
    end
    p.events_job, p.sync, p.count, p.batch = nil, 'off', 0, nil
    redraw()
    notify(M.stopped_message(r), (r and tonumber(r.unsent) or 0) > 0 and WARN or INFO)
  end)
end

function M.push()
  notify('pushing…')
  cli({ 'push', '--json' }, function(code, out, err)
    local r = last_json(out)
    if not r or r.ok == false or code ~= 0 then
      notify('push failed: ' .. failure(r, err), ERROR)
    end
    if not r or r.sent == nil then
      return
    end
    for _, c in ipairs(r.conflicts or {}) do
      notify(string.format('conflict on %s: the server copy is kept as %s', c.path, c.kept), WARN)
    end
    for _, f in ipairs(r.failures or {}) do
      notify(string.format('%s %s failed: %s', tostring(f.op), tostring(f.path), tostring(f.message)), ERROR)
    end
    notify(string.format('pushed: sent %d, deleted %d, renamed %d, unchanged %d in %.2f s',
      r.sent, r.deleted or 0, r.renamed or 0, r.unchanged or 0, r.seconds or 0))
  end)
end

-- ---- logs in a scratch buffer ----

-- The buffer named exactly name, or -1 (bufnr() would take name as a file pattern).
local function find_buf(name)
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_get_name(b) == name then
      return b
    end
  end
  return -1
end

local function log_buffer(name)
  local buf = find_buf(name)
  if buf == -1 then
    buf = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_name(buf, name)
    vim.api.nvim_buf_set_option(buf, 'filetype', 'gpusynclog')
  end
  vim.api.nvim_buf_set_option(buf, 'modifiable', true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, {})
  vim.api.nvim_buf_set_option(buf, 'modifiable', false)
  return buf
end

local function show_buffer(buf)
  if vim.fn.bufwinid(buf) ~= -1 then
    return
  end
  local cur = vim.api.nvim_get_current_win()
  vim.cmd(M.config.log_split)
  vim.api.nvim_win_set_buf(0, buf)
  vim.api.nvim_set_current_win(cur)
end

-- Appends lines and keeps every window that shows the buffer at its end (tail -f).
local function append(buf, lines)
  if not vim.api.nvim_buf_is_valid(buf) then
    return
  end
  vim.api.nvim_buf_set_option(buf, 'modifiable', true)
  local empty = vim.api.nvim_buf_line_count(buf) == 1 and vim.api.nvim_buf_get_lines(buf, 0, 1, false)[1] == ''
  vim.api.nvim_buf_set_lines(buf, empty and 0 or -1, -1, false, lines)
  vim.api.nvim_buf_set_option(buf, 'modifiable', false)
  local last = vim.api.nvim_buf_line_count(buf)
  for _, win in ipairs(vim.fn.win_findbuf(buf)) do
    vim.api.nvim_win_set_cursor(win, { last, 0 })
  end
end

-- Follows `gpusync logs -f [ID]` (the newest run by default) in the buffer gpusync://logs/ID.
-- Returns the buffer number.
function M.logs(id)
  local name = 'gpusync://logs/' .. (id or 'latest')
  local buf = find_buf(name)
  -- A follower already on this buffer is replaced: forget it first, so that its exit (which
  -- arrives later) neither writes into the fresh buffer nor reports the run as ended.
  local old = buf ~= -1 and state.log_jobs[buf] or nil
  if old then
    state.log_jobs[buf] = nil
    pcall(vim.fn.jobstop, old)
  end
  local root = M.root()
  buf = log_buffer(name)
  show_buffer(buf)
  local args = { 'logs', '-f' }
  if id then
    table.insert(args, id)
  end
  local job
  local function current()
    return job ~= nil and state.log_jobs[buf] == job
  end
  -- Lines arrive in bursts; append each burst with one buffer update on the main loop.
  local pending = {}
  local function flush()
    local lines = pending
    pending = {}
    if #lines > 0 and current() then
      append(buf, lines)
    end
  end
  -- How the follower ended: the run's status when the run ended; 255 when the connection failed
  -- (the run may well go on); anything else is the CLI's own failure (no such run, no runs yet),
  -- told apart from a run that failed by asking `ps --json` whether the run has ended.
  local function say_end(code, err)
    if not current() then
      return
    end
    flush()
    state.log_jobs[buf] = nil
    local label = id or 'latest'
    if code == 255 then
      local msg = "lost the connection to the run's logs (it may still be running; :Gpusync logs "
        .. (id and (id .. ' ') or '') .. 'reattaches)'
      append(buf, { '[gpusync: ' .. msg .. ']' })
      notify('run ' .. label .. ': ' .. msg, WARN)
      return
    end
    local function ended()
      append(buf, { string.format('[gpusync: run %s ended: exit %d]', label, code) })
      if id == state.last_run then
        state.run_active = false
        redraw()
      end
      if code ~= 0 and state.stopping[id or ''] then
        notify(string.format('run %s was stopped (exit code %d)', id, code), WARN)
      elseif code ~= 0 then
        notify(string.format('run %s ended with exit code %d', id or '(latest)', code), code == 130 and WARN or ERROR)
      end
    end
    if code == 0 then
      return ended()
    end
    local why = vim.trim(table.concat(err or {}, '\n')):gsub('^gpusync: ', '')
    if why == '' then
      why = 'exit ' .. code
    end
    cli({ 'ps', '--json' }, function(pcode, out)
      vim.schedule(function()
        local r = pcode == 0 and last_json(out) or nil
        local run
        for _, x in ipairs(r and r.runs or {}) do
          if (id and x.id == id) or (not id and not run) then
            run = x
          end
        end
        if run and run.state ~= 'running' then
          return ended()
        end
        append(buf, { string.format('[gpusync: logs of run %s failed: %s]', label, why) })
        notify(string.format('logs of run %s failed: %s', label, why), ERROR)
      end)
    end, { cwd = root })
  end
  job = cli(args, function(code, _, err)
    vim.schedule(function()
      say_end(code, err)
    end)
  end, {
    on_line = function(l)
      table.insert(pending, l)
      if #pending == 1 then
        vim.schedule(flush)
      end
    end,
  })
  state.log_jobs[buf] = job
  return buf
end

-- ---- runs ----

-- The jobs of .gpusync/config ([job "NAME"] sections), plus the bundled trainer.
function M.jobs()
  local names, seen = {}, {}
  local root = M.root()
  local file = root and io.open(root .. '/.gpusync/config', 'r')
  if file then
    for line in file:lines() do
      local name = line:match('^%s*%[job%s+"([^"]+)"%]')
      if name and not seen[name] then
        table.insert(names, name)
        seen[name] = true
      end
    end
    file:close()
  end
  if not seen.train then
    table.insert(names, 'train')
  end
  return names
end

-- Splits a command line like a shell does for quotes ('...', "...", \x); no expansion.
local function split_words(s)
  local words, cur, i, quote, have = {}, {}, 1, nil, false
  while i <= #s do
    local c = s:sub(i, i)
    if quote then
      if c == quote then
        quote = nil
      elseif c == '\\' and quote == '"' and i < #s then
        i = i + 1
        table.insert(cur, s:sub(i, i))
      else
        table.insert(cur, c)
      end
    elseif c == "'" or c == '"' then
      quote, have = c, true
    elseif c == '\\' and i < #s then
      i = i + 1
      table.insert(cur, s:sub(i, i))
      have = true
    elseif c:match('%s') then
      if have or #cur > 0 then
        table.insert(words, table.concat(cur))
      end
      cur, have = {}, false
    else
      table.insert(cur, c)
    end
    i = i + 1
  end
  if have or #cur > 0 then
    table.insert(words, table.concat(cur))
  end
  return words
end
M._split_words = split_words

-- Turns `[job] [gpus] [-- args]` into CLI flags. gpus: N, a list "0,2", or cpu=N (CPU ranks).
-- Returns { job=, flags={}, rest={} } or nil and a message.
local function parse_run(words)
  local spec, i = { flags = {}, rest = {} }, 1
  while i <= #words do
    local w = words[i]
    if w == '--' then
      spec.rest = vim.list_slice(words, i + 1)
      spec.dashdash = true
      break
    elseif (w == '--cpu' or w == '--gpus') and words[i + 1] then
      vim.list_extend(spec.flags, { w, words[i + 1] })
      i = i + 1
    elseif w:match('^cpu[:=]?%d+$') then
      vim.list_extend(spec.flags, { '--cpu', w:match('%d+') })
    elseif w:match('^[%d,]+$') then
      vim.list_extend(spec.flags, { '--gpus', w })
    elseif not spec.job and not w:match('^%-') then
      spec.job = w
    else
      return nil, 'unexpected "' .. w .. '"; usage: :Gpusync run [job] [gpus|cpu=N] [-- args]'
    end
    i = i + 1
  end
  return spec
end
M._parse_run = parse_run

local function start_run(spec)
  local args = { 'run', '--detach', '--json' }
  vim.list_extend(args, spec.flags)
  if spec.job then
    table.insert(args, spec.job)
  end
  if #spec.rest > 0 then
    table.insert(args, '--')
    vim.list_extend(args, spec.rest)
  end
  notify('starting ' .. (spec.job or table.concat(spec.rest, ' ')) .. '…')
  cli(args, function(code, out, err)
    local r = last_json(out)
    if code ~= 0 or not r or not r.ok or not r.id then
      notify('run failed: ' .. failure(r, err), ERROR)
      return
    end
    state.last_run, state.run_active = r.id, true
    redraw()
    notify(string.format('run %s started: %d rank%s, MASTER_PORT %s', r.id, r.ranks or 0,
      r.ranks == 1 and '' or 's', tostring(r.master_port)))
    vim.schedule(function()
      M.logs(r.id)
    end)
  end)
end

-- :Gpusync run [job] [gpus] [-- args]: with no job, asks for one (and a GPU count).
function M.run(words)
  local spec, msg = parse_run(words or {})
  if not spec then
    notify(msg, ERROR)
    return
  end
  if spec.job or #spec.rest > 0 then
    return start_run(spec)
  end
  vim.ui.select(M.jobs(), { prompt = 'gpusync: run which job?' }, function(job)
    if not job then
      return
    end
    vim.ui.input({ prompt = 'GPUs (N, 0,2, or cpu=N; empty: the job\'s): ' }, function(gpus)
      local more = { job }
      if gpus and gpus ~= '' then
        table.insert(more, gpus)
      end
      M.run(more)
    end)
  end)
end

local function stop_id(id)
  state.stopping[id] = true
  cli({ 'stop', id, '--json' }, function(code, out, err)
    local r = last_json(out)
    if code ~= 0 or not r or not r.ok then
      notify('stop ' .. id .. ' failed: ' .. failure(r, err), ERROR)
      return
    end
    notify('stopped run ' .. r.id)
  end)
end

-- :Gpusync stoprun [id]: the given run, else the one started here, else the one running.
function M.stop_run(id)
  id = id or (state.run_active and state.last_run) or nil
  if id then
    return stop_id(id)
  end
  cli({ 'ps', '--json' }, function(code, out, err)
    local r = last_json(out)
    if code ~= 0 or not r or not r.ok then
      notify('ps failed: ' .. failure(r, err), ERROR)
      return
    end
    local running = {}
    for _, run in ipairs(r.runs or {}) do
      if run.state == 'running' then
        table.insert(running, run.id)
      end
    end
    if #running == 0 then
      notify('no run is running', WARN)
    elseif #running == 1 then
      stop_id(running[1])
    else
      vim.schedule(function()
        vim.ui.select(running, { prompt = 'gpusync: stop which run?' }, function(choice)
          if choice then
            stop_id(choice)
          end
        end)
      end)
    end
  end)
end

-- The conflict copies status --json lists, for :Gpusync status ("" when none).
function M.conflicts_text(list)
  if type(list) ~= 'table' or #list == 0 then
    return ''
  end
  local items = {}
  for _, c in ipairs(list) do
    table.insert(items, string.format('%s (the server\'s copy is %s)', tostring(c.path), tostring(c.kept)))
  end
  return string.format('\n%d conflict cop%s kept on the server (gpusync status --ack clears): %s', #list,
    #list == 1 and 'y' or 'ies', table.concat(items, ', '))
end

function M.status()
  refresh_status(function(code, st, err)
    if code ~= 0 or not st then
      notify('status failed: ' .. failure(st, err), ERROR)
      return
    end
    local copies = M.conflicts_text(st.conflicts)
    if st.daemon then
      notify(string.format('%s, %s, %d pending%s%s', st.state, st.connected and 'connected' or 'not connected',
        st.pending or 0, st.last_latency_ms ~= vim.NIL and st.last_latency_ms and
        (', ' .. st.last_latency_ms .. ' ms') or '',
        type(st.last_error) == 'string' and (', last error: ' .. st.last_error) or '') .. copies,
        copies ~= '' and WARN or INFO)
    else
      notify(string.format('not watching; %s, %d change(s) to push', st.state, st.pending or 0) .. copies,
        copies ~= '' and WARN or INFO)
    end
  end)
end

-- :Gpusync doctor: the checks in gpusync://doctor, and a summary.
function M.doctor()
  notify('checking…')
  cli({ 'doctor', '--json' }, function(code, out, err)
    local r = last_json(out)
    if not r or not r.checks then
      notify('doctor failed: ' .. failure(r, err), ERROR)
      return
    end
    local lines, bad = {}, 0
    for _, c in ipairs(r.checks) do
      local hint = type(c.hint) == 'string' and ('  -> ' .. c.hint) or ''
      table.insert(lines, string.format('[%-4s] %-10s %s%s', c.status, c.name,
        type(c.detail) == 'string' and c.detail or '', hint))
      bad = bad + (c.status == 'ok' and 0 or 1)
    end
    vim.schedule(function()
      local buf = log_buffer('gpusync://doctor')
      append(buf, lines)
      show_buffer(buf)
    end)
    notify(string.format('doctor: %d check(s), %d not ok', #r.checks, bad), (code == 0 and bad == 0) and INFO or WARN)
  end)
end

-- :Gpusync gpu: one sample of `gpusync top` for the statusline, e.g.
-- "GPU0 87% 31.2/79.6 GiB 250 W 64°C | GPU1 ...", and as a notification.
function M.gpu()
  cli({ 'top', '--json', '--count', '1' }, function(code, out, err)
    local r = last_json(out)
    if code ~= 0 or not r or type(r.gpu_summary) ~= 'string' then
      notify('gpu: ' .. failure(r, err), ERROR)
      return
    end
    state.gpu = r.gpu_summary
    notify(r.gpu_summary .. (type(r.gpu_error) == 'string' and (': ' .. r.gpu_error) or ''))
    redraw()
  end)
end

local subcommands = {
  watch = function() M.watch() end,
  stop = function() M.stop_watching() end,
  push = function() M.push() end,
  run = function(words) M.run(words) end,
  logs = function(words) M.logs(words[1]) end,
  stoprun = function(words) M.stop_run(words[1]) end,
  status = function() M.status() end,
  doctor = function() M.doctor() end,
  gpu = function() M.gpu() end,
}

-- The :Gpusync command: `:Gpusync SUBCOMMAND ARGS`.
function M.command(line)
  local words = split_words(line or '')
  local name = table.remove(words, 1) or 'status'
  local f = subcommands[name]
  if not f then
    notify('unknown subcommand "' .. name .. '"; try watch, stop, push, run, logs, stoprun, status, doctor, gpu', ERROR)
    return
  end
  f(words)
end

function M.complete(arglead, cmdline)
  local words = split_words(cmdline)
  local pool
  if #words <= 1 or (#words == 2 and arglead ~= '') then
    pool = vim.tbl_keys(subcommands)
    table.sort(pool)
  elseif words[2] == 'run' then
    pool = M.jobs()
  else
    return {}
  end
  return vim.tbl_filter(function(s)
    return vim.startswith(s, arglead)
  end, pool)
end

-- setup{bin=, watch_on_open=, log_split=}: optional. Also follows the daemon of every project
-- opened in this editor whenever one runs (one started from a shell too, before or after), so
-- the statusline is live without :Gpusync watch.
function M.setup(opts)
  M.config = vim.tbl_extend('force', M.config, opts or {})
  vim.cmd([[
    augroup gpusync_look_after
      autocmd!
      autocmd BufEnter * lua require('gpusync')._look_here()
    augroup END
  ]])
  local root = M.root()
  if root and M.config.watch_on_open then
    M.watch()
  elseif root then
    M.look_after(root)
  end
end

-- BufEnter: the buffer's project, if any, is looked after from now on.
function M._look_here()
  local root = M.root()
  if root and not project(root).looking then
    M.look_after(root)
  end
end

return M
