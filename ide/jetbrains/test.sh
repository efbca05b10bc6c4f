#!/usr/bin/env bash
# ide/jetbrains/test.sh: tests the JetBrains External Tools: test_tools.py validates gpusync.xml and
# the startup run configuration, then runs each tool as the IDE would expand it against a private
# sandbox server (scripts/sandbox-server.sh), which this script starts and stops.
# Needs GPUSYNC_BIN (or GS_BUILD_DIR). Exits non-zero on any failure.
# GS_JETBRAINS_SKIP_RUN=1 skips the run tools; GS_KEEP=1 keeps the work folder.
set -euo pipefail
source "$(dirname "$0")/../test-lib.sh"
gs_ide_test_setup jetbrains python3
if command -v xmllint >/dev/null; then
    xmllint --noout "$here/gpusync.xml" "$here/run/gpusync watch.run.xml"
fi

timeout 300 python3 "$here/test_tools.py"
