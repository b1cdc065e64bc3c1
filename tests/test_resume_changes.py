"""Resume with changed settings (issue 19, items 4-6, 11, 12): another batch size or world size
inside an epoch, optimizer and schedule changes, OneCycleLR and --epochs, metric sums on a
device without float64, and the GPU paths simulated on the CPU (cuda:N, the process-group
timeout, the averaged weights' updates and which weights the tools load)."""

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_main, shrink
from hypothesis import example, given, settings
from hypothesis import strategies as st
from ports import free_port
from test_distributed import run_torchrun
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils._python_dispatch import TorchDispatchMode

import train
import utils.data.sampler
import utils.distributed.device
from base.base_trainer import BaseTrainer
from utils.data.sampler import EpochSampler
from utils.evaluation.metric_sums import MetricSums, StepOutput
from utils.optim.averaging import update_average
from utils.state.checkpoint import ema_weights

RUN = Path("models") / "Demo_CifarCNN"


def demo(tmp_path: Path, name: str = "config.json", **sections: dict) -> Path:
    """The shrunk demo (256 training samples, batch 32: 8 steps an epoch), deterministic, with
    `sections` merged into the config's sections."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update(epochs=3, deterministic=True, type="StopAt")
    for section, values in sections.items():
        if isinstance(config.get(section), dict) and isinstance(values, dict):
            config[section].update(values)
        else:
            config[section] = values
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


# --- 4. another batch size or world size inside an epoch ------------------------------------------


@pytest.fixture
def recorded_order(monkeypatch):
    """The indices each epoch of the training sampler hands out, in order: {epoch: [...]}."""
    seen: dict[int, list[int]] = {}
    real_iter = EpochSampler.__iter__

    def recording(self):
        for index in real_iter(self):
            if self.shuffle:  # the training sampler (evaluation is in order)
                seen.setdefault(self.epoch, []).append(index)
            yield index

    monkeypatch.setattr(utils.data.sampler.EpochSampler, "__iter__", recording)
    return seen


def test_a_new_batch_size_inside_an_epoch_trains_every_sample_once(
    stop_at, tmp_path, recorded_order, capsys
):
    config = demo(tmp_path)
    assert train.main(["-c", str(config), "--run-id", "straight"]) == 0
    straight = dict(recorded_order)
    recorded_order.clear()
    stop = ["--set", "trainer.args.stop_at_step=11"]  # 3 batches (96 samples) into epoch 2
    assert train.main(["-c", str(config), "--run-id", "run", *stop]) == 143
    run_dir = tmp_path / "saved" / RUN / "run"
    capsys.readouterr()
    go_on = ["--set", "trainer.args.stop_at_step=0"]
    assert train.main(["-r", str(run_dir), "--bs", "64", *go_on]) == 0
    log = capsys.readouterr().out
    assert "data_loader.args.batch_size 32 -> 64: the epoch goes on after the 96 samples" in log
    # Epoch 2: the first 96 samples of its order, then the other 160 in batches of 64.
    assert recorded_order[2] == straight[2]
    assert sorted(recorded_order[2]) == sorted(straight[2]) and len(straight[2]) == 256
    # 11 steps, then 3 (64, 64, 32 samples) to finish epoch 2, then 4 of 64 in epoch 3.
    assert load(run_dir / "checkpoint-epoch2.pth")["global_step"] == 11 + 3
    assert load(run_dir / "checkpoint-epoch3.pth")["global_step"] == 14 + 4


def test_where_the_rest_of_an_epoch_cannot_be_found_a_new_batch_size_is_refused(
    stop_at, tmp_path, capsys
):
    config = demo(tmp_path, trainer={"len_epoch": 12})  # epochs of 12 batches across passes
    assert (
        train.main(["-c", str(config), "--run-id", "run", "--set", "trainer.args.stop_at_step=15"])
        == 143
    )
    run_dir = tmp_path / "saved" / RUN / "run"
    capsys.readouterr()
    assert train.main(["-r", str(run_dir), "--bs", "64"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "stopped inside epoch 2, and data_loader.args.batch_size 32 -> 64" in err
    )
    assert "resume with the old settings to finish epoch 2" in err


@pytest.mark.parametrize(
    "change",
    [
        'data_loader.args.sampler="weighted"',
        'data_loader.args.sampler="sequential"',
        "data_loader.args.replacement=true",
        "data_loader.args.num_samples=200",
    ],
)
def test_another_training_order_inside_an_epoch_is_refused_and_loses_nothing(
    change, stop_at, tmp_path, recorded_order, capsys
):
    """The rest of an epoch is where the epoch's order left off: in another order (another
    sampler, draw or seed) it would train some samples twice and others not at all. Refused in
    one line, the run folder untouched; at an epoch's end the change is taken."""
    config = demo(tmp_path)
    stop = ["--set", "trainer.args.stop_at_step=11"]  # 3 batches into epoch 2
    assert train.main(["-c", str(config), "--run-id", "run", *stop]) == 143
    run_dir = tmp_path / "saved" / RUN / "run"
    files = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    capsys.readouterr()
    go_on = ["--set", "trainer.args.stop_at_step=0", "--set", change]
    assert train.main(["-r", str(run_dir), *go_on]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stopped inside epoch 2, and the training order's" in err
    assert files == {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    # The same settings go on; the change is taken from the checkpoint of epoch 1.
    epoch_one = run_dir / "checkpoint-epoch1.pth"
    assert train.main(["-r", str(epoch_one), "--set", "trainer.epochs=2", *go_on]) == 0


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 3), (3, 2)])
@pytest.mark.parametrize("num_samples", [250, 256])
def test_the_rest_of_an_epoch_is_shared_out_to_another_world_size(before, after, num_samples):
    """The samples done by `before` ranks (a prefix of the epoch's order, padding aside) and those
    `after` ranks share out after it are the epoch's order, each sample once."""
    order = None
    for batches_done in (0, 1, 3):
        samplers = [
            EpochSampler(
                range(num_samples),
                shuffle=True,
                seed=3,
                num_replicas=before,
                rank=rank,
                pad=before > 1,
            )
            for rank in range(before)
        ]
        for sampler in samplers:
            sampler.set_epoch(2)
        shares = [list(sampler)[: batches_done * 16] for sampler in samplers]
        done = [index for batch in zip(*shares, strict=True) for index in batch]
        skip = batches_done * 16 * before
        rest_samplers = [
            EpochSampler(
                range(num_samples),
                shuffle=True,
                seed=3,
                num_replicas=after,
                rank=rank,
                pad=after > 1,
            )
            for rank in range(after)
        ]
        rest = []
        for sampler in rest_samplers:
            sampler.set_epoch(2, skip=skip)
            assert len(list(sampler)) == sampler.share(skip)
            rest += list(sampler)
        order = order if order is not None else samplers[0].global_order(2).tolist()
        assert done == order[:skip]
        # Every sample left, once; and padding (a few of the pass's first) to even the ranks.
        assert set(order[skip:]) <= set(rest) and len(rest) - len(order[skip:]) < after
        assert sorted(set(rest)) == sorted(rest) or len(rest) > len(order[skip:])


@pytest.mark.slow
def test_a_two_process_checkpoint_inside_an_epoch_resumes_in_one_process(tmp_path):
    config = demo(tmp_path, trainer={"type": "Trainer", "log_step": 1})
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "tests/faulty_train.py",
         "-c", str(config), "--run-id", "run"],
        cwd=ROOT, env={**env, "FAULT_SLOW_SAVE": "0"}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    run_dir = tmp_path / "saved" / RUN / "run"
    while not (run_dir / "checkpoint-epoch1.pth").exists():
        assert process.poll() is None
        time.sleep(0.01)
    process.send_signal(15)
    process.wait(timeout=120)
    (saved,) = run_dir.glob("checkpoint-epoch2-step*.pth")
    state = load(saved)
    done = state["position"]["samples"]
    assert state["geometry"]["world_size"] == 2 and done == 64 * state["position"]["batches"]
    result = run_main("train.py", "-r", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert (
        f"the number of processes 2 -> 1: the epoch goes on after the {done} samples"
        in result.stdout
    )
    # Epoch 2 in one process: the 256 - done samples left, in batches of 32.
    steps_left = math.ceil((256 - done) / 32)
    assert (
        load(run_dir / "checkpoint-epoch2.pth")["global_step"] == state["global_step"] + steps_left
    )


# --- 5. config changes the saved state cannot honour ---------------------------------------------


def test_new_parameter_groups_keep_the_saved_moments_by_name(stop_at, tmp_path, capsys):
    config = demo(tmp_path, trainer={"epochs": 1})
    assert train.main(["-c", str(config), "--run-id", "run"]) == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    saved = load(run_dir / "checkpoint-epoch1.pth")
    extra = ["--set", "optimizer.norm_bias_weight_decay=0.0", "--epochs", "2"]
    capsys.readouterr()
    assert train.main(["-r", str(run_dir), *extra]) == 0
    log = capsys.readouterr().out
    assert "optimizer.norm_bias_weight_decay changed: learning rates" in log
    count = len(saved["optimizer"]["state"])
    assert f"the state of {count} of {count} parameters (momentum, moments)" in log
    resumed = load(run_dir / "checkpoint-epoch2.pth")
    assert (
        len(resumed["optimizer"]["param_groups"])
        == 2
        == len(saved["optimizer"]["param_groups"]) + 1
    )
    # Adam's step count went on from the saved one: 8 steps, then 8 more.
    assert all(state["step"] == 16 for state in resumed["optimizer"]["state"].values())


def test_reference_batch_size_scales_the_rates_of_a_resume_with_another_batch(
    stop_at, tmp_path, capsys
):
    config = demo(tmp_path, optimizer={"reference_batch_size": 32}, trainer={"epochs": 1})
    assert train.main(["-c", str(config), "--run-id", "run"]) == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    capsys.readouterr()
    assert train.main(["-r", str(run_dir), "--bs", "64", "--epochs", "2"]) == 0
    log = capsys.readouterr().out
    assert "the global batch (32 -> 64) changed" in log
    state = load(run_dir / "checkpoint-epoch2.pth")
    assert state["optimizer"]["param_groups"][0]["initial_lr"] == pytest.approx(0.003 * 64 / 32)


def test_a_schedule_switched_to_steps_is_rebuilt_in_steps(stop_at, tmp_path, capsys):
    schedule = {"type": "CosineAnnealingLR", "args": {}, "interval": "epoch"}
    config = demo(tmp_path, lr_scheduler=schedule, trainer={"epochs": 3})
    assert train.main(["-c", str(config), "--run-id", "run", "--epochs", "1"]) == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    step = ["--set", "lr_scheduler.interval=step", "--epochs", "3"]
    capsys.readouterr()
    assert train.main(["-r", str(run_dir), *step]) == 0
    log = capsys.readouterr().out
    assert "lr_scheduler: rebuilt from the config (lr_scheduler.interval changed" in log
    assert "stepped 8 times" in log  # epoch 1's 8 optimizer steps
    state = load(run_dir / "checkpoint-epoch3.pth")
    # A cosine over the 24 steps of the run, at its end: T_max 24, lr at its minimum.
    assert state["lr_scheduler"]["T_max"] == 24 and state["lr_scheduler"]["last_epoch"] == 24
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0, abs=1e-12)


# --- 6. OneCycleLR, --epochs, and schedules shorter than the run ----------------------------------


def one_cycle(**args: object) -> dict:
    return {"type": "OneCycleLR", "args": {"max_lr": 0.1, **args}, "interval": "step"}


def test_one_cycle_max_lr_follows_reference_batch_size_and_epochs_on_resume(stop_at, tmp_path):
    config = demo(tmp_path, lr_scheduler=one_cycle(), optimizer={"reference_batch_size": 8})
    assert train.main(["-c", str(config), "--run-id", "run", "--epochs", "2"]) == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    first = load(run_dir / "checkpoint-epoch2.pth")["optimizer"]["param_groups"][0]
    assert first["max_lr"] == pytest.approx(0.1 * 32 / 8)  # the peak scaled like the rates
    assert train.main(["-r", str(run_dir), "--epochs", "3"]) == 0  # the README's --epochs on resume
    final = load(run_dir / "checkpoint-epoch3.pth")
    assert final["lr_scheduler"]["total_steps"] == 24 and final["lr_scheduler"]["last_epoch"] == 24


def test_a_schedule_shorter_than_the_run_warns_or_is_refused(stop_at, tmp_path, capsys):
    cosine = {"type": "CosineAnnealingLR", "args": {"T_max": 2}, "interval": "epoch"}
    assert train.main(["-c", str(demo(tmp_path, lr_scheduler=cosine)), "--run-id", "cos"]) == 0
    log = capsys.readouterr().out
    assert "CosineAnnealingLR ends after 2 epochs, the run has 3" in log
    assert "climbs back up" in log
    capsys.readouterr()
    short = demo(tmp_path, "short.json", lr_scheduler=one_cycle(total_steps=10))
    assert train.main(["-c", str(short), "--run-id", "short"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "OneCycleLR's length (10 optimizer steps) is shorter" in err
    assert not (tmp_path / "saved" / RUN / "short").exists()


# --- 11. a device without float64 (Apple's MPS) ---------------------------------------------------


class NoFloat64(TorchDispatchMode):
    """Refuses every float64 tensor an operation makes, as MPS does."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for item in out if isinstance(out, tuple | list) else [out]:
            if isinstance(item, torch.Tensor) and item.dtype == torch.float64:
                raise TypeError(f"{func}: float64 is not supported on this device")
        return out


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_metric_sums_use_no_float64_where_the_device_has_none_and_stay_exact(monkeypatch):
    cpu = utils.distributed.device.capabilities(torch.device("cpu"))
    monkeypatch.setattr(
        "utils.evaluation.metric_sums.capabilities",
        lambda device: type(cpu)(**{**vars(cpu), "float64": False}),
    )
    generator = torch.Generator().manual_seed(0)
    losses = torch.rand(20000, generator=generator) * 3
    right = torch.full((1000,), 1.0)  # 1000 right answers a batch: counts past 2**24
    plain = torch.zeros((), dtype=torch.float32)
    with NoFloat64():
        sums = MetricSums({"right": lambda output, target: output.sum()}, torch.device("cpu"))
        for index in range(len(losses)):
            sums.add(StepOutput(loss=losses[index], output=right, target=right), index + 1)
            plain += losses[index] * 1000
    exact = float((losses.double() * 1000).sum())
    totals = sums.all_ranks().tolist()
    assert totals[1] == totals[2] == 20000 * 1000 > 2**24  # exact counts, past float32's
    # Each batch's loss x 1000 rounds to float32; the sum of them adds no error of its own.
    assert abs(totals[0] - exact) / exact < 1e-9 < abs(float(plain) - exact) / exact
    with pytest.raises(TypeError, match="float64 is not supported"), NoFloat64():
        torch.zeros(2, dtype=torch.float64)  # the simulation does refuse it


# --- 12. the GPU paths, simulated ---------------------------------------------------------------


class SetDevice(Exception):
    """Raised by the simulated torch.cuda.set_device."""


def test_a_named_cuda_device_becomes_the_current_one_before_anything_else(make_config, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)

    def set_device(device):
        raise SetDevice(str(device))

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    config = make_config(device="cuda:1", n_gpu=1)
    with pytest.raises(SetDevice, match=r"^cuda:1$"):
        train.main(["-c", str(config)])


def test_the_process_group_gets_distributed_timeout(monkeypatch):
    from utils.distributed.process_group import ProcessInfo, init_distributed

    calls = {}
    monkeypatch.setattr(torch.distributed, "rendezvous", lambda url: iter([(None, 0, 2)]))
    monkeypatch.setattr(torch.distributed, "PrefixStore", lambda prefix, store: store)
    monkeypatch.setattr(
        torch.distributed, "init_process_group", lambda backend, **kw: calls.update(kw)
    )
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    init_distributed(ProcessInfo(world_size=2), "gloo", torch.device("cpu"), 45)
    assert calls["timeout"].total_seconds() == 45 * 60


@pytest.mark.slow
def test_preparing_the_data_may_take_longer_than_the_collective_timeout(tmp_path):
    config = demo(tmp_path, trainer={"type": "Trainer", "epochs": 1}, distributed={"timeout": 0.05})
    result = run_torchrun(
        "--standalone", "--nproc_per_node=2", "tests/faulty_train.py", "-c", str(config),
        "--run-id", "run", timeout=240, env={"FAULT_SLOW_PREPARE": "8"},
    )  # fmt: skip
    # Rank 1 waits 8 s for rank 0's preparation, past the 3 s timeout of the training group.
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_average_updates_as_averaged_model_does_without_a_host_sync():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    ours = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    theirs = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    for step in range(3):
        model(torch.randn(8, 4))  # BatchNorm statistics move too
        with torch.no_grad():
            model[0].weight.add_(0.1 * step)
        update_average(ours, model, restart=step == 0)
        theirs.update_parameters(model)
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    # "meta" stands in for a GPU: reading a tensor's value there fails, as a sync would wait.
    meta = nn.Linear(4, 4, device="meta")
    average = AveragedModel(meta, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    average.to("meta")  # its counter too: torch's update reads it back, ours never
    update_average(average, meta, restart=True)
    update_average(average, meta, restart=False)
    with pytest.raises(RuntimeError):
        average.update_parameters(meta)  # torch's own reads its counter back


def test_ema_warmup_reset_restarts_the_average_until_the_warmup_is_over(stop_at, tmp_path):
    schedule = {"type": "CosineAnnealingLR", "args": {}, "interval": "step", "warmup_steps": 10}
    trainer = {"epochs": 2, "ema_decay": 0.5, "monitor": "max val/ema_accuracy"}
    runs = {}
    for reset in (False, True):
        config = demo(tmp_path, f"{reset}.json", lr_scheduler=schedule, trainer=trainer)
        flags = ["--set", f"trainer.ema_warmup_reset={json.dumps(reset)}", "--epochs", "2"]
        assert train.main(["-c", str(config), "--run-id", f"reset-{reset}", *flags]) == 0
        runs[reset] = load(tmp_path / "saved" / RUN / f"reset-{reset}" / "checkpoint-epoch2.pth")
    # With the reset, the average holds the 6 updates after the warmup's 10 steps (the 11th
    # copies): decay 0.5 over 5 updates; without it, all 16 blend in.
    assert runs[True]["ema"]["n_averaged"] == 16 - 10
    assert runs[False]["ema"]["n_averaged"] == 16
    a, b = runs[True]["ema"], runs[False]["ema"]
    assert not torch.equal(a["module.head.weight"], b["module.head.weight"])


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_tools_load_the_weights_the_monitor_chose(stop_at, tmp_path):
    trainer = {"epochs": 1, "ema_decay": 0.5, "monitor": "max val/ema_accuracy", "type": "Trainer"}
    config = demo(tmp_path, trainer=trainer)
    result = run_main("train.py", "-c", str(config), "--run-id", "ema")
    assert result.returncode == 0, result.stderr
    best = tmp_path / "saved" / RUN / "ema" / "model_best.pth"
    report = tmp_path / "report.json"
    result = run_main("test.py", "-r", str(best), "--split", "val", "--json", str(report))
    assert result.returncode == 0, result.stderr
    assert (
        "the averaged weights (trainer.monitor 'max val/ema_accuracy' judged them)" in result.stdout
    )
    state = load(best)
    assert json.loads(report.read_text())["ema"] is True
    assert (
        json.loads(report.read_text())["metrics"]["val/accuracy"]
        == state["metrics"]["val/ema_accuracy"]
    )
    trained = run_main("test.py", "-r", str(best), "--split", "val", "--weights", "trained")
    assert "the trained weights" in trained.stdout


def test_a_resume_in_another_batch_geometry_at_an_epoch_boundary_says_so(stop_at, tmp_path, capsys):
    """Issue 31, item 14: without a schedule to rebuild (whose warning named the change) the
    resume was silent; now it names what changed, as a mid-epoch resume does."""
    config = demo(tmp_path, lr_scheduler=None, trainer={"epochs": 1})
    assert train.main(["-c", str(config), "--run-id", "run"]) == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    capsys.readouterr()
    assert train.main(["-r", str(run_dir), "--bs", "64", "--epochs", "2"]) == 0
    log = capsys.readouterr().out
    assert "batch_size 32 -> 64" in log and "epoch 2 on is trained in this run's batches" in log
    assert "lr_scheduler" not in log


@pytest.fixture
def nonfinite_at(monkeypatch: pytest.MonkeyPatch) -> dict:
    """{"batches": set, "count": 0}: the demo's Trainer makes the loss nan at the training
    batches in "batches", counted in "count" (in training mode: not check_first_batch's)."""
    import trainer as trainer_module

    injected = {"batches": set(), "count": 0}
    original = trainer_module.Trainer.training_step

    def training_step(self, batch):
        result = original(self, batch)
        if self.model.training:
            injected["count"] += 1
            if injected["count"] in injected["batches"]:
                result = dataclasses.replace(result, loss=result.loss * float("nan"))
        return result

    monkeypatch.setattr(trainer_module.Trainer, "training_step", training_step)
    return injected


@pytest.mark.slow
def test_a_rebuilt_schedule_counts_the_steps_taken_not_those_skipped(
    stop_at, nonfinite_at, tmp_path, capsys
):
    """Epoch 1 with nonfinite "skip" and batches of nan loss, each an accumulation group of its
    own: its skipped groups take no optimizer step, and the schedule waits for the next (the
    docs). The schedule rebuilt on resume was stepped once per group, skipped ones included:
    ahead of an uninterrupted run's, whose schedule steps once per optimizer step."""

    @settings(max_examples=3, deadline=None)
    @given(skipped=st.sets(st.integers(1, 8), min_size=1, max_size=3))
    def check(skipped: set[int]) -> None:
        nonfinite_at.update(batches=skipped, count=0)
        schedule = {"type": "CosineAnnealingLR", "args": {}, "interval": "epoch"}
        trainer = {"epochs": 2, "nonfinite": "skip", "max_skipped_steps": 3}
        with tempfile.TemporaryDirectory() as folder:
            config = demo(Path(folder), lr_scheduler=schedule, trainer=trainer)
            assert train.main(["-c", str(config), "--run-id", "run", "--epochs", "1"]) == 0
            nonfinite_at["batches"] = set()  # none in the resumed part
            run_dir = Path(folder) / "saved" / RUN / "run"
            epoch1 = load(run_dir / "checkpoint-epoch1.pth")
            assert epoch1["global_step"] == 8 - len(skipped)
            capsys.readouterr()
            step = ["--set", "lr_scheduler.interval=step", "--epochs", "2"]
            assert train.main(["-r", str(run_dir), *step]) == 0
            assert f"stepped {8 - len(skipped)} times" in capsys.readouterr().out
            state = load(run_dir / "checkpoint-epoch2.pth")
            assert state["global_step"] == 16 - len(skipped)
            assert state["lr_scheduler"]["last_epoch"] == state["global_step"]

    check()


def same_training_state(first: dict, second: dict) -> bool:
    """Every weight, optimizer tensor and count of two checkpoints bit-for-bit equal."""
    if (
        first["global_step"] != second["global_step"]
        or first["model"].keys() != second["model"].keys()
    ):
        return False
    tensors = [(first["model"][key], second["model"][key]) for key in first["model"]]
    for index, state in first["optimizer"]["state"].items():
        tensors += [
            (value, second["optimizer"]["state"][index][key]) for key, value in state.items()
        ]
    return all(torch.equal(a, b) for a, b in tensors)


@pytest.mark.slow
def test_a_stop_requested_among_skipped_batches_resumes_as_an_uninterrupted_run(
    stop_at, nonfinite_at, tmp_path
):
    """trainer.nonfinite "skip": a stop asked for while groups are skipped waits for the next
    group that steps (or the epoch's end), and the resumed run finishes exactly as one never
    stopped: the data position saved is what was consumed, the skipped batches not redone."""
    trainer = {"epochs": 2, "nonfinite": "skip", "max_skipped_steps": 16}
    finished, stopped = {}, []

    def final_state(folder: Path, accumulate: int, skipped: set[int], stop: int) -> dict:
        nonfinite_at.update(batches=skipped, count=0)
        folder.mkdir()
        config = demo(folder, f"{accumulate}.json", trainer=trainer)
        flags = ["--set", f"trainer.grad_accum_steps={accumulate}"]
        stop_flag = ["--set", f"trainer.args.stop_at_step={stop}"]
        code = train.main(["-c", str(config), "--run-id", "run", *flags, *stop_flag])
        run_dir = folder / "saved" / RUN / "run"
        if code == 143:  # stopped: the resumed part's batches go on counting where it left
            stopped.append(
                {path.name: load(path)["position"] for path in run_dir.glob("checkpoint-*")}
            )
            go_on = ["--set", "trainer.args.stop_at_step=0"]
            code = train.main(["-r", str(run_dir), *go_on])
        assert code == 0
        return load(run_dir / "checkpoint-epoch2.pth")

    @settings(max_examples=8, deadline=None)
    @given(
        accumulate=st.integers(1, 3),
        skipped=st.sets(st.integers(1, 16), max_size=8),  # of the 16 batches of two epochs
        stop=st.integers(1, 4),  # asked for at the batch that would take this optimizer step
    )
    # Asked for at batch 4 of 8: the rest of epoch 1 is skipped, it stops at the epoch's end.
    @example(accumulate=1, skipped={4, 5, 6, 7, 8}, stop=4)
    # Asked for at batch 3, in a skipped group of 2: it stops after the next, batch 6.
    @example(accumulate=2, skipped={3, 4}, stop=2)
    def check(accumulate: int, skipped: set[int], stop: int) -> None:
        with tempfile.TemporaryDirectory() as folder:
            key = (accumulate, frozenset(skipped))
            if key not in finished:
                finished[key] = final_state(Path(folder) / "straight", accumulate, skipped, 0)
            resumed = final_state(Path(folder) / "stopped", accumulate, skipped, stop)
            assert same_training_state(resumed, finished[key])
            assert resumed["num_skipped_steps"] == finished[key]["num_skipped_steps"]

    check()
    # The explicit examples run first: the one at the epoch's end, then the one after batch 6.
    assert list(stopped[0]) == ["checkpoint-epoch1.pth"]
    assert stopped[1]["checkpoint-epoch1-step2.pth"]["batches"] == 6


def test_a_fine_tune_starts_from_the_weights_its_checkpoint_was_judged_by(
    stop_at, tmp_path, monkeypatch, capsys
):
    """-r CKPT -c CONFIG from a run whose monitor watched val/ema_accuracy starts from the
    averaged weights (as test.py scores them), the new run's average from them too; --continue
    and a plain resume carry on the trained ones (exact resume). Before: always the trained."""
    trainer = {"epochs": 1, "ema_decay": 0.5, "monitor": "max val/ema_accuracy"}
    config = demo(tmp_path, trainer=trainer)
    assert train.main(["-c", str(config), "--run-id", "ema"]) == 0
    best = tmp_path / "saved" / RUN / "ema" / "model_best.pth"
    state = load(best)
    averaged = ema_weights(state, best)
    assert any(not torch.equal(averaged[key], state["model"][key]) for key in averaged)
    started: list[dict] = []  # the weights (and the average's) as each run's training begins
    real_train_epoch = BaseTrainer.train_epoch

    def recording(self, epoch: int) -> dict:
        if not started or started[-1]["epoch"] != epoch:
            started.append({"epoch": epoch, "model": clone(self.model.state_dict()),
                            "ema": clone(self.ema.module.state_dict())})  # fmt: skip
        return real_train_epoch(self, epoch)

    monkeypatch.setattr(BaseTrainer, "train_epoch", recording)
    capsys.readouterr()
    assert train.main(["-r", str(best), "-c", str(config), "--run-id", "tuned"]) == 0
    for weights in (started[-1]["model"], started[-1]["ema"]):
        assert all(torch.equal(weights[key], averaged[key]) for key in averaged)
    assert "its averaged weights, in a new run from epoch 1" in capsys.readouterr().out
    flags = ["--continue", "--run-id", "continued", "--epochs", "2"]
    assert train.main(["-r", str(best), "-c", str(config), *flags]) == 0
    assert all(torch.equal(started[-1]["model"][key], state["model"][key]) for key in averaged)


def clone(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in weights.items()}
