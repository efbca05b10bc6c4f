#!/usr/bin/env bash
# ide/vscode/test-real.sh: the extension in a real VS Code: installs (cached) code-server and
# Chromium (real/install.sh), installs the packaged .vsix into code-server, opens a sandbox project
# (sandbox sshd, `gpusync init` done) and drives the workbench in headless Chromium (real/drive.js):
# Start Watching, edit and save in the editor, the status bar through its states, a conflict,
# Run Job (2 CPU ranks) into the "gpusync logs" channel, Stop Run, Show GPUs.
#   GPUSYNC_BIN=/path/to/build/cli/gpusync ide/vscode/test-real.sh
# GS_TEST_CACHE: where the install is cached (default ~/.cache/gpusync-test). GS_SHOTS: where to
# write the screenshots (default: the test's work folder, kept with GS_KEEP=1).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../test-lib.sh
. "$here/../test-lib.sh"

# code-server 4.100.3's native modules and engines.node are node 20's.
if [[ $(node -p 'process.versions.node.split(".")[0]' 2>/dev/null) != 20 ]]; then
    echo "vscode-real test: needs node 20 (code-server 4.100.3); skipped" >&2
    exit 77
fi
# Before the set-up moves HOME to the sandbox's.
cache=$("$here/real/install.sh" "${GS_TEST_CACHE:-$HOME/.cache/gpusync-test}/code-server")
gs_ide_test_setup vscode-real chromium
code_server=(node "$cache/node_modules/code-server/out/node/entry.js" --config "$work/code-server.yaml"
    --user-data-dir "$work/vscode-data" --extensions-dir "$work/vscode-extensions")

package_vsix() {
    (cd "$here" && { [[ -d node_modules ]] || npm ci --no-audit --no-fund >&2; } &&
        ./node_modules/.bin/vsce package --skip-license --allow-missing-repository --out "$work/gpusync.vsix" >&2)
}

# What a user would set, plus no welcome page, no workspace-trust prompt and no network calls.
write_settings() {
    mkdir -p "$work/vscode-data/User"
    cat >"$work/vscode-data/User/settings.json" <<JSON
{
  "gpusync.path": "$GPUSYNC_BIN",
  "workbench.startupEditor": "none",
  "security.workspace.trust.enabled": false,
  "telemetry.telemetryLevel": "off",
  "extensions.autoCheckUpdates": false,
  "extensions.autoUpdate": false,
  "workbench.enableExperiments": false
}
JSON
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

answers() {
    node -e 'require("http").get(process.argv[1], (r) => process.exit(r.statusCode === 200 ? 0 : 1))
        .on("error", () => process.exit(1))' "$1"
}

# Starts code-server on a free port and waits (deadline 60 s) until it answers.
start_code_server() {
    port=$(free_port)
    "${code_server[@]}" --auth none --bind-addr "127.0.0.1:$port" --disable-telemetry \
        --disable-update-check --disable-workspace-trust >"$work/code-server.log" 2>&1 &
    code_server_pid=$!
    local end=$((SECONDS + 60))
    until answers "http://127.0.0.1:$port/healthz"; do
        kill -0 "$code_server_pid" 2>/dev/null || { cat "$work/code-server.log" >&2; return 1; }
        ((SECONDS < end)) || { echo "test-real.sh: code-server did not answer" >&2; return 1; }
        sleep 0.2
    done
}

stop_code_server() {
    [[ -n ${code_server_pid:-} ]] && kill "$code_server_pid" 2>/dev/null || true
    gs_ide_test_cleanup
}
trap stop_code_server EXIT

package_vsix
"${code_server[@]}" --install-extension "$work/gpusync.vsix" >&2
write_settings
printf 'x = 0\n' >"$GS_PROJECT/edited.py"
start_code_server
GS_URL="http://127.0.0.1:$port/?folder=$GS_PROJECT" GS_SHOTS=${GS_SHOTS:-$work/screenshots} \
    NODE_PATH="$cache/node_modules" node "$here/real/drive.js" || {
    echo "test-real.sh: code-server's log:" >&2
    tail -n 40 "$work/code-server.log" >&2
    exit 1
}
