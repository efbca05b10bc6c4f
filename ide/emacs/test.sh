#!/usr/bin/env bash
# ide/emacs/test.sh: ERT tests of gpusync.el in the real `emacs --batch` (test/gpusync-test.el)
# against a private sandbox server (scripts/sandbox-server.sh), which this script starts and
# stops. Needs GPUSYNC_BIN (or GS_BUILD_DIR). Exits non-zero on any failure.
# GS_EMACS_SKIP_RUN=1 skips the run tests; GS_KEEP=1 keeps the work folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
GPUSYNC_BIN=${GPUSYNC_BIN:-${GS_BUILD_DIR:+$GS_BUILD_DIR/cli/gpusync}}
[[ -x ${GPUSYNC_BIN:-} ]] || { echo "emacs test: set GPUSYNC_BIN to the gpusync binary" >&2; exit 2; }
command -v emacs >/dev/null || { echo "emacs test: emacs not found; skipped" >&2; exit 77; }

work=$(mktemp -d /tmp/gs-emacs-test.XXXXXX)
cleanup() {
    # A daemon the test left behind (it failed before :Gpusync stop) must not outlive it.
    (cd "$work/project" 2>/dev/null && "$GPUSYNC_BIN" watch --stop >/dev/null 2>&1) || true
    "$repo/scripts/sandbox-server.sh" stop "$work/sandbox" || true
    if [[ ${GS_KEEP:-0} == 1 ]]; then echo "emacs test: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
eval "$("$repo/scripts/sandbox-server.sh" start --dir "$work/sandbox")"
export HOME=$GS_SANDBOX_HOME
unset SSH_AUTH_SOCK
mkdir "$work/project"
cd "$work/project"
"$GPUSYNC_BIN" init "root@127.0.0.1:$GS_SANDBOX_PORT" --accept-new-host-key --path "$work/remote" >/dev/null

export GS_PROJECT=$work/project GS_REMOTE=$work/remote GPUSYNC_BIN
timeout 300 emacs --batch -Q -L "$here" -l "$here/test/gpusync-test.el" -f ert-run-tests-batch-and-exit
