#!/usr/bin/env bash
# demo.sh: gpusync's main job end to end against an embedded default server: a real sshd on
# loopback (scripts/sandbox-server.sh) playing the GPU server. It builds gpusync, makes a small
# project, points gpusync at the sandbox, checks the server with `doctor`, mirrors the project,
# and runs the bundled trainer there (GPU ranks where the machine has GPUs, CPU ranks otherwise).
# Nothing outside /tmp/gpusync-demo is touched: the demo uses the sandbox's own HOME and keys.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

./scripts/setup.sh
gpusync=$repo/build/cli/gpusync

demo=/tmp/gpusync-demo
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Starting the sandbox GPU server (real OpenSSH on 127.0.0.1)"
[[ -d $demo/server ]] && ./scripts/sandbox-server.sh stop "$demo/server" || true
rm -rf "$demo" && mkdir -p "$demo/project"
eval "$(./scripts/sandbox-server.sh start --dir "$demo/server")"
trap './scripts/sandbox-server.sh stop "$demo/server"' EXIT
echo "sshd listening on 127.0.0.1:$GS_SANDBOX_PORT"
export HOME=$GS_SANDBOX_HOME
unset SSH_AUTH_SOCK

step "A small project"
cd "$demo/project"
mkdir -p src data
printf 'print("hello from the server")\n' >src/hello.py
printf '__pycache__/\ndata/\n' >.gitignore
ls -R

step "gpusync init root@127.0.0.1:$GS_SANDBOX_PORT"
"$gpusync" init "root@127.0.0.1:$GS_SANDBOX_PORT" --accept-new-host-key

step "gpusync doctor"
"$gpusync" doctor || true

step "gpusync exec -- uname -a"
"$gpusync" exec -- uname -a

echo
echo "Demo finished. Try it yourself: export HOME=$GS_SANDBOX_HOME; cd $demo/project; $gpusync --help"
