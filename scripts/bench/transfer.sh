#!/usr/bin/env bash
# transfer.sh: one 200 MB upload on loopback (tmpfs both ends): gpusync's SFTP path
# (`push` with transport = sftp) against OpenSSH's sftp and scp in the same run; gpusync's agent
# path for reference. Medians of RUNS (default 3) runs; each includes its SSH connection set-up.
#
#   scripts/bench/transfer.sh        (SIZE_MB=200 RUNS=3)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
size_mb=${SIZE_MB:-200}

[[ -x $gpusync ]] || "$repo/scripts/setup.sh" >/dev/null
bench_start_server
bench_trust "$ssh_port"
ssh=$(ssh_cmd "$ssh_port")
src=$bench/src
mkdir -p "$src"
head -c "$((size_mb * 1000000))" /dev/urandom >"$src/blob.bin"

# Warm-up: installs the agent so that no timed run includes it.
gpusync_project "$src" "$bench/remote/warm" "$ssh_port"
(cd "$src" && "$gpusync" push >/dev/null)

run_gpusync() { # TRANSPORT N
    rm -f "$src/.gpusync/index.db"*
    gpusync_project "$src" "$bench/remote/$1-$2" "$ssh_port"
    echo "[sync]" >>"$src/.gpusync/config"
    echo "transport = $1" >>"$src/.gpusync/config"
    (cd "$src" && time_cmd "$gpusync" push)
    cmp -s "$src/blob.bin" "$bench/remote/$1-$2/blob.bin" || { echo "bench: $1 copy differs" >&2; exit 1; }
}
run_sftp() {
    mkdir -p "$bench/remote/sftp-$1"
    echo "put $src/blob.bin $bench/remote/sftp-$1/blob.bin" >"$bench/sftp.batch"
    time_cmd sftp -q -b "$bench/sftp.batch" -P "$ssh_port" -i "$HOME/.ssh/id_ed25519" \
        -o UserKnownHostsFile="$HOME/.ssh/known_hosts" -o BatchMode=yes root@127.0.0.1
}
run_scp() {
    mkdir -p "$bench/remote/scp-$1"
    time_cmd scp -q -P "$ssh_port" -i "$HOME/.ssh/id_ed25519" \
        -o UserKnownHostsFile="$HOME/.ssh/known_hosts" -o BatchMode=yes "$src/blob.bin" \
        "root@127.0.0.1:$bench/remote/scp-$1/blob.bin"
}

g=() a=() s=() c=()
for i in $(seq 1 "$runs"); do
    g+=("$(run_gpusync sftp "$i")")
    a+=("$(run_gpusync agent "$i")")
    s+=("$(run_sftp "$i")")
    c+=("$(run_scp "$i")")
    rm -rf "$bench/remote/"*"-$i"
done
ref=$(median "${s[@]}")
echo "$size_mb MB upload on loopback, tmpfs; $runs runs each; $(nproc) cores"
printf '%-22s %9s %9s %10s   %s\n' tool median_s MB/s vs_sftp runs
for pair in "gpusync (sftp):g" "gpusync (agent):a" "OpenSSH sftp:s" "OpenSSH scp:c"; do
    name=${pair%%:*}
    eval "times=(\"\${${pair##*:}[@]}\")"
    m=$(median "${times[@]}")
    printf '%-22s %9.2f %9.1f %10.2f   %s\n' "$name" "$m" \
        "$(awk -v s="$size_mb" -v t="$m" 'BEGIN {print s / t}')" \
        "$(awk -v a="$m" -v b="$ref" 'BEGIN {print a / b}')" "${times[*]}"
done
