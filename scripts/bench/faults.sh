#!/usr/bin/env bash
# faults.sh: the long run of the randomised fault test (tests/e2e/test_faults.c, issue 11):
# hundreds of seeded sequences of file operations under `gpusync watch`, with a concurrent push
# SIGKILLed, the daemon SIGKILLed, sshd killed, the link stalled or cut, a file deleted on the
# server behind gpusync's back (its record of the last check garbled) at random moments; each
# sequence ends with a flush and an exact comparison of both trees. Prints one line per sequence
# (seed, operations, faults injected by kind, result) and a summary table: sequences, faults per
# kind, mismatches and their seeds, temporaries left, unexplained conflict copies. Exits non-zero
# if any sequence failed.
#
#   scripts/bench/faults.sh              SEQUENCES=200 OPS=60 by default
#   SEQUENCES=500 OPS=100 scripts/bench/faults.sh
#   SEED=1234 scripts/bench/faults.sh    sequences run seeds 1234, 1235, ...
#   KINDS=stall,cut scripts/bench/faults.sh   only these faults (push-kill daemon-kill
#                                             daemon-stop sshd-kill stall cut server-delete)
#   KEEP=failed scripts/bench/faults.sh  keep the folders of failed sequences (daemon.log inside)
#
# Replay one failing sequence with the line the run prints under it, e.g.
#   GS_TEST_SEED=1234 GS_FAULT_SEQUENCES=1 GS_FAULT_OPS=60 scripts/bench/faults.sh
# GS_BUILD names the build folder (default build/); it is configured and built when needed.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${GS_BUILD:-$repo/build}

if [[ ! -f $build/build.ninja ]]; then
    command -v cmake >/dev/null || "$repo/scripts/setup.sh" >/dev/null
    cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -t gpusync gpusync-agent wansim test_faults >/dev/null

export GS_BUILD_DIR=$build GS_SOURCE_DIR=$repo
export GS_FAULT_SEQUENCES=${GS_FAULT_SEQUENCES:-${SEQUENCES:-200}}
export GS_FAULT_OPS=${GS_FAULT_OPS:-${OPS:-60}}
[[ -n ${SEED:-} ]] && export GS_TEST_SEED=$SEED
[[ -n ${KINDS:-} ]] && export GS_FAULT_KINDS=$KINDS
[[ -n ${KEEP:-} ]] && export GS_TEST_KEEP=$KEEP
# the projects live on tmpfs, as the other benchmarks' do (disk timings are noisy here)
export TMPDIR=${TMPDIR:-/dev/shm}
exec "$build/tests/e2e/test_faults"
