#!/usr/bin/env bash
# GPU check of the template on a CUDA machine, in one go: sized for about 9 minutes on one H200,
# at most 12. Every step has its own time limit and a failed step does not stop the others.
# Prints, all to stdout:
#   1. the GPU (nvidia-smi) and the torch build;
#   2. benchmarks/throughput.py on cuda: fp32 / bf16 / channels_last / compile samples/s;
#   3. configs/demo.json trained for 3 epochs once per speed knob (fp32, amp bf16, amp fp16
#      with the fused Adam, channels_last, compile, tf32 + cudnn_benchmark), one table of
#      samples/s and val/accuracy read from the checkpoints;
#   4. resume on the GPU: train, SIGTERM inside epoch 2, resume from the mid-epoch checkpoint,
#      finish;
#   5. torch.compile with a short last batch: no recompilation after epoch 1 (TORCH_LOGS);
#   6. one torchrun run (1 process) with the NCCL backend;
#   7. configs/finetune.json: a resnet18 state-dict file as the pretrained weights, frozen
#      layers, a new 10-class head, on a generated image folder;
#   8. the input pipelines: benchmarks/input_pipeline.py (loader alone: CIFAR-size data through
#      the DataLoader vs pipeline "device"; 224 px JPEGs decoded by PIL workers vs on the GPU),
#      then benchmarks/pipeline_training.py (config.json's model on a generated CIFAR-size
#      JPEG folder with each pipeline: samples/s, data-wait fraction, val/accuracy);
#   9. the GPU-marked tests: python -m pytest -q -m gpu (the no-sync tests, fp16 + fused; GPU
#      JPEG decoding that never overwrites memory queued kernels read, pytorch/vision#9606; the
#      averaged weights, the metric sums and every shipped metric without a host sync; cuda:N as
#      the current device);
#  10. the fast CIFAR-10 recipe (configs/cifar10_fast.json), its whole schedule on the device
#      pipeline, timed: benchmarks/cifar_recipe.py's per-epoch validation accuracy and seconds
#      (needs the real training images: ../shared/data/cifar10-train/train.tar.gz or
#      CIFAR_ARCHIVE=PATH; skipped, and said so, without them);
#  11. FSDP (distributed.strategy "fsdp") under torchrun with one process: bf16 parameters,
#      activation checkpointing, its sharded checkpoint read by test.py alone; and on a GPU
#      machine benchmarks/fsdp_memory.py (its 2 gloo processes on the CPU).
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
    # 8 DataLoader workers for the paths that have them; 20,000 + 2,000 CIFAR-size images.
    pipeline_args=(--num-workers 8 --jpeg-images 2000)
    pipeline_training_args=(--num-workers 8 --batch-size 256 --epochs 3 --seeds 0)
    per_class=(2000 200)
    # A bigger batch than the demo's 64 and worker processes, so the input pipeline keeps up.
    train_args=(--bs 256 --set data_loader.args.num_workers=8
        --set data_loader.args.persistent_workers=true)
else
    device=cpu n_gpu=0 backend=gloo epochs=2
    throughput_args=(--steps 1 --rounds 1 --warmup 1 --batch-size 16)
    pipeline_args=(--quick --jpeg-images 64)
    pipeline_training_args=(--quick --batch-size 32)
    per_class=(20 5)
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
if [[ $mode == gpu ]] &&
    ! timeout 120 "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "error: no CUDA device here (torch.cuda.is_available() is False): this check needs a"
    echo "GPU; bash benchmarks/gpu_check.sh --cpu runs the same commands on the CPU"
    exit 2
fi

run_step "throughput.py on $device" 240 \
    "$PYTHON" benchmarks/throughput.py --device "$device" "${throughput_args[@]}"

# One short training of the demo per speed knob, all else equal.
declare -A knobs=(
    [fp32]=""
    [amp_bf16]="--set trainer.amp=bf16"
    [amp_fp16]="--set trainer.amp=fp16" # Adam: fused on CUDA, so no sync per step
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

# 4. Resume on the device: SIGTERM inside epoch 2, then -r the run folder.
run_step "resume on $device after SIGTERM" 240 \
    "$PYTHON" - "$save_dir" "$n_gpu" "${train_args[@]}" <<'EOF'
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

save_dir, n_gpu, extra = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
run_dir = save_dir / "models" / "Demo_CifarCNN" / "resume"
command = [sys.executable, "train.py", "-c", "configs/demo.json", "--epochs", "3",
           "--run-id", "resume", "--set", f"n_gpu={n_gpu}", "--set", "trainer.tensorboard=false",
           "--set", f"trainer.save_dir={save_dir}", *extra, "--set", "trainer.len_epoch=200"]
process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
while not (run_dir / "checkpoint-epoch1.pth").exists():
    if process.poll() is not None:
        sys.exit("training ended before its first checkpoint:\n" + process.stdout.read()[-3000:])
    time.sleep(0.01)
time.sleep(0.3)
process.send_signal(signal.SIGTERM)
output = process.communicate(timeout=120)[0]
if process.returncode != 128 + signal.SIGTERM:
    sys.exit(f"expected exit code 143 after SIGTERM, got {process.returncode}:\n{output[-3000:]}")
print("saved on SIGTERM:", [path.name for path in sorted(run_dir.glob("checkpoint-epoch2-*"))])
resumed = subprocess.run([sys.executable, "train.py", "-r", str(run_dir)], capture_output=True,
                         text=True, timeout=180)
if resumed.returncode != 0 or "Resumed from" not in resumed.stdout:
    sys.exit(f"resume failed ({resumed.returncode}):\n{resumed.stdout[-2000:]}{resumed.stderr[-2000:]}")
final = torch.load(run_dir / "checkpoint-epoch3.pth", weights_only=True, map_location="cpu")
print(f"resumed and finished: epoch {final['epoch']}, global step {final['global_step']} "
      f"(expected {3 * 200}), val/accuracy {final['metrics']['val/accuracy']:.4f}")
sys.exit(0 if final["global_step"] == 3 * 200 else 1)
EOF

# 5. torch.compile: validation compiles its own graphs in epoch 1; nothing recompiles after.
run_step "compile on $device: no recompilation after epoch 1" 300 \
    "$PYTHON" - "$save_dir" "$n_gpu" "${train_args[@]}" <<'EOF'
import os
import subprocess
import sys
from pathlib import Path

save_dir, n_gpu, extra = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
# Batches of 100 leave a short last one (the training split is not a multiple of 100): it is
# dropped when compiling. One stream keeps the epoch lines and recompilations in order.
command = [sys.executable, "train.py", "-c", "configs/demo.json", "--epochs", "3",
           "--run-id", "compile_recompiles", "--set", f"n_gpu={n_gpu}",
           "--set", "trainer.tensorboard=false", "--set", f"trainer.save_dir={save_dir}", *extra,
           "--set", "trainer.compile=true", "--bs", "100"]
env = {**os.environ, "TORCH_LOGS": "recompiles", "PYTHONUNBUFFERED": "1"}
result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        timeout=280, env=env)
first, _, later = result.stdout.partition("epoch 1/3 ")
count = lambda text: sum("Recompiling" in line for line in text.splitlines())  # noqa: E731
print(f"exit {result.returncode}; recompilations in epoch 1: {count(first)}, after: {count(later)}")
if result.returncode != 0 or "epoch 3/3" not in later:
    print(result.stdout[-3000:])
sys.exit(0 if result.returncode == 0 and "epoch 3/3" in later and count(later) == 0 else 1)
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

# 7. Transfer learning: configs/finetune.json from a local weights file (the machine is offline).
run_step "configs/finetune.json on $device" 300 \
    "$PYTHON" - "$work_dir" "$n_gpu" "$mode" <<'EOF'
import json
import subprocess
import sys
from pathlib import Path

import torch
import torchvision
from PIL import Image

from data_loader.synthetic import CLASS_NAMES, SyntheticShapes

work_dir, n_gpu, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
per_class = {"train": 60, "val": 20} if mode == "gpu" else {"train": 12, "val": 4}
images = work_dir / "shapes"
for split, count in per_class.items():
    data = SyntheticShapes(count * 10 * 3, seed=[7, int(split == "val")])
    written = dict.fromkeys(CLASS_NAMES, 0)
    for index in range(len(data)):
        image, label = data[index]
        name = CLASS_NAMES[label]
        if written[name] < count:
            folder = images / split / name
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{index}.png")
            written[name] += 1
torch.manual_seed(0)
weights = work_dir / "resnet18.pth"
torch.save(torchvision.models.resnet18().state_dict(), weights)
sets = {
    "n_gpu": int(n_gpu), "arch.args.weights": str(weights),
    "data_loader.args.data_dir": str(images),
    "data_loader.args.image_size": 224 if mode == "gpu" else 32,
    "data_loader.args.batch_size": 32, "data_loader.args.num_workers": 4 if mode == "gpu" else 0,
    "trainer.epochs": 3 if mode == "gpu" else 1, "trainer.save_dir": str(work_dir / "saved"),
    "trainer.tensorboard": False,
}
args = [item for key, value in sets.items() for item in ("--set", f"{key}={json.dumps(value)}")]
result = subprocess.run([sys.executable, "train.py", "-c", "configs/finetune.json",
                         "--run-id", "finetune", *args], capture_output=True, text=True, timeout=280)
if result.returncode != 0:
    sys.exit(f"train.py failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
run_dir = work_dir / "saved" / "models" / "Finetune_ResNet18" / "finetune"
state = torch.load(sorted(run_dir.glob("checkpoint-epoch*.pth"))[-1], weights_only=True,
                   map_location="cpu")
pretrained = torch.load(weights, weights_only=True)
frozen = ("conv1.", "bn1.", "layer1.", "layer2.")
changed = [key for key in pretrained if key.startswith(frozen)
           and not torch.equal(pretrained[key], state["model"][f"network.{key}"])]
print(f"epoch {state['epoch']}: val/accuracy {state['metrics']['val/accuracy']:.4f} "
      f"(chance 0.10), head {tuple(state['model']['network.fc.weight'].shape)}, "
      f"frozen tensors changed: {len(changed)}")
sys.exit(0 if not changed and state["model"]["network.fc.weight"].shape[0] == 10 else 1)
EOF

# 8. Input pipelines: the loader alone, then training config.json's model with each pipeline.
run_step "input_pipeline.py on $device" 240 \
    "$PYTHON" benchmarks/input_pipeline.py --device "$device" "${pipeline_args[@]}"
run_step "CIFAR-size JPEG folder" 120 \
    "$PYTHON" - "$work_dir/cifar_size" "${per_class[@]}" <<'EOF'
import sys
from pathlib import Path

from PIL import Image

from data_loader.synthetic import CLASS_NAMES, generate

folder, counts = Path(sys.argv[1]), {"train": int(sys.argv[2]), "val": int(sys.argv[3])}
for split, count in counts.items():
    images, labels = generate(count * len(CLASS_NAMES), seed=[11, int(split == "val")])
    for index, (image, label) in enumerate(zip(images, labels)):
        class_folder = folder / split / CLASS_NAMES[label]
        class_folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(class_folder / f"{index}.jpg", quality=95)
print(f"{folder}: {sum(counts.values()) * len(CLASS_NAMES)} 32x32 JPEGs")
EOF
run_step "pipeline_training.py: config.json on $device, each pipeline" 300 \
    "$PYTHON" benchmarks/pipeline_training.py --config config.json --n-gpu "$n_gpu" \
    --data-dir "$work_dir/cifar_size" "${pipeline_training_args[@]}"

run_step "pytest -m gpu" 240 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider

# 10. The fast CIFAR-10 recipe: the time to its accuracy on this device.
archive=${CIFAR_ARCHIVE:-../shared/data/cifar10-train/train.tar.gz}
if [[ -f $archive ]]; then
    recipe_args=()
    # On the CPU: 2 batches, in fp32 (bf16 is emulated on CPUs without bf16 instructions).
    [[ $mode == gpu ]] || recipe_args=(--epochs 1 --set trainer.len_epoch=2 --set trainer.amp=null)
    run_step "configs/cifar10_fast.json on $device, pipeline device" 300 \
        "$PYTHON" benchmarks/cifar_recipe.py --archive "$archive" --data "$work_dir/cifar10" \
        --set "n_gpu=$n_gpu" "${recipe_args[@]}"
else
    echo
    echo "=== configs/cifar10_fast.json: skipped, no $archive (set CIFAR_ARCHIVE=PATH)"
fi

# 11. FSDP on one process (NCCL on the GPU): bf16 parameters, activation checkpointing, a
# sharded checkpoint that test.py reads alone, and the memory the run held at its peak.
amp=bf16
[[ $mode == gpu ]] || amp=null  # bf16 is emulated on CPUs without bf16 instructions
run_step "FSDP, torchrun --nproc_per_node=1, backend $backend" 240 \
    "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=1 \
    train.py -c configs/demo.json --epochs 2 --run-id fsdp \
    --set n_gpu=$n_gpu --set "distributed.backend=$backend" --set distributed.strategy=fsdp \
    --set "trainer.amp=$amp" --set trainer.activation_checkpointing=true \
    --set trainer.tensorboard=false --set "trainer.save_dir=$save_dir" "${train_args[@]}"
run_step "test.py on the FSDP checkpoint, one process" 120 \
    "$PYTHON" test.py -r "$save_dir/models/Demo_CifarCNN/fsdp" --split val
if [[ $mode == gpu ]]; then
    run_step "fsdp_memory.py: FSDP vs DDP bytes per rank (CPU, 2 processes)" 300 \
        "$PYTHON" benchmarks/fsdp_memory.py --model resnet50
fi

echo
if ((${#failed[@]})); then
    echo "=== FAILED: ${failed[*]}"
    exit 1
fi
echo "=== all steps passed"
