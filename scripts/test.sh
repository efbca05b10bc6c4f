#!/usr/bin/env bash
# test.sh: installs and builds (scripts/setup.sh), then runs every test with ctest and exits
# non-zero on any failure. Unit tests run in parallel; tests that start servers or measure time
# run one at a time, so timing checks are not disturbed by the machine's other core.
#
#   scripts/test.sh [-L LABEL_REGEX] [-R NAME_REGEX]
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh

filter=()
[[ $# -gt 0 ]] && filter=("$@")

cd build
if [[ ${#filter[@]} -gt 0 ]]; then
    ctest --output-on-failure --timeout 900 "${filter[@]}"
else
    ctest --output-on-failure --timeout 900 -L unit -j "$(nproc)"
    ctest --output-on-failure --timeout 900 -LE unit
fi
