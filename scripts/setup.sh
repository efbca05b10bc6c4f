#!/usr/bin/env bash
# setup.sh: installs what gpusync's build and tests need (Debian 12 packages), then configures and
# builds everything into build/. Safe to run again: packages already present are not reinstalled
# and the build is incremental. CUDA is optional: with /usr/local/cuda/bin/nvcc the trainer's GPU
# path is built too. Slurm's daemons and munge are installed for the `slurm` tests, which start a
# private single-host cluster (tests/fixtures/slurm-cluster.sh; needs root).
#
#   scripts/setup.sh [--no-build] [--build-dir DIR] [--sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
do_build=1
sanitize=OFF
while [[ $# -gt 0 ]]; do
    case $1 in
    --no-build) do_build=0; shift ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --sanitize) sanitize=ON; shift ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

packages=(
    build-essential cmake ninja-build pkg-config git
    libssh2-1-dev libssl-dev libgit2-dev libsqlite3-dev libinih-dev libxxhash-dev zlib1g-dev
    libcmocka-dev libjansson-dev libzstd-dev librsync-dev libb2-dev
    openssh-server openssh-client rsync procps psmisc iproute2 python3
    libopenblas-dev dataset-fashion-mnist
    clang libclang-rt-14-dev
    vim neovim emacs-nox tmux
    # the VS Code extension's real test (ide/vscode/test-real.sh): headless Chromium, and what
    # code-server's native modules and search need (libkrb5-dev for kerberos, Debian's rg)
    chromium ripgrep libkrb5-dev
    # the Slurm tests (tests/fixtures/slurm-cluster.sh): a real single-host cluster
    slurmctld slurmd slurm-client munge
)
# Editor-plugin tests need node and npm; a machine whose node came from elsewhere (with its own
# npm) keeps it: Debian's npm package would conflict with it.
command -v node >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "setup.sh: installing ${missing[*]}"
    sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get update -qq
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[[ $do_build == 1 ]] || exit 0

cmake_args=(-S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGS_SANITIZE=$sanitize)
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
    cmake_args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
cmake "${cmake_args[@]}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
echo "setup.sh: built into $build_dir/ (gpusync: $build_dir/cli/gpusync)"
