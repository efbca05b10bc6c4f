-- plugin/gpusync.lua: defines :Gpusync (watch|stop|push|run [job] [gpus]|logs|stoprun|status|doctor|gpu)
-- and loads lua/gpusync lazily, so an editor that never uses it pays nothing.
if vim.g.loaded_gpusync then
  return
end
vim.g.loaded_gpusync = true

vim.api.nvim_create_user_command('Gpusync', function(opts)
  require('gpusync').command(opts.args)
end, {
  nargs = '*',
  desc = 'gpusync: watch | stop | push | run [job] [gpus] | logs [run] | stoprun [run] | status | doctor | gpu',
  complete = function(arglead, cmdline)
    return require('gpusync').complete(arglead, cmdline)
  end,
})
