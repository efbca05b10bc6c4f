#!/usr/bin/env bash
# demo.sh: gpusync's main job end to end against an embedded default server: a real sshd on
# loopback (scripts/sandbox-server.sh) playing the GPU server. It builds gpusync, makes a small
# project, points gpusync at the sandbox, checks the server with `doctor`, mirrors the project
# (once, then live), and runs the bundled trainer there to a final test accuracy (GPU ranks where
# the machine has a GPU, CPU ranks otherwise). DEMO_EPOCHS=N changes the length (default 3).
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
trap '"$repo/scripts/sandbox-server.sh" stop "$demo/server"' EXIT
echo "sshd listening on 127.0.0.1:$GS_SANDBOX_PORT"
export HOME=$GS_SANDBOX_HOME
unset SSH_AUTH_SOCK

step "A small project"
cd "$demo/project"
mkdir -p src data
printf 'print("hello from the server")\n' >src/hello.py
printf '__pycache__/\ndata/\n' >.gitignore
ls -R

step "gpusync init root@127.0.0.1:$GS_SANDBOX_PORT --path $demo/remote"
"$gpusync" init "root@127.0.0.1:$GS_SANDBOX_PORT" --accept-new-host-key --path "$demo/remote"

step "gpusync doctor"
"$gpusync" doctor || true

step "gpusync push (one sync; data/ is ignored through .gitignore)"
dd if=/dev/urandom of=data/big.bin bs=1M count=8 status=none
"$gpusync" push
echo "on the server:"; (cd "$demo/remote" && find . -path ./.gpusync -prune -o -print | sort)

step "gpusync watch -d (live sync), then an edit, then flush"
"$gpusync" watch -d
printf 'print("edited while watching")\n' >src/hello.py
"$gpusync" flush
"$gpusync" exec -- cat src/hello.py
"$gpusync" status

step "gpusync run train: the bundled trainer on Fashion-MNIST, on the server"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    ranks=(--gpus 1)
else
    ranks=(--cpu 2)   # no GPU here: two CPU ranks with the trainer's TCP all-reduce
fi
set +e
"$gpusync" run "${ranks[@]}" train -- --epochs "${DEMO_EPOCHS:-3}"
code=$?
set -e
echo "run exit code: $code"

step "gpusync ps"
"$gpusync" ps
"$gpusync" watch --stop

echo
echo "Demo finished (the sandbox server stops now). To try it yourself:"
echo "  ./scripts/sandbox-server.sh start   # then: gpusync init root@127.0.0.1:PORT --accept-new-host-key"
exit "$code"
