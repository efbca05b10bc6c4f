#!/usr/bin/env bash
# gpu-check.sh: the trainer's GPU path in one command, for a machine with an NVIDIA GPU. It
# builds gpusync-train with CUDA, runs the `gpu` tests (every CUDA layer and model against the
# CPU path, 1-rank NCCL, two ranks sharing one GPU), trains each model briefly on CUDA in fp32,
# bf16 and fp16, runs two ranks sharing the one GPU through the TCP all-reduce, runs the PyTorch
# comparison of each model (scripts/bench/trainer.sh), regenerates
# trainer/tests/fixtures/torch_sampler.txt with PyTorch's DistributedSampler and checks the
# models against this PyTorch's own training steps (test_torch_steps), where torch is installed. Every step's output goes to OUT_DIR, with summary.txt listing each step, its status
# and its time; the whole run is held under ten minutes (each step gets what is left of the
# budget). A failed step's log tail and the benchmark tables are printed at the end.
#
#   scripts/gpu-check.sh OUT_DIR [--data DIR] [--deps DIR] [--budget SECONDS]
#   scripts/gpu-check.sh --pack DIR [--data DIR]
#
# A GPU server that cannot install packages (no apt, no network) still runs it: on a Debian or
# Ubuntu machine that has the dataset, `--pack DIR` copies Fashion-MNIST into DIR/data and
# unpacks the Debian packages the build needs beyond CUDA (cmocka for the tests, zlib) into
# DIR/prefix; copy DIR to the server and pass `--deps DIR` there.
#
# Without a visible GPU (no nvidia-smi, or it lists no device) it writes "skipped" to
# OUT_DIR/summary.txt and exits 0. Exit status: 0 when every required step passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

usage() { sed -n '2,22p' "$0"; }
data=/usr/share/datasets/fashion-mnist
data_set=0
deps=
pack=
out=
budget=570 # ten minutes less a margin for the summary
while [[ $# -gt 0 ]]; do
    case "$1" in
    --data) data=$2; data_set=1; shift 2 ;;
    --deps) deps=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --pack) pack=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu-check.sh: unknown argument $1" >&2; exit 2 ;;
    *) [[ -z $out ]] || { usage >&2; exit 2; }; out=$1; shift ;;
    esac
done

# pack_deps DIR: the dataset and the unpacked packages, for --deps on another machine.
pack_deps() {
    local dir=$1 debs=(libcmocka0 libcmocka-dev zlib1g zlib1g-dev)
    mkdir -p "$dir/data" "$dir/prefix" || return 1
    cp "$data"/*-ubyte* "$dir/data/" || return 1
    (cd "$dir" && apt-get download "${debs[@]}") || return 1
    for deb in "$dir"/*.deb; do dpkg -x "$deb" "$dir/prefix" || return 1; done
    rm -f "$dir"/*.deb
    # Absolute links (libz.so -> /lib/...) would point into the other machine's system: make
    # them relative links inside the prefix.
    local link target
    while read -r link; do
        target=$(readlink "$link")
        [[ $target == /* ]] || continue
        ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$dir/prefix$target")" "$link"
    done < <(find "$dir/prefix" -type l)
    echo "gpu-check: packed $(du -sh "$dir" | cut -f1) into $dir: run" \
        "'scripts/gpu-check.sh OUT_DIR --deps $dir' on the GPU machine"
}
if [[ -n $pack ]]; then
    pack_deps "$pack"
    exit $?
fi
[[ -n $out ]] || { usage >&2; exit 2; }
if [[ -n $deps ]]; then
    # CMake searches CMAKE_PREFIX_PATH first, so the unpacked cmocka and zlib are found there.
    export CMAKE_PREFIX_PATH="$deps/prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    [[ $data_set == 1 ]] || data=$deps/data
fi
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
summary=$out/summary.txt
: >"$summary"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "gpu-check: skipped: no NVIDIA GPU visible (nvidia-smi missing or lists none)" |
        tee "$summary"
    exit 0
fi

start=$SECONDS
failed=0
build=$out/build

left() { echo $((budget - (SECONDS - start))); }

# step NAME REQUIRED LOGFILE CMD...: runs CMD (a program: shell functions go through
# `bash -c` after export -f, since timeout execs its command) under the remaining budget, logs its output and
# appends "NAME  status  seconds" to the summary. REQUIRED=0 marks a step whose failure is
# expected or informational (it is reported but does not fail the check).
step() {
    local name=$1 required=$2 logname=$3 log=$out/$3
    shift 3
    local t0=$SECONDS limit
    limit=$(left)
    if ((limit < 10)); then
        printf '%-34s %-8s %5ss\n' "$name" "no-time" 0 | tee -a "$summary"
        ((required)) && failed=1
        return 1
    fi
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    local rc=$? status=ok
    if ((rc == 124 || rc == 137)); then
        status=timeout
    elif ((rc == 77)); then
        status=skipped
    elif ((rc != 0)); then
        status=FAILED
    fi
    [[ $status != ok && $required == 0 ]] && status="$status(info)"
    printf '%-34s %-14s %5ss  %s\n' "$name" "$status" $((SECONDS - t0)) "$logname" | tee -a "$summary"
    [[ $status == FAILED || $status == timeout ]] && ((required)) && failed=1
    return $rc
}

nvidia-smi >"$out/nvidia-smi.txt" 2>&1
echo "gpu-check: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)" |
    tee -a "$summary"

step "configure (CUDA + NCCL)" 1 configure.log \
    cmake -S trainer -B "$build" -DCMAKE_BUILD_TYPE=Release -DGT_DATA_DIR="$data"
if ! grep -q 'GPU path ON' "$out/configure.log"; then
    echo "gpu-check: the CUDA path is OFF in this configure (see configure.log)" |
        tee -a "$summary"
    exit 1
fi
step "build" 1 build.log cmake --build "$build" -j"$(nproc)" || exit 1
bin=$build/gpusync-train

# Every CUDA test: each layer and model against the CPU path within tolerance in fp32, bf16 and
# fp16, 1-rank NCCL convergence, two ranks sharing the GPU (test_gpu, test_gpu_layers).
step "ctest -L gpu" 1 gpu-tests.log ctest --test-dir "$build" -L gpu --output-on-failure
# A gpu test exits 77 (skipped) when it finds no device or no dataset: here that is a failure.
if grep -q 'Skipped' "$out/gpu-tests.log"; then
    echo "gpu-check: gpu tests skipped on a GPU machine: $(grep -c '\*\*\*Skipped' "$out/gpu-tests.log")" \
        "(see gpu-tests.log)" | tee -a "$summary"
    failed=1
fi

# The CPU tests of the new layers, on this machine too (cheap, and the CUDA build links them).
step "ctest -L unit" 1 unit-tests.log ctest --test-dir "$build" -L unit --output-on-failure

# Short CUDA training runs of each model in each precision (fp16 with its loss scaler).
for model in mlp lenet resnet; do
    for prec in fp32 bf16 fp16; do
        step "train $model $prec (10240)" 1 "train-$model-$prec.log" \
            "$bin" --model "$model" --device cuda --precision "$prec" --data "$data" --epochs 1 \
            --limit-train 10240 --metrics "$out/train-$model-$prec.jsonl"
    done
done

# Two ranks on the one GPU (LOCAL_RANK 0 for both): NCCL refuses two ranks on one device, so
# they must agree on the TCP all-reduce, which rank 0's banner names.
two_ranks() {
    local model=$1 port=$((20000 + RANDOM % 20000)) pids=() rc=0
    shift
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            "$bin" --device cuda --model "$model" "$@" --data "$data" --epochs 1 \
            --limit-train 10240 --rdzv-timeout 60 --timeout 60 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}
two_ranks_checked() {
    set -o pipefail # not inherited through bash -c
    local log=$out/two-ranks-$1.out
    two_ranks "$@" | tee "$log" && grep -q 'device cuda,.*, TCP all-reduce' "$log"
}
export -f two_ranks two_ranks_checked
export bin data out
step "2 ranks on 1 GPU, lenet (TCP)" 1 two-ranks-lenet.log bash -c 'two_ranks_checked lenet'
step "2 ranks on 1 GPU, resnet --sync-bn" 1 two-ranks-resnet.log \
    bash -c 'two_ranks_checked resnet --sync-bn'

# gpusync-train against PyTorch on this GPU, model by model: (a) DataLoader loop, (b) data resident.
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1; then
    for model in mlp lenet resnet; do
        step "bench vs PyTorch ($model)" 1 "bench-$model.log" \
            scripts/bench/trainer.sh --build "$build" --data "$data" --epochs 3 --models "$model"
    done
    regen() {
        python3 trainer/tests/fixtures/make_sampler_fixture.py >"$out/torch_sampler.txt" &&
            cp "$out/torch_sampler.txt" trainer/tests/fixtures/torch_sampler.txt
    }
    export -f regen
    step "regenerate torch_sampler.txt" 1 sampler-fixture.log bash -c regen
    step "ctest test_sampler_fixture" 1 sampler-test.log \
        ctest --test-dir "$build" -R '^trainer.test_sampler_fixture$' --output-on-failure
    # The models against this PyTorch's own steps (the committed fixture came from torch 1.13).
    step "torch_steps with this torch" 1 torch-steps.log bash -c \
        "python3 trainer/tests/fixtures/make_torch_steps.py >'$out/torch_steps.txt' &&
         '$build/tests/test_torch_steps' '$out/torch_steps.txt'"
else
    echo "gpu-check: PyTorch with CUDA not importable: bench and sampler fixture skipped" |
        tee -a "$summary"
fi

# Last, with what is left of the budget: the ResNet's accuracy row (its 30 default epochs are
# about two hours on a 2-core CPU). Informational: a run cut short by the budget is no failure.
# Only once the ResNet trained on this GPU: --device auto would otherwise spend it on the CPU.
if grep -q '^train resnet fp32 (10240) *ok ' "$summary"; then
    step "accuracy resnet (defaults)" 0 accuracy-resnet.log \
        scripts/bench/trainer.sh --accuracy --models resnet --build "$build" --data "$data"
fi

# Where a step failed, the end of its log; then the benchmark tables.
awk '$0 ~ / (FAILED|timeout) / {print $NF}' "$summary" | while read -r log; do
    echo "== tail of $log"
    tail -n 25 "$out/$log"
done
for log in bench-mlp bench-lenet bench-resnet accuracy-resnet; do
    [[ -s $out/$log.log ]] && grep -v '^-- ' "$out/$log.log"
done
echo "gpu-check: total $((SECONDS - start)) s; results in $out" | tee -a "$summary"
exit $failed
