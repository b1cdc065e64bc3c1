"""gpu_check.sh's training steps: each runs train.py and ends with one `figure: ...` line, exit 0
only when the figure meets its threshold.

  compile [--tf32]  trainer.compile on the demo (a short last batch in training and validation):
                    torch's recompilations counted by epoch from its own log records (the
                    `recompiles` artifact), in this process; none may come after epoch 1. With
                    --tf32 also trainer.tf32, after which torch's older TF32 flags must still read.
  knobs             the demo trained once per speed knob (AMP, channels_last, the fused Adam):
                    each one's val/accuracy within --tolerance of fp32's.
  fsdp              configs/imagenet_vit.json shrunk (a ViT-B/16 on 32x32 images), FSDP under
                    torchrun with one process, with SGD (and a resume) and with AdamW. A run
                    still going when the step's limit ends it (SIGTERM) or after 240 s has the
                    Python stacks of its processes dumped into its log: where it hung.

python benchmarks/gpu/gpu_training.py STEP --work DIR [--set KEY.PATH=VALUE ...] [options]
"""

import argparse
import contextlib
import json
import logging
import math
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as `python benchmarks/gpu/gpu_training.py`

# One line per epoch from the training loop, "epoch 2/3  train/loss ...": progress lines
# ("epoch 2/3  batch 10/56 ...") and tqdm's bar are not it.
EPOCH_SUMMARY = re.compile(r"^epoch (\d+)/\d+  train/")
KNOBS = {
    "fp32": [],  # Adam's fused kernel: the default on CUDA
    "fp32-foreach": ["optimizer.args.fused=false"],
    "bf16": ["trainer.amp=bf16"],
    "fp16-fused": ["trainer.amp=fp16"],  # GradScaler, its inf check passed to the fused step
    "channels-last": ["trainer.channels_last=true"],
    "bf16-channels-last": ["trainer.amp=bf16", "trainer.channels_last=true"],
}


class RecompilesByEpoch(logging.Handler):
    """Counts torch's "Recompiling function" records by the epoch they came in: epoch N is
    the one after the loop's summary record of epoch N - 1."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs_done = 0
        self.counts: dict[int, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.name.endswith("__recompiles") and message.startswith("Recompiling"):
            epoch = self.epochs_done + 1
            self.counts[epoch] = self.counts.get(epoch, 0) + 1
        elif not record.name.startswith("torch") and (found := EPOCH_SUMMARY.match(message)):
            self.epochs_done = int(found.group(1))

    def after_first_epoch(self) -> int:
        return sum(count for epoch, count in self.counts.items() if epoch > 1)


def train(args: argparse.Namespace, run_id: str, *sets: str) -> Path:
    """train.py's main() in this process on configs/demo.json; the run folder, or exit 1."""
    import train as train_script

    # The split held and augmented on the device: the GPU's speed, not the CPU's, is measured.
    common = [f"n_gpu={args.n_gpu}", f"trainer.save_dir={args.work / 'saved'}"]
    common += ["trainer.tensorboard=false", "data_loader.args.pipeline=device", *sets, *args.set]
    config = str(ROOT / "configs/demo.json")
    argv = ["-c", config, "--run-id", run_id, "--epochs", str(args.epochs)]
    code = train_script.main(argv + [item for pair in common for item in ("--set", pair)])
    if code != 0:
        print(f"figure: {run_id}: train.py exited with {code}", flush=True)
        sys.exit(1)
    return args.work / "saved" / "models" / "Demo_CifarCNN" / run_id


def tf32_flags() -> tuple[str, bool]:
    """torch's older TF32 settings as Inductor and user code read them, and whether they say
    TF32 is on (False when reading one raises)."""
    import torch

    try:
        matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        precision = torch.get_float32_matmul_precision()
    except RuntimeError as error:
        return f"TF32 flags unreadable ({str(error).splitlines()[0][:120]})", False
    text = f"matmul.allow_tf32 {matmul}, cudnn.allow_tf32 {cudnn}, matmul precision {precision!r}"
    return text, matmul and cudnn and precision != "highest"


def compile_check(args: argparse.Namespace) -> int:
    import torch

    counter = RecompilesByEpoch()
    torch._logging.set_logs(recompiles=True)
    logging.getLogger("torch._dynamo").addHandler(counter)
    logging.getLogger("train").addHandler(counter)  # the training loop's logger (train.py)
    # Batches of 128 leave a short last batch in training (7,200 samples) and in validation
    # (800): training drops it when compiling, validation compiles a graph for it in epoch 1.
    sets = ["trainer.compile=true", "data_loader.args.batch_size=128", "trainer.verbosity=1"]
    run_id = "compile-tf32" if args.tf32 else "compile"
    train(args, run_id, *sets, *(["trainer.tf32=true"] if args.tf32 else []))
    by_epoch = ", ".join(f"{e}: {counter.counts.get(e, 0)}" for e in range(1, args.epochs + 1))
    figure = f"recompilations by epoch {by_epoch}; epochs finished {counter.epochs_done}"
    # Validation (gradients off) recompiles in epoch 1: none counted there means the records
    # did not reach the counter, and "none after epoch 1" would prove nothing.
    seen = counter.counts.get(1, 0) > 0
    ok = seen and counter.after_first_epoch() == 0 and counter.epochs_done == args.epochs
    if args.tf32:
        flags, tf32_on = tf32_flags()
        figure += f"; {flags}"
        ok = ok and tf32_on
    print(f"figure: {figure}", flush=True)
    return 0 if ok else 1


def knobs_check(args: argparse.Namespace) -> int:
    import torch

    results: dict[str, dict[str, float]] = {}
    for knob, sets in KNOBS.items():
        run_dir = train(args, knob, "trainer.verbosity=0", *sets)
        path = run_dir / f"checkpoint-epoch{args.epochs}.pth"
        results[knob] = torch.load(path, weights_only=True, map_location="cpu")["metrics"]
    baseline = results["fp32"]["val/accuracy"]
    print(f"{'knob':<20} {'samples/s':>10} {'val/accuracy':>12} {'vs fp32':>8}")
    for knob, metrics in results.items():
        accuracy, rate = metrics["val/accuracy"], metrics["time/train_samples_per_second"]
        print(f"{knob:<20} {rate:>10.0f} {accuracy:>12.4f} {accuracy - baseline:>+8.4f}")
    worst = max(results, key=lambda knob: abs(results[knob]["val/accuracy"] - baseline))
    gap = abs(results[worst]["val/accuracy"] - baseline)
    print(f"figure: fp32 val/accuracy {baseline:.4f}; largest gap {gap:.4f} ({worst})", flush=True)
    return 0 if baseline >= args.min_accuracy and gap <= args.tolerance else 1


def vit_config(work: Path, optimizer: str, sets: list[str]) -> Path:
    """configs/imagenet_vit.json shrunk: a ViT-B/16 on synthetic 32x32 images, 4 steps an epoch,
    its bf16, activation checkpointing, clipping, mixing and augmentation as shipped."""
    config = json.loads((ROOT / "configs/imagenet_vit.json").read_text())
    config["arch"]["args"] = {
        "name": "vit_b_16",
        "num_classes": 10,
        "builder_args": {"image_size": 32},
    }
    augmentation = {
        key: config["data_loader"]["args"][key] for key in ("auto_augment", "random_erasing")
    }
    config["data_loader"] = {
        "type": "SyntheticDataLoader",
        "args": {"num_train": 576, "num_test": 64, "batch_size": 32, "validation_split": 64,
                 "num_workers": 2, **augmentation},
    }  # fmt: skip
    if optimizer == "AdamW":
        config["optimizer"].update(type="AdamW", args={"lr": 1e-3, "weight_decay": 0.05})
    config["lr_scheduler"].update(warmup_epochs=0)
    config["trainer"].update(epochs=1, len_epoch=4, save_dir=str(work / "saved"), tensorboard=False)
    for item in sets:  # --set KEY.PATH=VALUE, as train.py reads it
        dotted, value = item.split("=", 1)
        *parents, last = dotted.split(".")
        node = config
        for key in parents:
            node = node[key]
        try:
            node[last] = json.loads(value)
        except json.JSONDecodeError:
            node[last] = value
    path = work / f"vit_{optimizer.lower()}.json"
    path.write_text(json.dumps(config, indent=4))
    return path


class Stopped(Exception):
    """The step's limit ran out: gpu_check.sh's SIGTERM."""


def stop(signum: int, frame: object) -> None:
    raise Stopped(f"signal {signum}")


def children(parent: int) -> list[int]:
    """The processes whose parent is `parent` (torchrun's workers, in sessions of their own)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return sorted(found)


def no_core_files() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def torchrun(
    work: Path, name: str, *train_args: str, script: str = "train.py", timeout: float = 240
) -> bool:
    """`script` under torchrun, one process; its output in work/<name>.log (the tail if failed).
    A run still going after `timeout` s or when the step's limit ends it (SIGTERM, raised here as
    Stopped) gets SIGABRT in each worker, one at a time (their stacks would interleave), on which
    Python's faulthandler writes each thread's stack into that log; torchrun then ends, and
    Stopped goes on up: the step has a few seconds left."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
               script, *train_args]  # fmt: skip
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # the step's SIGTERM is for this process alone
        preexec_fn=no_core_files,  # SIGABRT dumps core: a CUDA process's takes gigabytes
    )  # fmt: skip
    stopped = None
    try:
        output, _ = process.communicate(timeout=timeout)
    except (subprocess.TimeoutExpired, Stopped) as error:
        stopped = error
        for pid in children(process.pid):
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                os.kill(pid, signal.SIGABRT)
            time.sleep(0.3)  # its stacks written before the next one's
        try:
            output, _ = process.communicate(timeout=3)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        output += f"\n{name}: still running ({stopped}): stacks above (SIGABRT)\n"
    (work / f"{name}.log").write_text(output)
    if stopped is not None or process.returncode != 0:
        print(f"{name}: exit {process.returncode}\n{output[-6000:]}", flush=True)
    if isinstance(stopped, Stopped):
        raise stopped
    return stopped is None and process.returncode == 0


def fsdp_check(args: argparse.Namespace) -> int:
    from utils.state.checkpoint import load_checkpoint

    signal.signal(signal.SIGTERM, stop)  # the step's limit: say where a run hangs
    results = []
    runs = args.work / "saved" / "models" / "ImageNet_ViT_L_16"
    for optimizer in ("SGD", "AdamW"):
        config = vit_config(args.work, optimizer, args.set)
        run_id = optimizer.lower()
        ran = torchrun(args.work, run_id, "-c", str(config), "--run-id", run_id)
        if ran and optimizer == "SGD":  # the resume loads the sharded optimizer state
            ran = torchrun(args.work, "sgd-resumed", "-r", str(runs / run_id), "--epochs", "2")
        last = sorted((runs / run_id).glob("checkpoint-epoch*.pth"))
        loss = load_checkpoint(last[-1])["metrics"]["train/loss"] if ran and last else math.nan
        ok = ran and math.isfinite(loss)
        epochs = "2 epochs, resumed after 1" if optimizer == "SGD" else "1 epoch"
        results.append((ok, f"{optimizer} {'ok' if ok else 'FAILED'} ({epochs}, loss {loss:.4g})"))
    print(f"figure: {'; '.join(text for _, text in results)}", flush=True)
    return 0 if all(ok for ok, _ in results) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["compile", "knobs", "fsdp"])
    parser.add_argument("--work", type=Path, required=True, help="run folders go here")
    parser.add_argument("--epochs", type=int, default=3, help="compile, knobs (default 3)")
    parser.add_argument("--n-gpu", type=int, default=1, help="compile, knobs (default 1)")
    parser.add_argument("--tf32", action="store_true", help="compile: with trainer.tf32 too")
    parser.add_argument("--tolerance", type=float, default=0.02, help="knobs (default 0.02)")
    parser.add_argument("--min-accuracy", type=float, default=0.95, help="knobs: fp32's floor")
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    return {"compile": compile_check, "knobs": knobs_check, "fsdp": fsdp_check}[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
