#!/usr/bin/env bash
# real/install.sh: installs what the real-VS-Code test needs, once, into a cache outside the
# repository: code-server (VS Code served to a browser, from npm) and puppeteer-core, plus the Debian
# packages chromium, ripgrep and libkrb5-dev. Prints the cache folder. Safe to run again: a
# finished install (marked by .done) is reused.
#
#   ide/vscode/real/install.sh [CACHE]   (default ${GS_TEST_CACHE:-~/.cache/gpusync-test}/code-server)
#
# code-server's own postinstall cannot run here, so this does its steps by hand:
#  - @vscode/ripgrep's postinstall downloads rg from GitHub (unreachable): the dependencies are
#    installed with --ignore-scripts and Debian's rg is put where the package keeps its binary;
#  - the other native modules (kerberos needs libkrb5-dev; node-pty runs `npx node-gyp`, hence
#    npm_config_yes) are then built with `npm rebuild`;
#  - node_modules.asar is linked to node_modules and the bin scripts linked, as postinstall does.
# 4.100.3 is VS Code 1.100, the last code-server whose engines.node is 20 (later ones need node 24).
set -euo pipefail

CODE_SERVER_VERSION=4.100.3
PUPPETEER_VERSION=24.43.1
cache=${1:-${GS_TEST_CACHE:-$HOME/.cache/gpusync-test}/code-server}
log() { echo "install.sh: $*" >&2; }

install_debian_packages() {
    local missing=() p
    for p in chromium ripgrep libkrb5-dev; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    log "installing ${missing[*]}"
    local sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get update -qq
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# lib/vscode's dependencies, without the ripgrep download; then the native modules.
install_vscode_modules() {
    local vs=$1
    (cd "$vs" && npm install --ignore-scripts --omit=dev --no-audit --no-fund >&2)
    mkdir -p "$vs/node_modules/@vscode/ripgrep/bin"
    ln -sf "$(command -v rg)" "$vs/node_modules/@vscode/ripgrep/bin/rg"
    (cd "$vs" && npm_config_yes=true npm rebuild --no-audit --no-fund kerberos node-pty \
        @parcel/watcher @vscode/spdlog @vscode/deviceid native-watchdog >&2)
    rm -rf "$vs/node_modules.asar"
    ln -s node_modules "$vs/node_modules.asar"
    ln -sf code-linux.sh "$vs/bin/remote-cli/code-server"
    ln -sf browser-linux.sh "$vs/bin/helpers/browser.sh"
    (cd "$vs/extensions" && npm install --omit=dev --no-audit --no-fund >&2)
}

main() {
    if [[ -f $cache/.done && $(cat "$cache/.done") == "$CODE_SERVER_VERSION $PUPPETEER_VERSION" ]]; then
        echo "$cache"
        return 0
    fi
    install_debian_packages
    rm -rf "$cache"
    mkdir -p "$cache"
    echo '{"private": true}' >"$cache/package.json"
    log "installing code-server $CODE_SERVER_VERSION and puppeteer-core $PUPPETEER_VERSION into $cache"
    (cd "$cache" && npm install --ignore-scripts --no-audit --no-fund \
        "code-server@$CODE_SERVER_VERSION" "puppeteer-core@$PUPPETEER_VERSION" >&2)
    install_vscode_modules "$cache/node_modules/code-server/lib/vscode"
    (cd "$cache" && npm rebuild --no-audit --no-fund argon2 >&2)
    echo "$CODE_SERVER_VERSION $PUPPETEER_VERSION" >"$cache/.done"
    echo "$cache"
}

main "$@"
