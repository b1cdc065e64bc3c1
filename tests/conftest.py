"""Shared fixtures: shrink the shipped configs and run the real entry points, as subprocesses
(run_script) or in this process (run_main)."""

import contextlib
import importlib.util
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from cifar_archive import archive_files, md5_attributes
from hypothesis import settings
from torchvision.datasets import CIFAR10

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT.parent / "shared" / "data" / "cifar10-sample"
# Named as seen from the repository: a fresh clone has no ../shared.
NO_SAMPLE = "no real-image sample in ../shared/data/cifar10-sample (beside the repository)"

# Make the project importable from the tests, as train.py sees it.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def _detach_log_handlers():
    """An in-process train.main() points the root logger at files and capsys's stream; undo
    that, so later tests do not log into a closed stream."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in root.handlers[:]:
        if type(handler) in (logging.StreamHandler, logging.FileHandler):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


# Global switches tests may flip (configure_torch, set_tf32): (object, attribute). The TF32
# flags are read and written through `allow_tf32`, as set_tf32 writes them: on torch >= 2.9,
# writing the newer fp32_precision settings back would make `allow_tf32` unreadable afterwards.
TORCH_FLAGS = [
    (torch.backends.cudnn, "benchmark"),
    (torch.backends.cuda.matmul, "allow_tf32"),
    (torch.backends.cudnn, "allow_tf32"),
]


@contextlib.contextmanager
def torch_state_kept() -> Iterator[None]:
    """Global torch settings as they were before: the RNG, the thread count, deterministic
    algorithms, the cuDNN and TF32 flags (an in-process train.main sets them)."""
    rng_state = torch.get_rng_state()
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    flags = [getattr(owner, name) for owner, name in TORCH_FLAGS]
    try:
        yield
    finally:
        torch.set_rng_state(rng_state)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        for (owner, name), value in zip(TORCH_FLAGS, flags, strict=True):
            setattr(owner, name, value)


# Property tests (hypothesis) search a bounded number of inputs in the fast run and more under
# -m slow: parametrize with NUM_EXAMPLES and apply settings(max_examples=num_examples) to the
# @given function inside the test. No deadline: these machines are noisy, and time is not what
# a property checks.
NUM_EXAMPLES = [
    pytest.param(25, id="25-examples"),
    pytest.param(400, id="400-examples", marks=pytest.mark.slow),
]
settings.register_profile("template", deadline=None, print_blob=True)
settings.load_profile("template")


# One thread per pytest process, as run_script gives each process it starts: `-n auto` runs a
# worker per core, and torch's default of a thread per core would oversubscribe them (measured:
# 5 times the CPU time of one thread for in-process runs on a loaded 2-core machine).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _reset_torch_state() -> Iterator[None]:
    """Tests that seed or change global torch settings do not leak into each other."""
    with torch_state_kept():
        yield


def shrink(config: dict, save_dir: Path) -> dict:
    """The shipped config made tiny: 2 epochs of a few batches on CPU, outputs under save_dir."""
    config = json.loads(json.dumps(config))
    config["n_gpu"] = 0
    config["trainer"].update(
        epochs=2, save_dir=str(save_dir), save_period=1, verbosity=1, log_step=2
    )
    args = config["data_loader"]["args"]
    args.update(batch_size=32, num_workers=0)
    if config["data_loader"]["type"] == "SyntheticDataLoader":
        args.update(num_train=320, num_test=96, validation_split=0.2)
    if config["arch"]["type"] == "CifarCNN":
        config["arch"]["args"].update(widths=[8, 16], convs_per_block=1)
    return config


def without_muon(config: dict) -> dict:
    """config.json's recipe as a torch without torch.optim.Muon (< 2.9, CI's floor job) can
    train it: the Muon group removed, with its max_lr, so optimizer.type takes its filters (what
    the refusal tells a user to do). Unchanged where torch has Muon."""
    groups = config["optimizer"].get("param_groups", [])
    if hasattr(torch.optim, "Muon") or not any(group.get("optimizer") for group in groups):
        return config
    kept = [index for index, group in enumerate(groups) if group.get("optimizer") != "Muon"]
    config["optimizer"]["param_groups"] = [groups[index] for index in kept]
    rates = config["lr_scheduler"]["args"]["max_lr"]  # the group of the rest first
    config["lr_scheduler"]["args"]["max_lr"] = [rates[0]] + [rates[index + 1] for index in kept]
    return config


def write_shrunk(shipped: str, path: Path, save_dir: Path, **overrides) -> Path:
    """A shrunk copy of a shipped config at `path`, its outputs under save_dir, with dotted-key
    overrides, e.g. **{"trainer.epochs": 3}."""
    config = shrink(json.loads((ROOT / shipped).read_text()), save_dir)
    for dotted, value in overrides.items():
        node = config
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    path.write_text(json.dumps(config, indent=4))
    return path


def set_flags(overrides: dict) -> list[str]:
    """{"a.b": value} as train.py arguments: ["--set", "a.b=<value as JSON>", ...]."""
    return [
        item for key, value in overrides.items() for item in ("--set", f"{key}={json.dumps(value)}")
    ]


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., Path]:
    """make_config("configs/demo.json", **{"trainer.epochs": 3}) -> path of a shrunk copy in tmp_path."""

    def make(name: str = "configs/demo.json", filename: str = "config.json", **overrides) -> Path:
        return write_shrunk(name, tmp_path / filename, tmp_path / "saved", **overrides)

    return make


def run_script(
    *args: str, cwd: Path = ROOT, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run `python <args>` like a user would, on the CPU, and capture its output; `env` adds
    to the environment."""
    # One thread per process: 2-core machines running several processes (torchrun, a pytest
    # parent) otherwise oversubscribe and slow down by up to 10x.
    env = {
        "OMP_NUM_THREADS": "1",
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def load_entry_point(name: str) -> types.ModuleType:
    """ROOT/<name>.py as a module, by path (the standard library has a `test` package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_entry_point", ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The entry scripts, for their main(argv) (run_main). Importing them is cheap: each imports torch
# and the template inside main(), after parsing its arguments. train is the module the tests
# import (monkeypatching it reaches these calls); test.py is loaded by path.
ENTRY_POINTS = {
    "train": importlib.import_module("train"),
    "test": load_entry_point("test"),
    "predict": importlib.import_module("predict"),
    "export": importlib.import_module("export"),
    "sweep": importlib.import_module("sweep"),
}


def run_main(
    script: str, *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """What run_script("<script>.py", *args) returns, from <script>.main(args) called in this
    process (train, test, predict, export, sweep): its exit code and what it printed, with one
    thread. sweep.py's trials are still processes of their own.

    For tests whose subject is not the process itself (a knob, an output, a resume's result): a
    new interpreter spends 6 to 10 s of a core importing torch and torchvision before train.py
    does anything, the in-process call under 1 s on the demo. A bug raises here, with its
    traceback. The end-to-end tests (signals, kills, torchrun, exit codes of crashes, a fresh
    copy of the project, a command as the README writes it) still start real processes.
    """
    main = ENTRY_POINTS[script.removesuffix(".py")].main
    stdout, stderr = io.StringIO(), io.StringIO()
    environ = dict(os.environ)
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    # run_script's environment, which processes the call starts (sweep.py's trials) inherit. Not
    # its CUDA_VISIBLE_DEVICES="": in a process that has used CUDA it hides nothing, in one that
    # has not it would hide the GPU from every later test. The shrunk configs' n_gpu 0 is the CPU.
    os.environ.update({"OMP_NUM_THREADS": "1", **environ, **(env or {})})
    try:
        # As in a new process: torch's global settings and the root logger come back as they
        # were (also after a module-scoped fixture's run), warnings are shown again in each run.
        with (
            torch_state_kept(),
            contextlib.chdir(cwd),
            warnings.catch_warnings(),
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
        ):
            try:
                code = main(list(args))
            except SystemExit as exit_:  # argparse's errors and --help
                code = exit_.code if isinstance(exit_.code, int) else 1 if exit_.code else 0
    finally:
        os.environ.clear()
        os.environ.update(environ)
        for handler in root.handlers:
            if handler not in handlers:  # main()'s: a console on the capture above, info.log
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
    return subprocess.CompletedProcess(
        [script, *args], code, stdout=stdout.getvalue(), stderr=stderr.getvalue()
    )


def torchrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=2 train.py <args>`: two gloo processes through
    run_script (a thread each, no GPU, unbuffered: the ranks' lines never interleave). It must
    succeed."""
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    result = run_script(*launch, *args, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def validated_in_one_process(checkpoint: Path, report_path: Path) -> tuple[dict, dict]:
    """(test.py --split val's JSON report on `checkpoint`, in this process; the metrics the run
    recorded in the checkpoint): what one process and the run's own ranks scored."""
    result = run_main(
        "test.py", "-r", str(checkpoint), "--split", "val", "--json", str(report_path)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(report_path.read_text()), torch.load(checkpoint, weights_only=True)["metrics"]


def assert_stopped_run_resumes_bit_exact(
    config: Path, runs: Path, stop_at_step: int, *, epochs: int = 2
) -> None:
    """The config's run trained straight through, and again stopped once optimizer step
    `stop_at_step` was taken (its trainer takes trainer.args.stop_at_step as StopAt does; exit
    143, as on SIGTERM) and resumed from its run folder: the last checkpoints of the two hold
    equal weights and metrics (time/ aside) at its last epoch, `epochs`. runs: the folder that
    holds the config's run folders."""
    assert run_main("train.py", "-c", str(config), "--run-id", "straight").returncode == 0
    stop = ["--set", f"trainer.args.stop_at_step={stop_at_step}"]
    stopped = run_main("train.py", "-c", str(config), "--run-id", "stopped", *stop)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert list((runs / "stopped").glob("checkpoint-epoch*-step*.pth")), "no mid-epoch checkpoint"
    resume = ["-r", str(runs / "stopped"), "--set", "trainer.args.stop_at_step=0"]
    resumed = run_main("train.py", *resume)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight, final = (
        torch.load(runs / name / f"checkpoint-epoch{epochs}.pth", weights_only=True)
        for name in ("straight", "stopped")
    )
    for key, value in straight["model"].items():
        assert torch.equal(value, final["model"][key]), key
    untimed = [
        {k: v for k, v in c["metrics"].items() if not k.startswith("time/")}
        for c in (straight, final)
    ]
    assert untimed[0] and untimed[0] == untimed[1]


def checkpoint_dirs(save_dir: Path) -> list[Path]:
    """Run folders under save_dir/models/<name>/."""
    return sorted(path for path in (save_dir / "models").glob("*/*") if path.is_dir())


@pytest.fixture
def spawn() -> Callable[..., subprocess.Popen]:
    """subprocess.Popen in a session of its own; whatever still runs at teardown is killed with
    its children, so a failing test leaves no training processes behind."""
    started: list[subprocess.Popen] = []

    def start(command: list[str], **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(command, start_new_session=True, **kwargs)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_file(process: subprocess.Popen, path: Path, timeout: float = 120) -> None:
    """Return once `path` exists; fail with the output if `process` ends first or after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def signal_once_saved(
    process: subprocess.Popen, checkpoint: Path, signum: int = signal.SIGUSR1
) -> str:
    """Send `signum` to `process` (e.g. what SLURM sends before the time limit) once it has
    saved `checkpoint`; its output after it exits."""
    wait_for_file(process, checkpoint)
    process.send_signal(signum)
    return process.communicate(timeout=120)[0]


class Crash(Exception):
    """What StopAt raises at trainer.args.crash_at_step: the process dies there, saving nothing."""


@pytest.fixture
def stop_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer.type "StopAt", as a config can name it: the demo's Trainer, which asks to stop
    (as SIGTERM would) once the optimizer step trainer.args.stop_at_step has been taken, or
    dies (raises Crash, as after a SIGKILL nothing more is saved) before the step
    trainer.args.crash_at_step."""
    import trainer as trainer_module

    class StopAt(trainer_module.Trainer):
        def __init__(self, *args, stop_at_step: int = 0, crash_at_step: int = 0, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.stop_at_step, self.crash_at_step = stop_at_step, crash_at_step

        def training_step(self, batch):
            if self.global_step + 1 == self.crash_at_step:
                raise Crash(f"killed before step {self.crash_at_step}")
            if self.global_step + 1 == self.stop_at_step:
                self.stop.signum = signal.SIGTERM
            return super().training_step(batch)

    monkeypatch.setattr(trainer_module, "StopAt", StopAt, raising=False)
    monkeypatch.setattr(trainer_module, "__all__", [*trainer_module.__all__, "StopAt"])


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint, trained once per session by train.py's main(): the shrunk demo
    config, 1 epoch on synthetic data. Shared: tests that change it work on a copy."""
    folder = tmp_path_factory.mktemp("demo_checkpoint")
    overrides = {"trainer.epochs": 1, "trainer.tensorboard": False}
    config = write_shrunk(
        "configs/demo.json", folder / "config.json", folder / "saved", **overrides
    )
    result = run_main("train.py", "-c", str(config), "--run-id", "demo")
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "saved" / "models" / "Demo_CifarCNN" / "demo" / "checkpoint-epoch1.pth"


@pytest.fixture
def cifar_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """data_dir/cifar-10-batches-py holding tests/cifar_archive.py's files.

    torchvision checks each file's md5 against its class attributes; they are pointed at ours.
    """
    folder = tmp_path / "cifar" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    files = archive_files()
    for name, content in files.items():
        (folder / name).write_bytes(content)
    for name, value in md5_attributes(files, CIFAR10.meta).items():
        monkeypatch.setattr(CIFAR10, name, value)
    return folder.parent


def noise_image_folder(root: Path, count: int = 24, classes: int = 3) -> Path:
    """root/train/class<k>/<n>.jpg: `count` 48x40 RGB noise JPEGs, dealt over `classes`."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(count):
        folder = root / "train" / f"class{index % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(48, 40, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{index}.jpg")
    return root


def kill_job(process: subprocess.Popen) -> None:
    """SIGKILL a process and every process below it (torchrun starts each worker in a session
    of its own, so its process group is not enough)."""
    children: dict[int, list[int]] = {}
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(path.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(path.parent.name))
    found, todo = [process.pid], [process.pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
