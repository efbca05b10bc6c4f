# ide/test-lib.sh: the set-up every editor test shares, sourced by ide/*/test.sh: it finds the
# gpusync binary, skips (77) when the editor is missing, starts a private sandbox server, points
# HOME at its keys and inits a project in $work/project whose remote is $work/remote. The server
# and any daemon are stopped at exit; GS_KEEP=1 keeps $work.
#
#   gs_ide_test_setup NAME TOOL    (sets here, repo, work; exports GS_PROJECT GS_REMOTE GS_WORK)

gs_ide_test_setup() {
    local name=$1 tool=$2
    here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
    repo=$(cd "$here/../.." && pwd)
    GPUSYNC_BIN=${GPUSYNC_BIN:-${GS_BUILD_DIR:+$GS_BUILD_DIR/cli/gpusync}}
    [[ -x ${GPUSYNC_BIN:-} ]] || { echo "$name test: set GPUSYNC_BIN to the gpusync binary" >&2; exit 2; }
    command -v "$tool" >/dev/null || { echo "$name test: $tool not found; skipped" >&2; exit 77; }
    work=$(mktemp -d "/tmp/gs-$name-test.XXXXXX")
    GS_IDE_TEST_NAME=$name
    trap gs_ide_test_cleanup EXIT
    eval "$("$repo/scripts/sandbox-server.sh" start --dir "$work/sandbox")"
    export HOME=$GS_SANDBOX_HOME
    unset SSH_AUTH_SOCK
    mkdir "$work/project"
    cd "$work/project"
    "$GPUSYNC_BIN" init "root@127.0.0.1:$GS_SANDBOX_PORT" --accept-new-host-key \
        --path "$work/remote" >/dev/null
    export GS_PROJECT=$work/project GS_REMOTE=$work/remote GS_WORK=$work GPUSYNC_BIN
    gs_ide_slow_project
}

# A second project, $work/slow (remote $work/remote-slow), whose server is reached through the
# build's WAN simulator (tests/tools/wansim), so a test can slow the link (`GS_WANSIM --ctl
# GS_WANSIM_CTL rate 2`, in Mbit/s) or cut it (`cut`, then `restore`). Left out (GS_SLOW_PROJECT
# unset) when wansim was not built.
gs_ide_slow_project() {
    local wansim
    wansim=$(cd "$(dirname "$GPUSYNC_BIN")/.." && pwd)/tests/tools/wansim
    [[ -x $wansim ]] || return 0
    "$wansim" --listen 127.0.0.1:0 --target "127.0.0.1:$GS_SANDBOX_PORT" \
        --control "$work/wansim.sock" >"$work/wansim.out" 2>&1 &
    GS_WANSIM_PID=$!
    local i port=
    for ((i = 0; i < 100; i++)); do
        port=$(awk 'NR == 1 { print $2 }' "$work/wansim.out" 2>/dev/null)
        [[ -n $port ]] && break
        sleep 0.05
    done
    [[ -n $port ]] || { echo "$GS_IDE_TEST_NAME test: wansim did not start" >&2; return 1; }
    mkdir "$work/slow"
    (cd "$work/slow" && "$GPUSYNC_BIN" init "root@127.0.0.1:$port" --accept-new-host-key \
        --path "$work/remote-slow" >/dev/null)
    export GS_SLOW_PROJECT=$work/slow GS_SLOW_REMOTE=$work/remote-slow GS_WANSIM=$wansim \
        GS_WANSIM_CTL=$work/wansim.sock
}

gs_ide_test_cleanup() {
    # A daemon the test left behind (it failed before stopping it) must not outlive it.
    local p
    for p in project slow; do
        (cd "$work/$p" 2>/dev/null && "$GPUSYNC_BIN" watch --stop >/dev/null 2>&1) || true
    done
    [[ -z ${GS_WANSIM_PID:-} ]] || kill "$GS_WANSIM_PID" 2>/dev/null || true
    "$repo/scripts/sandbox-server.sh" stop "$work/sandbox" || true
    if [[ ${GS_KEEP:-0} == 1 ]]; then
        echo "$GS_IDE_TEST_NAME test: kept $work"
    else
        rm -rf "$work"
    fi
}
