#!/usr/bin/env bash
# run.sh: gpusync run through the WAN simulator (50 ms RTT): (1) the time from `gpusync run` to
# rank 0's first log line, nothing to sync, agent already installed (the command opens its own
# SSH connection, as a user's does); (2) the delay from a line written on the server to it
# printed here (p50, p99), for lines printed every 50 ms.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
delay=${DELAY_MS:-25}
samples=${SAMPLES:-200}
[[ -x $gpusync && -x $wansim ]] || "$repo/scripts/setup.sh" >/dev/null
bench_start_server
bench_start_wan "$delay" "${RATE_MBIT:-50}"
bench_trust "$wan_port"
rtt=$((2 * delay))
proj=$bench/proj
mkdir -p "$proj" && echo x >"$proj/a.py"
gpusync_project "$proj" "$bench/remote/proj" "$wan_port"
cd "$proj" && "$gpusync" push >/dev/null

firsts=()
for i in $(seq 1 "${RUNS:-5}"); do
    firsts+=("$(python3 "$repo/scripts/bench/run_lines.py" first "$gpusync" run --cpu 1 --no-sync \
        -- echo first)")
done
python3 "$repo/scripts/bench/run_lines.py" lines "$gpusync" run --cpu 1 --no-sync -- sh -c \
    "for i in \$(seq $samples); do date +%s%N; sleep 0.05; done" >"$bench/lines"

echo "gpusync run through the WAN simulator, RTT $rtt ms"
printf '%-44s %s\n' "run to first log line (s), each run:" "${firsts[*]}"
printf '%-44s %s s\n' "  median" "$(median "${firsts[@]}")"
sort -g "$bench/lines" | awk -v r="$rtt" '{a[NR]=$1} END {
    printf "line delay over %d lines: p50 %.1f ms, p99 %.1f ms (target p50 <= %d ms)\n",
        NR, a[int(NR*0.5+0.5)], a[int(NR*0.99+0.5)], r + 20}'
