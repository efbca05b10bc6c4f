#!/usr/bin/env bash
# test.sh: installs and builds (scripts/setup.sh), then runs every test with ctest and exits
# non-zero on any failure. Unit tests run in parallel, one per core. Tests that start servers run
# two at a time: they mostly wait (on links the WAN simulator slows or cuts, on timeouts, on the
# server's login shell), so one at a time kept this 2-core machine a fifth busy and CI took 27 of
# its 30 minutes; two at a time it took 16. Their timing checks allow for one other test
# beside them; a test that must run alone is marked SERIAL in tests/list.cmake. The `slurm`
# tests start a private Slurm (root; setup.sh installs it) and are skipped where it cannot start.
#
#   scripts/test.sh [--sanitize] [-L LABEL_REGEX] [-R NAME_REGEX]
#
# --sanitize builds the whole tree with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-sanitize/ and runs the same suite there: any report (a leak, an overflow, undefined
# behaviour) fails its test. CI runs both (.ci/run). The sanitized pass leaves out the tests
# labelled `slow` (the trainer's convergence runs: the code test_train already covers, trained for
# many epochs, about 100 s under the sanitizers), so that CI stays within its 30 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
setup_args=()
skip=unit
if [[ ${1:-} == --sanitize ]]; then
    shift
    build_dir=build-sanitize
    setup_args=(--build-dir "$build_dir" --sanitize)
    # every finding fails the process that made it; tests that measure memory see ASAN_OPTIONS
    # and skip that check (the sanitizer's own overhead is not ours)
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    skip='unit|slow'
fi

./scripts/setup.sh "${setup_args[@]}"

cd "$build_dir"
if [[ $# -gt 0 ]]; then
    ctest --output-on-failure --timeout 900 "$@"
else
    ctest --output-on-failure --timeout 900 -L unit -j "$(nproc)"
    ctest --output-on-failure --timeout 900 -LE "$skip" -j 2
fi
