#!/usr/bin/env bash
# ide/emacs/test.sh: ERT tests of gpusync.el in the real `emacs --batch` (test/gpusync-test.el)
# against a private sandbox server (scripts/sandbox-server.sh), which this script starts and
# stops. Needs GPUSYNC_BIN (or GS_BUILD_DIR). Exits non-zero on any failure.
# GS_EMACS_SKIP_RUN=1 skips the run tests; GS_EMACS_TESTS=REGEXP runs only the tests whose names
# match; GS_KEEP=1 keeps the work folder.
set -euo pipefail
source "$(dirname "$0")/../test-lib.sh"
gs_ide_test_setup emacs emacs

timeout 300 emacs --batch -Q -L "$here" -l "$here/test/gpusync-test.el" \
    --eval '(ert-run-tests-batch-and-exit (or (getenv "GS_EMACS_TESTS") t))'
