#!/usr/bin/env bash
# latency.sh: live-sync benchmarks through the WAN simulator (50 ms RTT, 50 Mbit/s):
#  1. save-to-visible latency of one edited file (SAMPLES, default 200): the gpusync watch daemon
#     against rsync run per change (lsyncd without its delay) and a persistent sftp session putting
#     each change; p50, p90, p99, measured on the server side (latency.py);
#  2. a burst: 500 files rewritten by a git checkout, time until the server matches, against one
#     rsync -a of the tree;
#  3. an idle daemon on a 100,000-file tree: CPU seconds per minute and resident memory.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
delay=${DELAY_MS:-25}
samples=${SAMPLES:-200}
[[ -x $gpusync && -x $wansim ]] || "$repo/scripts/setup.sh" >/dev/null
bench_start_server
bench_start_wan "$delay" "${RATE_MBIT:-50}"
bench_trust "$wan_port"
ssh=$(ssh_cmd "$wan_port")
rtt=$((2 * delay))

pct() { # FILE -> "p50 p90 p99"
    sort -g "$1" | awk '{a[NR]=$1} END {printf "%.1f %.1f %.1f", a[int(NR*0.5+0.5)], a[int(NR*0.9+0.5)], a[int(NR*0.99+0.5)]}'
}

proj=$bench/proj
mkdir -p "$proj/src" "$bench/remote"
python3 "$repo/scripts/bench/gen_tree.py" small "$proj/src"
echo seed >"$proj/edit.py"
gpusync_project "$proj" "$bench/remote/gpusync" "$wan_port"
(cd "$proj" && "$gpusync" push >/dev/null && "$gpusync" watch -d >/dev/null && "$gpusync" flush >/dev/null)
python3 "$repo/scripts/bench/latency.py" gpusync "$proj/edit.py" "$bench/remote/gpusync/edit.py" \
    "$samples" >"$bench/lat-gpusync"
(cd "$proj" && "$gpusync" watch --stop >/dev/null)

rsync -a -e "$ssh" --exclude=.gpusync "$proj/" "root@127.0.0.1:$bench/remote/rsync/"
python3 "$repo/scripts/bench/latency.py" rsync "$proj/edit.py" "$bench/remote/rsync/edit.py" \
    "$samples" -- -a -e "$ssh" --exclude=.gpusync "$proj/" "root@127.0.0.1:$bench/remote/rsync/" \
    >"$bench/lat-rsync"

mkdir -p "$bench/remote/sftp" && cp "$proj/edit.py" "$bench/remote/sftp/"
python3 "$repo/scripts/bench/latency.py" sftp "$proj/edit.py" "$bench/remote/sftp/edit.py" \
    "$samples" -- -P "$wan_port" -i "$HOME/.ssh/id_ed25519" -o BatchMode=yes \
    -o UserKnownHostsFile="$HOME/.ssh/known_hosts" root@127.0.0.1 >"$bench/lat-sftp"

echo "save-to-visible latency, one file, RTT $rtt ms; $samples samples each (ms)"
echo "target for gpusync: p50 <= $((rtt + 15)), p99 <= $((rtt + 30))"
printf '%-34s %8s %8s %8s %10s\n' tool p50 p90 p99 p50_ratio
g50=$(pct "$bench/lat-gpusync" | cut -d' ' -f1)
for t in gpusync rsync sftp; do
    read -r p50 p90 p99 <<<"$(pct "$bench/lat-$t")"
    label=$t
    [[ $t == gpusync ]] && label="gpusync watch"
    [[ $t == rsync ]] && label="rsync per change (lsyncd-style)"
    [[ $t == sftp ]] && label="sftp put per change (open session)"
    printf '%-34s %8s %8s %8s %10.2f\n' "$label" "$p50" "$p90" "$p99" \
        "$(awk -v a="$p50" -v b="$g50" 'BEGIN {print a / b}')"
done

# 2. Burst: a git checkout that rewrites 500 files.
burst=$bench/burst
mkdir -p "$burst" && cd "$burst"
git init -q && git config user.email b@b && git config user.name b
python3 "$repo/scripts/bench/gen_tree.py" small .
printf '.gpusync/\n' >.gitignore
git add -A && git commit -qm one
base=$(git symbolic-ref --short HEAD)
git checkout -qb two
for f in $(git ls-files 'd0*' | head -n 500); do echo "two" >>"$f"; done
git commit -qam two && git checkout -q "$base"
gpusync_project "$burst" "$bench/remote/burst-g" "$wan_port"
"$gpusync" push >/dev/null && "$gpusync" watch -d >/dev/null && "$gpusync" flush >/dev/null
t0=$EPOCHREALTIME
git checkout -q two && "$gpusync" flush >/dev/null
tg=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.2f", b - a}')
"$gpusync" watch --stop >/dev/null
git checkout -q "$base"
rsync -a -e "$ssh" --exclude=.gpusync ./ "root@127.0.0.1:$bench/remote/burst-r/"
git checkout -q two
tr=$(time_cmd rsync -a -e "$ssh" --exclude=.gpusync ./ "root@127.0.0.1:$bench/remote/burst-r/")
diff -r --exclude=.gpusync --exclude=.git . "$bench/remote/burst-g" >/dev/null && same=identical || same=DIFFERENT
echo
echo "burst: git checkout rewriting 500 of 2,000 files (server copy after gpusync: $same)"
printf '%-34s %8s\n' tool seconds
printf '%-34s %8s\n' "gpusync watch (checkout to flush)" "$tg" "rsync -a of the tree" "$tr"

# 3. Idle daemon on a 100,000-file tree.
idle=$bench/idle
mkdir -p "$idle"
for i in $(seq 0 499); do mkdir -p "$idle/d$i" && (cd "$idle/d$i" && touch $(seq -f 'f%g.py' 0 199)); done
gpusync_project "$idle" "$bench/remote/idle" "$wan_port"
cd "$idle" && "$gpusync" push >/dev/null && "$gpusync" watch -d >/dev/null && "$gpusync" flush >/dev/null
pid=$(cat .gpusync/daemon.lock)
read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
sleep "${IDLE_SECONDS:-60}"
read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
"$gpusync" watch --stop >/dev/null
echo
echo "idle daemon, 100,000 files in 500 directories, ${IDLE_SECONDS:-60} s:"
awk -v t=$(( (u1 + s1) - (u0 + s0) )) -v hz="$(getconf CLK_TCK)" -v s="${IDLE_SECONDS:-60}" -v r="$rss" \
    'BEGIN {printf "  CPU %.3f s per minute, RSS %.1f MB\n", t / hz * 60 / s, r / 1024}'
