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
}

gs_ide_test_cleanup() {
    # A daemon the test left behind (it failed before stopping it) must not outlive it.
    (cd "$work/project" 2>/dev/null && "$GPUSYNC_BIN" watch --stop >/dev/null 2>&1) || true
    "$repo/scripts/sandbox-server.sh" stop "$work/sandbox" || true
    if [[ ${GS_KEEP:-0} == 1 ]]; then
        echo "$GS_IDE_TEST_NAME test: kept $work"
    else
        rm -rf "$work"
    fi
}
