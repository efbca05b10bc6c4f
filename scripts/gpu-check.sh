#!/usr/bin/env bash
# gpu-check.sh: the trainer's GPU path in one command, for a machine with an NVIDIA GPU. It
# builds gpusync-train with CUDA, runs the `gpu` tests (every CUDA layer and model against the
# CPU path, 1-rank NCCL, two ranks sharing one GPU), trains each model briefly on CUDA in fp32,
# bf16 and fp16, runs two ranks sharing the one GPU through the TCP all-reduce, runs the PyTorch comparison
# (scripts/bench/trainer.sh) and regenerates trainer/tests/fixtures/torch_sampler.txt with
# PyTorch's DistributedSampler where torch is installed. Every step's output goes to OUT_DIR,
# with summary.txt listing each step, its status and its time; the whole run is held under ten
# minutes (each step gets what is left of the budget).
#
#   scripts/gpu-check.sh OUT_DIR [--data DIR] [--budget SECONDS]
#
# Without a visible GPU (no nvidia-smi, or it lists no device) it writes "skipped" to
# OUT_DIR/summary.txt and exits 0. Exit status: 0 when every required step passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

usage() { sed -n '2,14p' "$0"; }
[[ $# -ge 1 && $1 != -* ]] || { usage >&2; exit 2; }
out=$1
shift
data=/usr/share/datasets/fashion-mnist
budget=570 # ten minutes less a margin for the summary
while [[ $# -gt 0 ]]; do
    case "$1" in
    --data) data=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
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

# gpusync-train against PyTorch on this GPU: (a) DataLoader loop, (b) data resident.
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1; then
    step "bench vs PyTorch (mlp)" 1 bench.log \
        scripts/bench/trainer.sh --build "$build" --data "$data" --epochs 3
    regen() {
        python3 trainer/tests/fixtures/make_sampler_fixture.py >"$out/torch_sampler.txt" &&
            cp "$out/torch_sampler.txt" trainer/tests/fixtures/torch_sampler.txt
    }
    export -f regen
    step "regenerate torch_sampler.txt" 1 sampler-fixture.log bash -c regen
    step "ctest test_sampler_fixture" 1 sampler-test.log \
        ctest --test-dir "$build" -R '^trainer.test_sampler_fixture$' --output-on-failure
else
    echo "gpu-check: PyTorch with CUDA not importable: bench and sampler fixture skipped" |
        tee -a "$summary"
fi

echo "gpu-check: total $((SECONDS - start)) s; results in $out" | tee -a "$summary"
exit $failed
