#!/usr/bin/env bash
# GPU check of the template on a CUDA machine, in one go: sized for about 5 minutes on one H200,
# at most 8. Every step has its own time limit and a failed step does not stop the others.
# Prints, all to stdout:
#   1. the GPU (nvidia-smi) and the torch build;
#   2. benchmarks/throughput.py on cuda: fp32 / bf16 / channels_last / compile samples/s;
#   3. configs/demo.json trained for 3 epochs once per speed knob (fp32, amp bf16, amp fp16,
#      channels_last, compile, tf32 + cudnn_benchmark), one table of samples/s and val/accuracy
#      read from the checkpoints;
#   4. one torchrun run (1 process) with the NCCL backend;
#   5. the GPU-marked tests: python -m pytest -q -m gpu.
# Exit status: 0 when every step passed, else 1 (the failed steps are listed at the end).
#
#   bash benchmarks/gpu_check.sh          # on the GPU machine
#   bash benchmarks/gpu_check.sh --cpu    # the same commands on the CPU (cpu, gloo), shrunk:
#                                         # checks the plumbing on a machine without a GPU
# PYTHON=/path/to/python picks the interpreter (default: the first of .venv/bin/python, python
# and python3 that imports torch).
set -euo pipefail
exec 2>&1  # one stream: stdout
cd "$(dirname "$0")/.."

mode=${1:-gpu}
if [[ $mode != gpu && $mode != --cpu ]]; then
    echo "usage: bash benchmarks/gpu_check.sh [--cpu]"
    exit 2
fi
if [[ $mode == gpu ]]; then
    device=cuda n_gpu=1 backend=nccl epochs=3
    throughput_args=()
    # A bigger batch than the demo's 64 and worker processes, so the input pipeline keeps up.
    train_args=(--bs 256 --set data_loader.args.num_workers=8
        --set data_loader.args.persistent_workers=true)
else
    device=cpu n_gpu=0 backend=gloo epochs=2
    throughput_args=(--steps 1 --rounds 1 --warmup 1 --batch-size 16)
    train_args=(--bs 32 --set trainer.len_epoch=4 --set data_loader.args.num_train=512
        --set data_loader.args.num_test=64)
fi
if [[ -z ${PYTHON:-} ]]; then
    # The first interpreter that already has torch; else one to install the requirements into.
    for candidate in .venv/bin/python python python3; do
        if command -v "$candidate" >/dev/null &&
            timeout 120 "$candidate" -c "import torch" 2>/dev/null; then
            PYTHON=$candidate
            break
        fi
    done
    PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
fi
work_dir=$(mktemp -d)
trap 'rm -rf "$work_dir"' EXIT
save_dir=$work_dir/saved
failed=()

# run_step NAME SECONDS COMMAND...: run COMMAND under a time limit; record a failure, go on.
run_step() {
    local name=$1 limit=$2 start status=0
    shift 2
    echo
    echo "=== $name (limit ${limit}s)"
    start=$SECONDS
    timeout -k 10 "$limit" "$@" || status=$?
    if ((status == 124 || status == 137)); then
        echo "--- $name: TIMED OUT after ${limit}s"
        failed+=("$name (timeout)")
    elif ((status != 0)); then
        echo "--- $name: FAILED (exit $status) after $((SECONDS - start))s"
        failed+=("$name (exit $status)")
    else
        echo "--- $name: ok in $((SECONDS - start))s"
    fi
}

echo "=== machine"
if [[ $mode == gpu ]]; then
    timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader ||
        echo "nvidia-smi failed"
fi
# Install only what is missing: a machine with torch already installed keeps its build.
if ! timeout 120 "$PYTHON" -c "import numpy, torch, torchvision, tqdm" 2>/dev/null; then
    echo "torch or another requirement is missing: installing requirements.txt"
    timeout 600 "$PYTHON" -m pip install --quiet -r requirements.txt
fi
if ! timeout 60 "$PYTHON" -c "import pytest" 2>/dev/null; then
    timeout 120 "$PYTHON" -m pip install --quiet "pytest>=7.4" || echo "could not install pytest"
fi
timeout 120 "$PYTHON" -c "
import sys, torch
print(f'python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, '
      f'cuda available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}')
if torch.cuda.is_available():
    print('bf16 supported:', torch.cuda.is_bf16_supported())
"

run_step "throughput.py on $device" 240 \
    "$PYTHON" benchmarks/throughput.py --device "$device" "${throughput_args[@]}"

# One short training of the demo per speed knob, all else equal.
declare -A knobs=(
    [fp32]=""
    [amp_bf16]="--set trainer.amp=bf16"
    [amp_fp16]="--set trainer.amp=fp16"
    [channels_last]="--set trainer.channels_last=true"
    [compile]="--set trainer.compile=true"
    [tf32_cudnn_benchmark]="--set trainer.tf32=true --set trainer.cudnn_benchmark=true"
)
knob_order=(fp32 amp_bf16 amp_fp16 channels_last compile tf32_cudnn_benchmark)
for knob in "${knob_order[@]}"; do
    read -ra knob_args <<<"${knobs[$knob]}"
    run_step "train configs/demo.json: $knob" 180 \
        "$PYTHON" train.py -c configs/demo.json --epochs "$epochs" --run-id "$knob" \
        --set n_gpu=$n_gpu --set trainer.tensorboard=false --set trainer.verbosity=0 \
        --set "trainer.save_dir=$save_dir" "${train_args[@]}" "${knob_args[@]}"
done

echo
echo "=== demo knobs: the last epoch's metrics, from each run's last checkpoint"
timeout 120 "$PYTHON" - "$save_dir" "$epochs" "${knob_order[@]}" <<'EOF' || failed+=("knob table")
import json
import sys
from pathlib import Path

import torch

save_dir, epochs, knobs = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
name = json.loads(Path("configs/demo.json").read_text())["name"]
print(f"{'knob':<22} {'samples/s':>10} {'data wait':>9} {'train/loss':>10} {'val/accuracy':>12}")
for knob in knobs:
    path = save_dir / "models" / name / knob / f"checkpoint-epoch{epochs}.pth"
    if not path.is_file():
        print(f"{knob:<22} {'no checkpoint (failed)':>44}")
        continue
    metrics = torch.load(path, weights_only=True, map_location="cpu")["metrics"]
    print(
        f"{knob:<22} {metrics['time/train_samples_per_second']:>10.0f} "
        f"{metrics['time/data_wait_fraction']:>9.2f} {metrics['train/loss']:>10.4f} "
        f"{metrics['val/accuracy']:>12.4f}"
    )
print("(data wait: the share of training time spent waiting for batches; near 1, the input "
      "pipeline and not the knob sets the speed)")
EOF

run_step "torchrun --nproc_per_node=1, backend $backend" 180 \
    "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=1 \
    train.py -c configs/demo.json --epochs 1 --run-id "torchrun_$backend" \
    --set n_gpu=$n_gpu --set "distributed.backend=$backend" --set trainer.tensorboard=false \
    --set trainer.verbosity=0 --set "trainer.save_dir=$save_dir" "${train_args[@]}"
timeout 60 "$PYTHON" - "$save_dir/models" "torchrun_$backend" <<'EOF' || failed+=("torchrun check")
import sys
from pathlib import Path

import torch

paths = list(Path(sys.argv[1]).glob(f"*/{sys.argv[2]}/checkpoint-epoch1.pth"))
if not paths:
    sys.exit("torchrun: no checkpoint was written")
state = torch.load(paths[0], weights_only=True, map_location="cpu")
backend = state["config"]["distributed"]["backend"]
print(f"torchrun with {backend} worked: epoch {state['epoch']} saved, "
      f"val/accuracy {state['metrics']['val/accuracy']:.4f}")
EOF

run_step "pytest -m gpu" 240 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider

echo
if ((${#failed[@]})); then
    echo "=== FAILED: ${failed[*]}"
    exit 1
fi
echo "=== all steps passed"
