#!/bin/sh
# ide/vscode/test.sh: the extension's tests: npm ci when node_modules is missing, node's test
# runner (a fake `vscode` module, the real gpusync in $GPUSYNC_BIN against a sandbox sshd), then
# a .vsix built with @vscode/vsce, checked to hold the extension's main file.
#   GPUSYNC_BIN=/path/to/build/cli/gpusync sh ide/vscode/test.sh
# GS_VSIX_OUT: where to leave the .vsix (default: a temporary folder, removed at the end).
set -eu
cd "$(dirname "$0")"

if [ -z "${GPUSYNC_BIN:-}" ] && [ -n "${GS_BUILD_DIR:-}" ]; then
    GPUSYNC_BIN=$GS_BUILD_DIR/cli/gpusync
fi
[ -x "${GPUSYNC_BIN:-}" ] || { echo "test.sh: set GPUSYNC_BIN to the built gpusync binary" >&2; exit 1; }
export GPUSYNC_BIN

if [ ! -d node_modules ]; then
    npm ci --no-audit --no-fund
fi

node --test test/units.test.js test/extension.test.js

out=${GS_VSIX_OUT:-}
tmp=""
if [ -z "$out" ]; then
    tmp=$(mktemp -d)
    out=$tmp
    trap 'rm -rf "$tmp"' EXIT
fi
mkdir -p "$out"
version=$(node -p "require('./package.json').version")
vsix=$out/gpusync-$version.vsix
./node_modules/.bin/vsce package --skip-license --allow-missing-repository --out "$vsix"
[ -s "$vsix" ] || { echo "test.sh: $vsix was not written" >&2; exit 1; }
python3 - "$vsix" <<'PY'
import json, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
manifest = json.loads(zipfile.ZipFile(sys.argv[1]).read("extension/package.json"))
main = "extension/" + manifest["main"].lstrip("./")
need = {main, "extension/package.json", "extension/lib/cli.js", "extension/lib/syncstate.js",
        "extension/lib/config.js"}
missing = sorted(need - names)
stray = sorted(n for n in names if n.startswith(("extension/test/", "extension/node_modules/")))
if missing or stray:
    sys.exit("vsix: missing %s, should not hold %s" % (missing, stray))
print("vsix ok: %s (%d files, main %s)" % (sys.argv[1], len(names), main))
PY
