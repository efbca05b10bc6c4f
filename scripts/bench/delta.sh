#!/usr/bin/env bash
# delta.sh: a one-cell edit of a 20 MB notebook-like file (JSON with base64 images) through the WAN
# simulator (50 ms RTT; 50 and 10 Mbit/s, tmpfs on both ends):
#  1. `gpusync push` of the edit against `rsync -az` of the same edit (both send deltas);
#  2. save-to-visible under `gpusync watch` (SAMPLES edits, default 20), p50/p90 against the target
#     of 1 RTT + 100 ms.
#   scripts/bench/delta.sh        (RUNS=5 for more samples; RATES="50 10"; DELAY_MS one way)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
delay=${DELAY_MS:-25}
samples=${SAMPLES:-20}
rtt=$((2 * delay))
nb=$repo/scripts/bench/notebook.py

[[ -x $gpusync && -x $wansim ]] || "$repo/scripts/setup.sh" >/dev/null
bench_start_server

pct() { # FILE -> "p50 p90"
    sort -g "$1" | awk '{a[NR]=$1} END {printf "%.0f %.0f", a[int(NR*0.5+0.5)], a[int(NR*0.9+0.5)]}'
}

one_rate() { # RATE_MBIT
    local rate=$1 p=$bench/proj-$1 remote=$bench/remote-$1
    [[ -n ${wan_pid:-} ]] && kill "$wan_pid" && wait "$wan_pid" 2>/dev/null || true
    bench_start_wan "$delay" "$rate"
    bench_trust "$wan_port"
    local ssh
    ssh=$(ssh_cmd "$wan_port")
    mkdir -p "$p" "$remote"
    python3 "$nb" gen "$p/analysis.ipynb"
    gpusync_project "$p" "$remote/g" "$wan_port"
    (cd "$p" && "$gpusync" push >/dev/null)
    rsync -az -e "$ssh" --exclude=.gpusync "$p/" "root@127.0.0.1:$remote/r/"
    local g=() r=() link=0
    for i in $(seq 1 "$runs"); do
        python3 "$nb" edit "$p/analysis.ipynb" "$i"
        local t0=$EPOCHREALTIME out
        out=$(cd "$p" && "$gpusync" push --json)
        g+=("$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f", b - a}')")
        link=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["link_bytes"])' "$out")
        r+=("$(time_cmd rsync -az -e "$ssh" --exclude=.gpusync "$p/" "root@127.0.0.1:$remote/r/")")
        cmp -s "$p/analysis.ipynb" "$remote/g/analysis.ipynb" || { echo "bench: gpusync copy differs" >&2; exit 1; }
    done
    local gm rm
    gm=$(median "${g[@]}")
    rm=$(median "${r[@]}")
    printf '%-9s %-22s %9.2f %9.2f %8s   %s\n' "${rate}M" "push (gpusync)" "$gm" \
        "$(awk -v a="$gm" -v b="$rm" 'BEGIN {print a / b}')" "$link" "${g[*]}"
    printf '%-9s %-22s %9.2f %9.2f %8s   %s\n' "" "rsync -az" "$rm" 1 "" "${r[*]}"
    (cd "$p" && "$gpusync" watch -d >/dev/null && "$gpusync" flush >/dev/null)
    python3 "$nb" latency "$p/analysis.ipynb" "$remote/g/analysis.ipynb" "$samples" >"$bench/lat-$rate"
    (cd "$p" && "$gpusync" watch --stop >/dev/null)
    read -r p50 p90 <<<"$(pct "$bench/lat-$rate")"
    printf '%-9s %-22s %9s %9s %8s   p90 %s ms; target <= %s ms\n' "" "watch save-to-visible" \
        "${p50}ms" "" "" "$p90" "$((rtt + 100))"
}

size=$(python3 -c 'import os,sys; print(1)' >/dev/null; echo 20)
echo "one-cell edit of a ${size} MB notebook; RTT ${rtt} ms; $runs push runs, $samples watch saves; tmpfs"
printf '%-9s %-22s %9s %9s %8s   %s\n' link what median_s vs_rsync link_B runs
for rate in ${RATES:-50 10}; do
    one_rate "$rate"
done
