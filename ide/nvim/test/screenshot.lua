-- test/screenshot.lua: the scripted session behind screenshot.txt: a real (non-headless) Neovim in
-- tmux starts watching, saves a file, starts the bundled trainer on 2 CPU ranks, and writes
-- GS_SHOT_DONE.mid once the log buffer shows the first epoch and GS_SHOT_DONE once the run has
-- ended, so ../screenshot.sh can capture the screen at both points. Timers, not vim.wait, so the
-- screen keeps redrawing while it waits.
local gs = require('gpusync')
local project, done_file = vim.env.GS_PROJECT, vim.env.GS_SHOT_DONE

vim.o.laststatus = 2
vim.o.statusline = "%<%f %m%=%{v:lua.require'gpusync'.statusline()} "

-- Calls then_fn once cond() holds (checked every 100 ms), or after 90 s regardless.
local function after(cond, then_fn)
  local timer, started = vim.loop.new_timer(), vim.loop.now()
  timer:start(100, 100, vim.schedule_wrap(function()
    if cond() or vim.loop.now() - started > 90000 then
      timer:stop()
      timer:close()
      then_fn()
    end
  end))
end

local function log_has(text)
  local buf = gs.state.last_run and vim.fn.bufnr('gpusync://logs/' .. gs.state.last_run) or -1
  if buf == -1 then
    return false
  end
  return table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n'):find(text, 1, true) ~= nil
end

vim.cmd('edit ' .. project .. '/notes.md')
vim.cmd('Gpusync watch')
after(function() return gs.state.events_job ~= nil and gs.state.sync ~= 'connecting' end, function()
  vim.api.nvim_buf_set_lines(0, 0, -1, false, {
    '# notes.md: what to try next',
    '- lr 1e-3 vs 3e-4',
    '- bigger hidden layer',
  })
  vim.cmd('silent write')
  after(function() return gs.statusline():find('up to date') ~= nil end, function()
    vim.cmd([[Gpusync run train cpu=2 -- --epochs 4 --limit-train 20000]])
    after(function() return log_has('epoch   1/4') end, function()
      vim.cmd('redraw!')
      vim.fn.writefile({ 'mid' }, done_file .. '.mid')
      after(function() return log_has('ended: exit') end, function()
        vim.cmd('redraw!')
        vim.fn.writefile({ 'done' }, done_file)
      end)
    end)
  end)
end)
