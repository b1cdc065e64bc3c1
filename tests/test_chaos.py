"""The chaos test: training killed at random moments (SIGKILL and SIGTERM, some inside a checkpoint
write), its newest checkpoint truncated once, and restarted with -r RUN_FOLDER until it
finishes, in one process and under 2-process torchrun, with DDP (and Lookahead) and with FSDP.
The final weights, optimizer state, metrics.csv and steps.csv equal those of the uninterrupted
run bit for bit, and TensorBoard holds each step once.

Each schedule prints its seed: CHAOS_SEED=<seed> replays it (and every schedule of the run from
it). CHAOS_SCHEDULES=N runs N single-process schedules instead of the 1 of CI, and one 2-process
schedule per 4 of them (at least one), each with DDP or FSDP as its seed draws. Each CI run draws
new seeds, so the schedules tried, and both strategies, add up over the runs.
"""

import csv
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, kill_job, shrink
from ports import free_port
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from utils.distributed.sharding import GLOO_FSDP_MIN_TORCH, torch_version
from utils.state.checkpoint import TEMPORARY_NAME, sorted_checkpoints

pytestmark = pytest.mark.slow
NUM_SCHEDULES = int(os.environ.get("CHAOS_SCHEDULES", "1"))
NUM_DISTRIBUTED = max(1, NUM_SCHEDULES // 4)
RUN = Path("models") / "Demo_CifarCNN"
ENV = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
TIMING = ("time/", "lr")  # wall-clock columns differ between runs; lr does not, but is kept


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 deterministic epochs of 16 batches of the demo, logged to TensorBoard and CSV, with
    keep_last and top-k (their deletions are among what a kill can interrupt)."""
    folder = tmp_path_factory.mktemp("chaos")
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), folder / "saved")
    config["data_loader"]["args"].update(num_train=640, validation_split=0.2)
    config["trainer"].update(
        epochs=3, deterministic=True, log_step=4, keep_last=2, save_top_k=2,
        loggers=["tensorboard", "csv"],
    )  # fmt: skip
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def command(processes: int, *args: str) -> list[str]:
    script = str(ROOT / "tests" / "faulty_train.py")
    if processes == 1:
        return [sys.executable, script, *args]
    rendezvous = f"--rdzv-endpoint=127.0.0.1:{free_port()}"
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
        "--rdzv-backend=c10d", rendezvous, script, *args,
    ]  # fmt: skip


def uninterrupted(config_path: Path, processes: int, strategy: str = "ddp") -> Path:
    run_id = f"reference-{processes}-{strategy}"
    result = subprocess.run(
        command(processes, "-c", str(config_path), "--run-id", run_id, *strategy_flag(strategy)),
        cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return config_path.parent / "saved" / RUN / run_id


@pytest.fixture(scope="module")
def references(config_path: Path) -> dict:
    """The uninterrupted runs, trained when a schedule first needs one."""
    cache: dict[tuple[int, str], Path] = {}

    def get(processes: int, strategy: str = "ddp") -> Path:
        if (processes, strategy) not in cache:
            cache[processes, strategy] = uninterrupted(config_path, processes, strategy)
        return cache[processes, strategy]

    return get


def strategy_flag(strategy: str) -> list[str]:
    """The strategy, and with DDP also Lookahead (refused with FSDP): its slow weights, in every
    checkpoint, are what the run ends on, so a resume that lost them ends on other weights."""
    flags = ["--set", f'distributed.strategy="{strategy}"']
    if strategy == "ddp":
        flags += ["--set", "trainer.lookahead_period=3", "--set", "trainer.lookahead_ramp=1"]
    return flags


def base_seed(testrun_uid: str) -> int:
    """CHAOS_SEED, else one drawn for this test run (the same in every pytest-xdist worker)."""
    return int(os.environ.get("CHAOS_SEED") or int(testrun_uid[:8], 16))


def run_schedule(
    config_path: Path, run_id: str, processes: int, seed: int, strategy: str = "ddp"
) -> tuple[Path, list[str]]:
    """Train with random interruptions until the run finishes; the run folder and what was done."""
    draw = random.Random(seed)
    run_dir = config_path.parent / "saved" / RUN / run_id
    env = {**os.environ, **ENV, "FAULT_SLOW_SAVE": "0.15"}
    # Some schedules also damage the newest checkpoint, at the first restart with two of them.
    num_faults, truncate = draw.randint(1, 3), draw.random() < 0.6
    events = []
    options = strategy_flag(strategy)
    if strategy == "fsdp" and draw.random() < 0.5:  # shards written while the next epoch trains
        options += ["--set", "trainer.async_checkpoint=true"]
        events.append("async_checkpoint")
    for attempt in range(12):
        restart = ["-r", str(run_dir)] if (run_dir / "config.json").exists() else None
        args = restart or ["-c", str(config_path), "--run-id", run_id, *options]
        process = subprocess.Popen(
            command(processes, *args), cwd=ROOT, env=env, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        output = Output(process)
        faults = ["sigkill", "sigterm", "in-save", "in-start-up"]
        fault = draw.choices(faults, weights=[3, 3, 3, 1])[0] if attempt < num_faults else None
        # In training (3 epochs take about 3 s), or during the seconds of start-up.
        delay = {"in-start-up": (0.5, 3.0), "in-save": (0.0, 1.5)}.get(fault, (0.0, 2.5))
        delay = draw.uniform(*delay)
        try:
            fired = interrupt(process, output, fault, delay, run_dir) if fault else False
            process.wait(timeout=600)
        finally:
            kill_job(process)  # nothing of it left behind, whatever happened
        output = output.text()
        events.append(
            f"{' '.join(args[:2])}: {fault or 'none'} at {delay:.1f}s -> {process.returncode}"
        )
        if not fired and process.returncode == 0:
            return run_dir, events
        # 143: stopped and saved; -15: SIGTERM before the handler was installed (start-up);
        # -9: killed. torchrun reports a worker lost or stopped as its own failure (1). Any
        # other code (a traceback's 1 in one process) is a bug.
        expected = {0, 143, -signal.SIGTERM, -signal.SIGKILL} | ({1} if processes > 1 else set())
        assert fired and process.returncode in expected, (events, output[-3000:])
        checkpoints = sorted_checkpoints(run_dir) if run_dir.is_dir() else []
        if truncate and len(checkpoints) >= 2:
            newest = checkpoints[-1]
            newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
            events.append(f"truncated {newest.name}")
            truncate = False
    pytest.fail(f"the run did not finish: {events}")


class Output:
    """A process's output, read as it comes (a thread), to see where it is."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self.lines.extend, args=(process.stdout,))
        self.reader.start()

    def training(self) -> bool:
        return any("Outputs: " in line for line in self.lines)  # logged as training starts

    def text(self) -> str:
        self.reader.join(timeout=60)
        return "".join(self.lines)


def interrupt(
    process: subprocess.Popen, output: Output, fault: str, delay: float, run_dir: Path
) -> bool:
    """SIGKILL (every process of the job, as a lost node) or SIGTERM (a preemption) `delay`
    seconds into training (into the start-up for "in-start-up"), or SIGKILL once a checkpoint is
    being written after that; False when the process had finished first."""
    while fault != "in-start-up" and not output.training():
        if process.poll() is not None:
            return False
        time.sleep(0.01)
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        time.sleep(0.01)
    if fault == "in-save":  # a checkpoint file, or a shards folder (FSDP), being written
        while not any(being_written(path) for path in list_dir(run_dir)):
            if process.poll() is not None:
                return False
            time.sleep(0.005)
    if process.poll() is not None:
        return False
    if fault == "sigterm":
        process.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers
    else:
        kill_job(process)
    return True


def being_written(path: Path) -> bool:
    shards = path.name.startswith("shards-") and not (path / ".metadata").exists()
    return shards or TEMPORARY_NAME.fullmatch(path.name) is not None


def list_dir(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except FileNotFoundError:
        return []


def read_rows(path: Path) -> list[dict]:
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in rows]


def final_state(run_dir: Path) -> dict:
    """The last checkpoint, with a sharded one's tensors read from its folder (every rank's
    shards together): {"model": {name: tensor}, "optimizer": {"state": {key: {...}}}, ...}."""
    state = torch.load(run_dir / "checkpoint-epoch3.pth", weights_only=True)
    if not state.get("sharded"):
        return state
    whole = run_dir / "whole.pth"
    dcp_to_torch_save(run_dir / state["sharded"], whole)
    tensors = torch.load(whole, weights_only=True)
    whole.unlink()
    return {**state, "model": tensors["model"], "optimizer": {"state": tensors["optimizer"]}}


def assert_same_run(reference: Path, run_dir: Path, events: list[str]) -> None:
    """Bit-for-bit the same final state and logs as the uninterrupted run."""
    a, b = final_state(reference), final_state(run_dir)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), (key, events)
    for index, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][index][key]), (index, key, events)
    assert a["global_step"] == b["global_step"] and a["monitor"] == b["monitor"], events
    logs = [path.parents[2] / "log" / "Demo_CifarCNN" / path.name for path in (reference, run_dir)]
    for name in ("metrics.csv", "steps.csv"):
        assert read_rows(logs[0] / name) == read_rows(logs[1] / name), (name, events)
    expected = EventAccumulator(str(logs[0])).Reload()
    found = EventAccumulator(str(logs[1])).Reload()
    for tag in expected.Tags()["scalars"]:
        steps = [event.step for event in found.Scalars(tag)]
        assert len(steps) == len(set(steps)), (tag, events)  # each step once
        if not tag.startswith("time/"):
            values = [(event.step, event.value) for event in found.Scalars(tag)]
            assert values == [(event.step, event.value) for event in expected.Scalars(tag)], tag
    # Only the run's own files are left: no temporary file, no third checkpoint (keep_last 2).
    assert not [p for p in run_dir.iterdir() if TEMPORARY_NAME.fullmatch(p.name)], events
    assert len(sorted_checkpoints(run_dir)) == 2, events
    # ... and no shards folder that no checkpoint names (a save cut short).
    named = {torch.load(path, weights_only=True).get("sharded") for path in run_dir.glob("*.pth")}
    assert {path.name for path in run_dir.glob("shards-*.dcp")} <= named, events


@pytest.mark.parametrize("index", range(NUM_SCHEDULES))
def test_random_kills_and_restarts_end_as_the_uninterrupted_run(
    config_path, references, testrun_uid, index
):
    seed = base_seed(testrun_uid) + index
    print(f"kill schedule seed {seed} (replay: CHAOS_SEED={seed - index}, schedule [{index}])")
    run_dir, events = run_schedule(config_path, f"chaos-{index}", 1, seed)
    print("\n".join(events))
    assert_same_run(references(1), run_dir, events)


def two_process_strategy(seed: int) -> str:
    """DDP or FSDP, by the schedule's seed: about as many schedules of each, over CI's runs."""
    if seed % 2 and torch_version() >= GLOO_FSDP_MIN_TORCH:  # FSDP on gloo is refused before
        return "fsdp"
    return "ddp"


@pytest.mark.parametrize("index", range(NUM_DISTRIBUTED))
def test_random_kills_and_restarts_under_torchrun_end_as_the_uninterrupted_run(
    config_path, references, testrun_uid, index
):
    """2-process torchrun with DDP or FSDP, as the seed draws it. With FSDP: kills inside the
    shards' write too, sharded checkpoints compared, and every other schedule with the shards
    written in the background (trainer.async_checkpoint)."""
    seed = base_seed(testrun_uid) + 1000 + index
    strategy = two_process_strategy(seed)
    print(
        f"kill schedule seed {seed}, {strategy} (replay: CHAOS_SEED={seed - 1000 - index}, "
        f"schedule [{index}])"
    )
    run_dir, events = run_schedule(config_path, f"chaos-{strategy}-{index}", 2, seed, strategy)
    print("\n".join(events))
    assert_same_run(references(2, strategy), run_dir, events)
