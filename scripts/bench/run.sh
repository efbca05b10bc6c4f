#!/usr/bin/env bash
# run.sh: gpusync run through the WAN simulator (50 ms RTT): (1) the time from `gpusync run` to
# rank 0's first log line, nothing to sync, agent already installed: once with the command opening
# its own SSH connection, once with `gpusync watch` running (the run goes through the daemon's
# spare connection, as it does for a user who keeps watch running); (2) the delay from a line
# written on the server to it printed here (p50, p99), for lines printed every 50 ms.
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

# first_lines PAUSE_S: RUNS runs, PAUSE_S apart. A user starts runs seconds apart; the daemon keeps
# two spare connections and replaces one a run takes within about 0.4 s (a new one: handshake and
# the server's shell); a run that finds none ready connects as a plain command would.
first_lines() {
    for i in $(seq 1 "${RUNS:-5}"); do
        sleep "$1"
        python3 "$repo/scripts/bench/run_lines.py" first "$gpusync" run --cpu 1 --no-sync \
            -- echo first
    done
}
line_delays() { # OUT: lines printed every 50 ms, each a server-side timestamp
    python3 "$repo/scripts/bench/run_lines.py" lines "$gpusync" run --cpu 1 --no-sync -- sh -c \
        "for i in \$(seq $samples); do date +%s%N; sleep 0.05; done" >"$1"
}
mapfile -t firsts < <(first_lines 0)
line_delays "$bench/lines"
"$gpusync" watch -d >/dev/null
"$gpusync" flush >/dev/null
mapfile -t warm < <(first_lines 1)
mapfile -t burst < <(first_lines 0)
sleep 1
line_delays "$bench/lines-warm"
"$gpusync" watch --stop >/dev/null

echo "gpusync run through the WAN simulator, RTT $rtt ms (target: 3 RTT + process start)"
printf '%-48s %s\n' "run to first log line (s), new connection:" "${firsts[*]}"
printf '%-48s %s s\n' "  median" "$(median "${firsts[@]}")"
printf '%-48s %s\n' "run to first log line (s), watch running, 1 s apart:" "${warm[*]}"
printf '%-48s %s s\n' "  median" "$(median "${warm[@]}")"
printf '%-48s %s\n' "  back to back (spares not yet replaced):" "${burst[*]}"
for f in lines lines-warm; do
    label=$([[ $f == lines ]] && echo "new connection" || echo "watch running")
    sort -g "$bench/$f" | awk -v r="$rtt" -v l="$label" '{a[NR]=$1} END {
        printf "line delay, %s, %d lines: p50 %.1f ms, p99 %.1f ms (target p50 <= %d ms)\n",
            l, NR, a[int(NR*0.5+0.5)], a[int(NR*0.99+0.5)], r + 20}'
done
