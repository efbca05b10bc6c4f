#!/usr/bin/env bash
# sync.sh: initial sync and re-push benchmarks through the WAN simulator (50 ms RTT, 50 Mbit/s,
# tmpfs on both ends), gpusync against rsync -a -e ssh and tar | ssh tar x in the same run.
#
#   scripts/bench/sync.sh            (RUNS=5 for more samples; DELAY_MS / RATE_MBIT to change the link;
#                                     HUGE=1 adds the re-push of a 200,000-file tree)
#
# Every tool pays its own SSH connection set-up, as a user running it would. The physical floor is
# the content bytes at the link rate plus one round trip.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
delay=${DELAY_MS:-25}
rate=${RATE_MBIT:-50}

[[ -x $gpusync && -x $wansim ]] || "$repo/scripts/setup.sh" >/dev/null
bench_start_server
bench_start_wan "$delay" "$rate"
bench_trust "$wan_port"
ssh=$(ssh_cmd "$wan_port")
rtt_s=$(awk -v d="$delay" 'BEGIN {print 2 * d / 1000}')

# Warm-up: installs the agent on the server so that no timed run includes it.
mkdir -p "$bench/warm" && echo hi >"$bench/warm/a"
gpusync_project "$bench/warm" "$bench/remote/warm" "$wan_port"
(cd "$bench/warm" && "$gpusync" push >/dev/null)

run_gpusync() { # SRC N: a first push each time, with nothing remembered of the link or files
    rm -rf "$1/.gpusync/index.db"* "$1/.gpusync/link" "$1/.gpusync/sigs"
    gpusync_project "$1" "$bench/remote/gpusync-$2" "$wan_port"
    (cd "$1" && time_cmd "$gpusync" push)
}
run_rsync() { time_cmd rsync -a -e "$ssh" --exclude=.gpusync "$1/" "root@127.0.0.1:$bench/remote/rsync-$2/"; }
run_tar() {
    local t0=$EPOCHREALTIME
    tar -C "$1" --exclude=.gpusync -cf - . | $ssh root@127.0.0.1 "mkdir -p $bench/remote/tar-$2 && tar -xf - -C $bench/remote/tar-$2"
    awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f\n", b - a}'
}

row() { # LABEL TOOL TIMES... (uses $ref and $floor)
    local label=$1 tool=$2
    shift 2
    local m
    m=$(median "$@")
    printf '%-26s %-8s %9.2f %9.2f %9.2f   %s\n' "$label" "$tool" "$m" \
        "$(awk -v a="$m" -v b="$ref" 'BEGIN {print a / b}')" \
        "$(awk -v a="$m" -v b="$floor" 'BEGIN {print a / b}')" "$*"
    eval "last_median=$m"
}

initial_sync() { # KIND LABEL
    local src=$bench/src-$1
    python3 "$repo/scripts/bench/gen_tree.py" "$1" "$src"
    local bytes
    # content bytes: file sizes only (du -sb would add 4 KiB per directory to the floor)
    bytes=$(find "$src" -path "$src/.gpusync" -prune -o -type f -printf '%s\n' |
        awk '{s += $1} END {print s}')
    floor=$(awk -v b="$bytes" -v r="$rate" -v t="$rtt_s" 'BEGIN {print b * 8 / (r * 1e6) + t}')
    local g=() r=() t=()
    for i in $(seq 1 "$runs"); do
        g+=("$(run_gpusync "$src" "$1-$i")")
        r+=("$(run_rsync "$src" "$1-$i")")
        t+=("$(run_tar "$src" "$1-$i")")
        rm -rf "$bench/remote/"*"-$1-$i"
    done
    ref=$(median "${r[@]}")
    local label
    label="$2 ($(awk -v b="$bytes" 'BEGIN {printf "%.1f MB", b / 1e6}'))"
    row "$label" gpusync "${g[@]}"
    row "" rsync "${r[@]}"
    row "" tar+ssh "${t[@]}"
    printf '%-26s %-8s %9.2f\n' "" floor "$floor"
}

# A real, compressible source tree that Debian installs: Python 3.11's standard library (.py files
# only), against the peers that compress too: rsync -az and tar | zstd -3 | ssh.
run_rsync_z() { time_cmd rsync -az -e "$ssh" --exclude=.gpusync "$1/" "root@127.0.0.1:$bench/remote/rsyncz-$2/"; }
run_tar_zstd() {
    local t0=$EPOCHREALTIME
    tar -C "$1" --exclude=.gpusync -cf - . | zstd -q -3 -c |
        $ssh root@127.0.0.1 "mkdir -p $bench/remote/tarz-$2 && zstd -q -d -c | tar -xf - -C $bench/remote/tarz-$2"
    awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f\n", b - a}'
}
real_tree() {
    local src=$bench/src-real from=/usr/lib/python3.11
    rm -rf "$src" && mkdir -p "$src"
    (cd "$from" && find . -name '*.py' -not -path '*/__pycache__/*' -print0 |
        tar --null -T - -cf -) | tar -xf - -C "$src"
    local bytes
    bytes=$(find "$src" -path "$src/.gpusync" -prune -o -type f -printf '%s\n' | awk '{s += $1} END {print s}')
    floor=$(awk -v b="$bytes" -v r="$rate" -v t="$rtt_s" 'BEGIN {print b * 8 / (r * 1e6) + t}')
    local g=() r=() z=() t=() tz=()
    for i in $(seq 1 "$runs"); do
        g+=("$(run_gpusync "$src" "real-$i")")
        r+=("$(run_rsync "$src" "real-$i")")
        z+=("$(run_rsync_z "$src" "real-$i")")
        t+=("$(run_tar "$src" "real-$i")")
        tz+=("$(run_tar_zstd "$src" "real-$i")")
        diff -r --exclude=.gpusync "$src" "$bench/remote/gpusync-real-$i" >/dev/null
        rm -rf "$bench/remote/"*"-real-$i"
    done
    ref=$(median "${z[@]}")
    local label
    label="python3.11 stdlib ($(awk -v b="$bytes" 'BEGIN {printf "%.1f MB", b / 1e6}'))"
    echo
    echo "a real source tree, $(find "$src" -type f | wc -l) files from $from (ratios: vs rsync -az)"
    printf '%-26s %-8s %9s %9s %9s   %s\n' workload tool median_s vs_rsyncz vs_floor runs
    row "$label" gpusync "${g[@]}"
    row "" rsync "${r[@]}"
    row "" rsync-z "${z[@]}"
    row "" tar+ssh "${t[@]}"
    row "" tar+zstd "${tz[@]}"
    printf '%-26s %-8s %9.2f\n' "" floor "$floor"
}

echo "link: ${delay} ms each way (RTT $((2 * delay)) ms), ${rate} Mbit/s; $runs runs per tool; tmpfs"
if [[ ${ONLY:-} == real ]]; then # just the real tree (ONLY=real scripts/bench/sync.sh)
    real_tree
    exit 0
fi
printf '%-26s %-8s %9s %9s %9s   %s\n' workload tool median_s vs_rsync vs_floor runs
initial_sync small "2,000 x 4 KiB"
initial_sync project "ML project"
real_tree

# Re-push with one file changed in a KIND tree of COUNT files ("20,000").
repush() { # KIND COUNT
    local kind=$1 count=$2 src=$bench/src-$1 file
    python3 "$repo/scripts/bench/gen_tree.py" "$kind" "$src"
    file=$(cd "$src" && find . -name '*.py' | sort | sed -n 8p)
    gpusync_project "$src" "$bench/remote/gpusync-$kind" "$wan_port"
    (cd "$src" && "$gpusync" push >/dev/null)
    rsync -a -e "$ssh" --exclude=.gpusync "$src/" "root@127.0.0.1:$bench/remote/rsync-$kind/"
    local g=() r=() w=()
    for i in $(seq 1 "$runs"); do
        echo "change $i" >>"$src/$file"
        g+=("$(cd "$src" && time_cmd "$gpusync" push)")
        r+=("$(run_rsync "$src" "$kind")")
    done
    # The daemon first checks the whole tree; that first flush is not what is measured.
    (cd "$src" && "$gpusync" watch -d >/dev/null && "$gpusync" flush >/dev/null)
    for i in $(seq 1 "$runs"); do
        echo "warm change $i" >>"$src/$file"
        w+=("$(cd "$src" && time_cmd "$gpusync" flush)")
    done
    (cd "$src" && "$gpusync" watch --stop >/dev/null)
    cmp "$src/$file" "$bench/remote/gpusync-$kind/$file"
    ref=$(median "${r[@]}")
    floor=$(awk -v t="$rtt_s" 'BEGIN {print 2 * t + 0.05}')
    echo
    echo "re-push, 1 file changed in $count (target for a warm connection: 2 RTT + 50 ms = ${floor} s)"
    printf '%-26s %-8s %9s %9s %9s   %s\n' workload tool median_s vs_rsync vs_target runs
    row "push, new connection" gpusync "${g[@]}"
    row "watch daemon, flush" gpusync "${w[@]}"
    row "" rsync "${r[@]}"
}
repush big "20,000"
# HUGE=1: also a 200,000-file tree (a vendored environment synced too; minutes to set up)
if [[ ${HUGE:-0} == 1 ]]; then
    repush huge "200,000"
fi
