#!/usr/bin/env bash
# ide/nvim/test.sh: end-to-end test of the Neovim plugin: the real `nvim --headless` runs
# test/e2e.lua against a private sandbox server (scripts/sandbox-server.sh), which this script
# starts and stops. Needs GPUSYNC_BIN (or GS_BUILD_DIR). Exits non-zero on any failure.
# GS_NVIM_STEPS=login,slow,sync,run,reattach (any of them) picks the steps; GS_KEEP=1 keeps the work folder.
set -euo pipefail
source "$(dirname "$0")/../test-lib.sh"
gs_ide_test_setup nvim nvim

timeout 300 nvim --headless -u NONE -i NONE -n --cmd "set rtp^=$here" \
    -c "runtime plugin/gpusync.lua" -c "luafile $here/test/e2e.lua"
