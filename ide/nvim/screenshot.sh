#!/usr/bin/env bash
# ide/nvim/screenshot.sh: makes ide/nvim/screenshot.txt, a text capture of Neovim's statusline and
# log buffer during and after a 2-rank CPU run of the bundled trainer: a real Neovim runs
# test/screenshot.lua inside a detached tmux session against a private sandbox server, and tmux
# capture-pane saves the screen at both points.
# Needs GPUSYNC_BIN (or GS_BUILD_DIR), tmux and nvim. OUT=FILE writes elsewhere.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
GPUSYNC_BIN=${GPUSYNC_BIN:-${GS_BUILD_DIR:+$GS_BUILD_DIR/cli/gpusync}}
[[ -x ${GPUSYNC_BIN:-} ]] || { echo "screenshot: set GPUSYNC_BIN to the gpusync binary" >&2; exit 2; }
out=${OUT:-$here/screenshot.txt}
work=$(mktemp -d /tmp/gs-nvim-shot.XXXXXX)
session=gs-shot-$$
cleanup() {
    tmux kill-session -t "$session" 2>/dev/null || true
    (cd "$work/project" 2>/dev/null && "$GPUSYNC_BIN" watch --stop >/dev/null 2>&1) || true
    "$repo/scripts/sandbox-server.sh" stop "$work/sandbox" || true
    rm -rf "$work"
}
trap cleanup EXIT
eval "$("$repo/scripts/sandbox-server.sh" start --dir "$work/sandbox")"
export HOME=$GS_SANDBOX_HOME
unset SSH_AUTH_SOCK
mkdir "$work/project"
cd "$work/project"
"$GPUSYNC_BIN" init "root@127.0.0.1:$GS_SANDBOX_PORT" --accept-new-host-key --path "$work/remote" >/dev/null

export GS_PROJECT=$work/project GS_SHOT_DONE=$work/done GPUSYNC_BIN
tmux new-session -d -s "$session" -x 118 -y 24 -e "GS_PROJECT=$GS_PROJECT" -e "GS_SHOT_DONE=$GS_SHOT_DONE" \
    -e "GPUSYNC_BIN=$GPUSYNC_BIN" -e "HOME=$HOME" \
    nvim -u NONE -i NONE -n --cmd "set rtp^=$here" -c "runtime plugin/gpusync.lua" \
    -c "luafile $here/test/screenshot.lua"
# Waits (at most ~3 minutes) for the marker file the session writes, then captures the screen.
capture() {
    local marker=$1 title=$2
    for _ in $(seq 1 900); do
        [[ -f $marker ]] && break
        sleep 0.2
    done
    [[ -f $marker ]] || echo "screenshot: the session did not get to '$title'; capturing anyway" >&2
    echo "---- $title ----"
    tmux capture-pane -p -t "$session" | sed -e "s#$work#/tmp/demo#g"
}
{
    capture "$GS_SHOT_DONE.mid" "during the run: :Gpusync run train cpu=2 -- --epochs 4 --limit-train 20000"
    capture "$GS_SHOT_DONE" "after the run"
} >"$out"
echo "screenshot: wrote $out"
