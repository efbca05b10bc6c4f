#!/bin/sh
# Builds the agent's libFuzzer target (fuzz_serve.c) with clang and runs it for a bounded time,
# then checks that nothing was created outside the fuzzer's temporary root.
# usage: run_fuzz.sh REPO_ROOT OUT_DIR [SECONDS] (the agent in REPO_ROOT/agent, its protocol in
# REPO_ROOT/proto); exit 77 (skip) without clang/libFuzzer.
set -u
repo=$1
src=$repo/agent
out=$2
secs=${3:-20}
cc=$(command -v clang || command -v clang-14 || true)
if [ -z "$cc" ]; then
    echo "clang not found: skipping the fuzz test"
    exit 77
fi
mkdir -p "$out"
probe="$out/probe.c"
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$probe"
if ! "$cc" -fsanitize=fuzzer,address -o "$out/probe" "$probe" 2>/dev/null; then
    echo "clang cannot link libFuzzer (libclang-rt-14-dev missing?): skipping"
    exit 77
fi
flags="-std=c99 -g -O1 -Wall -Wextra -Werror -I$repo -I$src"
srcs="$src/serve.c $src/resident.c $src/serve_put.c $src/serve_delta.c $src/serve_ops.c $src/serve_query.c $src/writers.c $src/serve_check.c $src/dirwatch.c $src/fs.c $repo/proto/sync.c $repo/proto/zframes.c $src/sync_id.c $src/fence.c $src/wrapper.c"
# with libzstd the compressed frames (ZFRAMES) are fuzzed too
if [ -f /usr/include/zstd.h ]; then
    flags="$flags -DGS_ZSTD"
    srcs="$srcs -lzstd"
fi
# with librsync PUT_DELTA frames are applied too (the HELLO offers deltas)
if [ -f /usr/include/librsync.h ]; then
    flags="$flags -DGS_RSYNC"
    srcs="$srcs -lrsync"
fi
# shellcheck disable=SC2086
"$cc" $flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -o "$out/fuzz_serve" "$src/fuzz/fuzz_serve.c" $srcs || exit 1
# shellcheck disable=SC2086
"$cc" $flags -DGA_FUZZ_SEEDS -o "$out/fuzz_seeds" "$src/fuzz/fuzz_serve.c" $srcs || exit 1

work=$(mktemp -d "${TMPDIR:-/tmp}/gs-agent-fuzz-XXXXXX")
corpus="$out/corpus"
mkdir -p "$corpus"
"$out/fuzz_seeds" "$corpus" || exit 1
# The test run is reproducible: a fixed seed and a fixed number of inputs (bounded by time too),
# so a CI failure can be replayed exactly. GS_FUZZ_SEED=0 and GS_FUZZ_RUNS=-1 explore freely.
# -print_pcs=1 starts libFuzzer's symbolizer helper (pipes that stay open) at the first new PC,
# on every run: the target's descriptor-leak check must hold with it, not only when it is idle.
GS_FUZZ_DIR="$work" "$out/fuzz_serve" -seed="${GS_FUZZ_SEED:-1}" -runs="${GS_FUZZ_RUNS:-20000}" \
    -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_pcs=1 \
    -artifact_prefix="$out/" -print_final_stats=1 "$corpus" 2>"$out/fuzz.log"
rc=$?
tail -n 15 "$out/fuzz.log"
if [ "$rc" -ne 0 ]; then
    echo "fuzzer failed (exit $rc); see $out/fuzz.log and the crash-* artifact in $out"
    exit 1
fi
# Nothing but root/ and outside/ (holding only the victim file) may exist in the work dir.
left=$(cd "$work" && ls -A | tr '\n' ' ')
inside=$(ls -A "$work/outside" | tr '\n' ' ')
rm -rf "$work"
if [ "$left" != "outside root " ] || [ "$inside" != "victim " ]; then
    echo "files appeared outside the fuzz root: work dir has '$left', outside/ has '$inside'"
    exit 1
fi
echo "fuzz: no crash in ${secs}s, nothing written outside the root"
