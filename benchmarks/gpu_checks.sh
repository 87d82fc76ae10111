#!/usr/bin/env bash
# Every GPU check of hpcbench in one run, on a host with one NVIDIA GPU (docs/benchmarks.md):
#
#     bash benchmarks/gpu_checks.sh [OUTDIR] [PYTHON]
#
# 1. tracing's cost on ResNet-50 and LeNet-5 (recording_overhead.py, several arms against the
#    same "off" blocks: full tracing, phase events only, host marks only, CUDA events sampled);
# 2. the GPU tests (tests/gpu: CUDA-event phases, NCCL messages, NVML samples, the energy
#    counter's update interval and power x time, energy of a ResNet-50 and a GPT-2 point);
# 3. GPT-2 124M's tokens/s and MFU through hpcbench beside a plain loop (transformer_step.py),
#    eager and compiled.
# Each step's output goes to OUTDIR/<step>.log (default: gpu-checks/); a step that fails or
# runs past its time limit is reported and the next one runs. Exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-checks}
py=${2:-python3}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
failed=()

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date -u +%T), limit ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$out/$name.log"
    [ $rc -eq 0 ] || { echo "=== $name: exit $rc"; failed+=("$name"); }
}

nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader || true
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'

bench=(benchmarks/recording_overhead.py --device cuda --block 4)
step overhead-resnet50 120 "$py" "${bench[@]}" --model resnet50 --batch 32 --blocks 60 --arms all,all:8,phases,host
step overhead-lenet 90 "$py" "${bench[@]}" --model lenet --batch 64 --blocks 200 \
    --arms all,all:8,all:32,phases,phases:8,host
step gpu-tests 240 "$py" -m pytest -m gpu tests/gpu -s -q -p no:cacheprovider -o addopts= --durations=10
gpt=(benchmarks/transformer_step.py --device cuda --model gpt2_124m --precision bf16 --seq 1024 --batch 8)
step transformer-eager 90 "$py" "${gpt[@]}" --blocks 20 --block 5
step transformer-compiled 180 "$py" "${gpt[@]}" --blocks 10 --block 5 --compile default

if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
echo "all GPU checks passed"
