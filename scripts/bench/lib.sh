# scripts/bench/lib.sh: shared set-up for the benchmarks: the sandbox server, the WAN simulator,
# ssh options for the peers (rsync, tar | ssh, sftp, scp), timing and medians. Sourced, not run.
# Everything lives on tmpfs (/dev/shm): disk timings on these machines are noisy by about 2x.

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${GS_BUILD:-$repo/build}
gpusync=$build/cli/gpusync
wansim=$build/tests/tools/wansim
bench=/dev/shm/gpusync-bench-$(basename "$0" .sh)
runs=${RUNS:-3}

bench_start_server() {
    rm -rf "$bench" && mkdir -p "$bench"
    eval "$("$repo/scripts/sandbox-server.sh" start --dir "$bench/server")"
    export HOME=$GS_SANDBOX_HOME
    unset SSH_AUTH_SOCK
    ssh_port=$GS_SANDBOX_PORT
    trap bench_stop EXIT
}

bench_stop() {
    [[ -n ${wan_pid:-} ]] && kill "$wan_pid" 2>/dev/null
    "$repo/scripts/sandbox-server.sh" stop "$bench/server" 2>/dev/null || true
    rm -rf "$bench"
}

# bench_start_wan DELAY_MS_ONE_WAY RATE_MBIT: sets wan_port (0 delay and rate: loopback only).
bench_start_wan() {
    local fifo=$bench/wan.out
    mkfifo "$fifo"
    "$wansim" --listen 127.0.0.1:0 --target "127.0.0.1:$ssh_port" --delay-ms "$1" \
        --rate-mbit "$2" --control "$bench/wan.sock" >"$fifo" &
    wan_pid=$!
    read -r _ wan_port <"$fifo"
    rm -f "$fifo"
}

# Records the sandbox host key for the port in use, so every tool connects without prompts.
bench_trust() {
    local port=$1
    printf '[127.0.0.1]:%s %s\n' "$port" "$(cut -d' ' -f1-2 "$bench/server/host_ed25519.pub")" \
        >>"$HOME/.ssh/known_hosts"
}

ssh_cmd() {
    # OpenSSH takes ~ from the passwd entry, not $HOME: name the sandbox files explicitly.
    echo "ssh -p $1 -i $HOME/.ssh/id_ed25519 -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=$HOME/.ssh/known_hosts"
}

# time_cmd CMD...: prints the wall time of CMD in seconds.
time_cmd() {
    local start=$EPOCHREALTIME
    "$@" >/dev/null 2>"$bench/last.err" || { echo "bench: failed: $*" >&2; cat "$bench/last.err" >&2; return 1; }
    awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f\n", b - a}'
}

median() {
    printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'
}

# gpusync_project DIR REMOTE_PATH PORT: writes a config for DIR ([sync] compress from $COMPRESS,
# when set: auto, zstd or off).
gpusync_project() {
    mkdir -p "$1/.gpusync"
    printf '[remote]\nhost = 127.0.0.1\nport = %s\nuser = root\npath = %s\n' "$3" "$2" \
        >"$1/.gpusync/config"
    if [[ -n ${COMPRESS:-} ]]; then
        printf '[sync]\ncompress = %s\n' "$COMPRESS" >>"$1/.gpusync/config"
    fi
}
