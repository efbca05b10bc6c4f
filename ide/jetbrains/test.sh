#!/usr/bin/env bash
# ide/jetbrains/test.sh: tests the JetBrains External Tools: test_tools.py validates gpusync.xml and
# the startup run configuration, then runs each tool as the IDE would expand it against a private
# sandbox server (scripts/sandbox-server.sh), which this script starts and stops.
# Needs GPUSYNC_BIN (or GS_BUILD_DIR). Exits non-zero on any failure.
# GS_JETBRAINS_SKIP_RUN=1 skips the run tools; GS_KEEP=1 keeps the work folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
GPUSYNC_BIN=${GPUSYNC_BIN:-${GS_BUILD_DIR:+$GS_BUILD_DIR/cli/gpusync}}
[[ -x ${GPUSYNC_BIN:-} ]] || { echo "jetbrains test: set GPUSYNC_BIN to the gpusync binary" >&2; exit 2; }
command -v python3 >/dev/null || { echo "jetbrains test: python3 not found; skipped" >&2; exit 77; }
if command -v xmllint >/dev/null; then
    xmllint --noout "$here/gpusync.xml" "$here/run/gpusync watch.run.xml"
fi

work=$(mktemp -d /tmp/gs-jetbrains-test.XXXXXX)
cleanup() {
    # A daemon the test left behind must not outlive it.
    (cd "$work/project" 2>/dev/null && "$GPUSYNC_BIN" watch --stop >/dev/null 2>&1) || true
    "$repo/scripts/sandbox-server.sh" stop "$work/sandbox" || true
    if [[ ${GS_KEEP:-0} == 1 ]]; then echo "jetbrains test: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
eval "$("$repo/scripts/sandbox-server.sh" start --dir "$work/sandbox")"
export HOME=$GS_SANDBOX_HOME
unset SSH_AUTH_SOCK
mkdir "$work/project"
cd "$work/project"
"$GPUSYNC_BIN" init "root@127.0.0.1:$GS_SANDBOX_PORT" --accept-new-host-key --path "$work/remote" >/dev/null

export GS_PROJECT=$work/project GS_REMOTE=$work/remote GS_WORK=$work GPUSYNC_BIN
timeout 300 python3 "$here/test_tools.py"
