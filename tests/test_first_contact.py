"""The paths a user with a GPU box takes on day one, simulated on the CPU: resume onto another
device ("meta" stands in for CUDA), the TF32 switch on every supported torch, the process-group
backend, fused optimizers, torch.compile's graphs, runs that crashed before their first
checkpoint, bugs in user code, and learning-rate bookkeeping."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import NUM_EXAMPLES, ROOT, run_main, shrink
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import model.model as arch_module
import train
from base import BaseModel
from data_loader.data_loaders import SyntheticDataLoader
from model.loss import cross_entropy
from model.metric import accuracy
from parse_config import ConfigParser
from trainer import Trainer
from utils.distributed.process_group import ProcessInfo, default_backend, init_distributed
from utils.optim.optimizer import build_optimizer
from utils.state.checkpoint import save_checkpoint
from utils.state.training_state import checkpoint_state
from utils.util import configure_torch, set_tf32, tf32_enabled

RUN = Path("models") / "Demo_CifarCNN"


def make_trainer(tmp_path: Path, device: torch.device, **trainer_args) -> Trainer:
    """A Trainer on the shrunk demo, its model and optimizer built on `device`."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update(tensorboard=False, **trainer_args)
    parser = ConfigParser(config, source="test")
    torch.manual_seed(0)
    model = arch_module.CifarCNN(**config["arch"]["args"]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = SyntheticDataLoader(**{**config["data_loader"]["args"], "seed": 0})
    # The trainer builds the config's schedule (CosineAnnealingLR) on this optimizer.
    return Trainer(
        model, cross_entropy, {"accuracy": accuracy}, optimizer,
        config=parser, device=device, data=data,
    )  # fmt: skip


# --- 1. resume on a device that is not the CPU ----------------------------------------------


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")
@pytest.mark.parametrize("mid_epoch", [False, True], ids=["epoch-end", "mid-epoch"])
def test_resume_loads_on_the_cpu_and_places_state_on_the_training_device(tmp_path, mid_epoch):
    trainer = make_trainer(tmp_path / "cpu", torch.device("cpu"))
    trainer.train_epoch(1)
    trainer.state.epoch, trainer.state.num_skipped_steps = 1, 3
    if mid_epoch:
        sums = torch.ones(5, dtype=torch.float64)
        trainer.state.batches, trainer.state.samples = 2, 64
        trainer.state.epoch_sums = {"totals": sums, "logged": sums}
    state = checkpoint_state(trainer, {"train/loss": 1.0})[0]
    path = tmp_path / "checkpoint-epoch1.pth"
    save_checkpoint(state, path)

    # "meta" stands in for a GPU: a device whose tensors torch.set_rng_state and numpy refuse,
    # as they refuse CUDA tensors. Loading the checkpoint onto it crashed every resume path.
    resumed = make_trainer(tmp_path / "meta", torch.device("meta"))
    resumed.resume(path)
    assert resumed.start_epoch == 2 and resumed.state.num_skipped_steps == 3
    # load_state_dict put the optimizer state where the parameters are.
    parameter = next(resumed.model.parameters())
    assert resumed.optimizer.state[parameter]["exp_avg"].device.type == "meta"
    if mid_epoch:
        assert resumed.state.batches == 2 and resumed.state.samples == 64
        assert resumed.state.epoch_sums["totals"].device.type == "cpu"


def test_the_checkpoint_holds_one_rng_state_per_rank(tmp_path):
    state = checkpoint_state(make_trainer(tmp_path, torch.device("cpu")), {})[0]
    assert isinstance(state["rng"], list) and len(state["rng"]) == 1
    assert state["rng"][0]["torch"].device.type == "cpu" and state["rng"][0]["cuda"] is None


def test_a_signal_just_after_the_ranks_agreed_waits_for_the_next_agreement(tmp_path, monkeypatch):
    """Under torchrun a signal reaches the ranks at different moments. One that lands on a rank
    after the end-of-epoch agreement must not stop that rank alone (the others would train on
    and wait for it forever): it stops every rank at the next agreement."""
    import signal

    import base.base_trainer

    trainer = make_trainer(tmp_path, torch.device("cpu"), epochs=2)
    agree = base.base_trainer.all_reduce_max

    def agree_then_signal(tensor):
        agreed = agree(tensor)
        trainer.stop.signum = signal.SIGUSR1  # arrives right after the collective
        return agreed

    monkeypatch.setattr(base.base_trainer, "all_reduce_max", agree_then_signal)
    trainer.checkpoint_dir.mkdir(parents=True)
    trainer.run_epoch(1)  # does not raise Interrupted: the ranks agreed on no signal
    assert trainer.stop.signum == signal.SIGUSR1  # still pending for the next agreement
    assert (trainer.checkpoint_dir / "checkpoint-epoch1.pth").is_file()


# --- 5. TF32 on the lowest supported torch and the newest ---------------------------------------


@pytest.fixture
def restore_tf32():
    before = tf32_enabled()
    yield
    # Back to what it was, through the API this torch has.
    set_tf32(before[0])


@pytest.mark.parametrize("enabled", [True, False])
def test_tf32_switch_sets_matrix_products_and_convolutions(restore_tf32, enabled):
    set_tf32(enabled)
    assert tf32_enabled() == (enabled, enabled)


def test_tf32_false_turns_off_convolutions_that_torch_runs_in_tf32_by_default(restore_tf32):
    # torch's own default lets cuDNN convolutions use TF32; "false" must mean off for them too.
    from utils import configure_torch

    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), Path("unused"))
    trainer_config = {**ConfigParser(config, source="t")["trainer"], "tf32": False}
    configure_torch(trainer_config, torch.device("cuda"))  # sets flags only, no GPU needed
    assert tf32_enabled() == (False, False)


def tf32_readings() -> dict[str, bool]:
    """Whether TF32 is on, read through every getter torch has: the older allow_tf32 flags and
    get_float32_matmul_precision, and torch >= 2.9's fp32_precision settings. Inductor reads
    both kinds; torch raises on reading the older ones after only the newer were written."""
    readings = {
        "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision() == "high",
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
    }
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        readings["matmul.fp32_precision"] = torch.backends.cuda.matmul.fp32_precision == "tf32"
        for op in ("conv", "rnn"):
            setting = getattr(torch.backends.cudnn, op).fp32_precision
            readings[f"cudnn.{op}.fp32_precision"] = setting == "tf32"
    return readings


def demo_trainer_config() -> dict:
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), Path("unused"))
    return dict(ConfigParser(config, source="t")["trainer"])


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_tf32_reads_back_through_both_of_torchs_apis(num_examples):
    """Whatever trainer.tf32 runs set before, every getter reads the last one (issue 31, item 17)."""
    trainer_config = demo_trainer_config()

    @settings(max_examples=num_examples)
    @given(st.lists(st.booleans(), min_size=1, max_size=4))
    def check(values: list[bool]) -> None:
        for enabled in values:
            configure_torch({**trainer_config, "tf32": enabled}, torch.device("cuda"))
        readings = tf32_readings()
        assert readings == dict.fromkeys(readings, values[-1])

    check()


def test_tf32_then_compile_with_autotuning_still_compiles():
    # The reported failure: Inductor's autotuning reads get_float32_matmul_precision(), which
    # raised after trainer.tf32. The CPU takes that path when freezing weights for inference.
    configure_torch({**demo_trainer_config(), "tf32": True}, torch.device("cuda"))
    model = nn.Linear(64, 64).eval()
    inputs = torch.randn(64, 64)
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(freezing=True, fx_graph_cache=False):
            compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
            with torch.no_grad():
                torch.testing.assert_close(compiled(inputs), model(inputs))
    finally:
        torch._dynamo.reset()


# --- 6. the process-group backend follows the model's device ------------------------------------


@pytest.mark.parametrize(
    ("device", "backend", "current_device"),
    [(torch.device("cpu"), "gloo", None), (torch.device("cuda", 1), "nccl", 1)],
)
def test_automatic_backend_follows_the_device(monkeypatch, device, backend, current_device):
    """n_gpu 0 under torchrun on a CUDA machine: the model is on the CPU, so gloo, not nccl."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine
    calls = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.update(set_device=index))
    monkeypatch.setattr(torch.distributed, "rendezvous", lambda url: iter([(None, 0, 2)]))
    monkeypatch.setattr(torch.distributed, "PrefixStore", lambda prefix, store: store)
    monkeypatch.setattr(
        torch.distributed, "init_process_group", lambda backend, **kw: calls.update(backend=backend)
    )
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    init_distributed(ProcessInfo(rank=1, local_rank=1, world_size=2), None, device)
    assert calls.get("backend") == backend == default_backend(device)
    assert calls.get("set_device") == (device if current_device is not None else None)


# --- 9. fused optimizers on CUDA: GradScaler then needs no host sync ----------------------------


@pytest.mark.parametrize(
    ("optimizer", "device", "fused"),
    [
        ({"type": "Adam", "args": {"lr": 0.1}}, "cuda", True),
        ({"type": "SGD", "args": {"lr": 0.1, "momentum": 0.9}}, "cuda", True),
        ({"type": "AdamW", "args": {"lr": 0.1, "fused": False}}, "cuda", False),
        ({"type": "Adam", "args": {"lr": 0.1, "foreach": True}}, "cuda", None),
        ({"type": "RMSprop", "args": {"lr": 0.1}}, "cuda", None),
        ({"type": "Adam", "args": {"lr": 0.1}}, "cpu", None),
    ],
)
def test_fused_optimizer_on_cuda_unless_the_config_says_otherwise(
    demo_config_parser, optimizer, device, fused
):
    parser = demo_config_parser(optimizer=optimizer)
    # The parameters stay on the CPU (fused kernels exist there too); the device decides.
    built = build_optimizer(parser, nn.Linear(2, 2), torch.device(device))
    assert type(built).__name__ == optimizer["type"]
    assert built.defaults.get("fused") == fused


@pytest.fixture
def demo_config_parser(tmp_path):
    def make(**sections) -> ConfigParser:
        config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
        config.update(sections)
        return ConfigParser(config, source="test")

    return make


# --- 3. torch.compile keeps one graph ------------------------------------------------------------


@pytest.mark.slow
def test_compile_does_not_recompile_after_the_first_epoch(make_config):
    # 256 training samples in batches of 48: five full batches and a short one of 16, which is
    # dropped. Validation (64 samples: 48 + 16) compiles its own graphs in epoch 1.
    config = make_config(
        **{"data_loader.args.batch_size": 48, "trainer.compile": True, "trainer.tensorboard": False}
    )
    command = [
        sys.executable,
        "train.py",
        "-c",
        str(config),
        "--run-id",
        "compiled",
        "--epochs",
        "3",
    ]
    env = {
        **os.environ,
        "TORCH_LOGS": "recompiles",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    # One stream, so that the order of the log lines and the recompilations is kept.
    result = subprocess.run(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert result.returncode == 0, result.stdout[-3000:]
    # After epoch 1's summary line (a progress line of a slow epoch also starts "epoch 1/3").
    after_first_epoch = result.stdout.partition("epoch 1/3  train/")[2]
    assert "epoch 3/3" in after_first_epoch
    assert "Recompiling" not in after_first_epoch, after_first_epoch[-3000:]
    # Training itself never recompiles: every recompilation is validation's (grad mode off).
    training = [line for line in result.stdout.splitlines() if "size mismatch" in line]
    assert all("actual 16" in line for line in training)  # the validation batch of 16
    run_dir = config.parent / "saved" / RUN / "compiled"
    first, state = (
        torch.load(run_dir / f"checkpoint-epoch{epoch}.pth", weights_only=True) for epoch in (1, 3)
    )
    assert state["global_step"] == 3 * 5  # the short last batch of each epoch was dropped
    # The compiled model trains (the knob test of test_performance.py, for this knob) and its
    # checkpoint holds the plain model's names, not the compiled wrapper's.
    assert state["metrics"]["train/loss"] < first["metrics"]["train/loss"] - 0.05
    assert 0 <= state["metrics"]["time/data_wait_fraction"] <= 1
    assert not any(key.startswith("_orig_mod.") for key in state["model"])


# --- 10. a run that crashed before its first checkpoint ----------------------------------------


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_a_run_that_failed_before_its_first_checkpoint_can_be_restarted(make_config):
    # SGD at lr 1e38 overflows at once: the run stops with an error and holds only config.json.
    config = make_config(**{"optimizer": {"type": "SGD", "args": {"lr": 1e38}}})
    failed = run_main("train.py", "-c", str(config), "--run-id", "crashed")
    assert failed.returncode == 1, failed.stderr
    run_dir = config.parent / "saved" / RUN / "crashed"
    assert [path.name for path in run_dir.iterdir()] == ["config.json"]

    # -r on the folder restarts it from epoch 1 with its own config (fixed here by hand).
    saved_config = json.loads((run_dir / "config.json").read_text())
    saved_config["optimizer"]["args"]["lr"] = 0.003
    (run_dir / "config.json").write_text(json.dumps(saved_config))
    restarted = run_main("train.py", "-r", str(run_dir))
    assert restarted.returncode == 0, restarted.stderr
    assert re.findall(r"epoch (\d)/2 ", restarted.stdout) == ["1", "2"]
    assert (run_dir / "checkpoint-epoch2.pth").is_file()


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_the_run_id_of_a_run_without_checkpoints_can_be_reused(make_config, capsys):
    # All three runs in-process: a subprocess would import torch again.
    config = make_config(**{"optimizer": {"type": "SGD", "args": {"lr": 1e38}}})
    assert train.main(["-c", str(config), "--run-id", "again"]) == 1
    fixed = make_config(filename="fixed.json")
    result = run_main("train.py", "-c", str(fixed), "--run-id", "again")
    assert result.returncode == 0, result.stderr
    run_dir = config.parent / "saved" / RUN / "again"
    assert json.loads((run_dir / "config.json").read_text())["optimizer"]["type"] == "Adam"
    # A run with a checkpoint is still refused.
    capsys.readouterr()
    assert train.main(["-c", str(fixed), "--run-id", "again"]) == 2
    assert "this run already exists" in capsys.readouterr().err


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_restarting_a_run_without_checkpoints_refuses_a_new_config(make_config, tmp_path, capsys):
    run_dir = tmp_path / "saved" / RUN / "empty"
    run_dir.mkdir(parents=True)
    shutil.copy(make_config(), run_dir / "config.json")
    assert train.main(["-r", str(run_dir), "-c", str(make_config())]) == 2
    assert "no checkpoint to start from; drop -c" in capsys.readouterr().err


# --- 11. a bug in the user's own model shows its traceback ---------------------------------------


class BuggyModel(BaseModel):
    def __init__(self, *, num_classes: int = 10) -> None:
        super().__init__()
        self.head = nn.Linear(3 * 32 * 32)  # the bug: out_features forgotten

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(images.flatten(1))


def test_a_bug_in_a_model_constructor_is_not_reported_as_a_config_error(make_config, monkeypatch):
    monkeypatch.setattr(arch_module, "BuggyModel", BuggyModel, raising=False)
    monkeypatch.setattr(arch_module, "__all__", [*arch_module.__all__, "BuggyModel"])
    config = make_config(**{"arch": {"type": "BuggyModel", "args": {"num_classes": 10}}})
    with pytest.raises(TypeError, match="out_features"):
        train.main(["-c", str(config), "--run-id", "buggy"])


# --- 12. learning-rate schedules -----------------------------------------------------------------


def test_plateau_scheduler_per_step_is_refused_up_front(make_config, tmp_path, capsys):
    scheduler = {"type": "ReduceLROnPlateau", "args": {}, "interval": "step"}
    assert train.main(["-c", str(make_config(lr_scheduler=scheduler))]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and 'must be "epoch" for ReduceLROnPlateau' in stderr
    assert not (tmp_path / "saved").exists()


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_logged_lr_is_the_rate_the_epoch_trained_with(make_config):
    # A per-step schedule that halves the rate at every optimizer step (8 per epoch).
    scheduler = {"type": "ExponentialLR", "args": {"gamma": 0.5}, "interval": "step"}
    config = make_config(lr_scheduler=scheduler)
    result = run_main("train.py", "-c", str(config), "--run-id", "lr")
    assert result.returncode == 0, result.stderr
    run_dir = config.parent / "saved" / RUN / "lr"
    lrs = [
        torch.load(run_dir / f"checkpoint-epoch{epoch}.pth", weights_only=True)["metrics"]["lr"]
        for epoch in (1, 2)
    ]
    assert lrs == pytest.approx([0.003, 0.003 * 0.5**8])
    events = EventAccumulator(
        str(config.parent / "saved" / "log" / "Demo_CifarCNN" / "lr")
    ).Reload()
    per_step = {event.step: event.value for event in events.Scalars("train/lr")}
    # Logged every log_step (2) optimizer steps, after that step's update.
    assert per_step[2] == pytest.approx(0.003 * 0.5**2)
    assert per_step[16] == pytest.approx(0.003 * 0.5**16)
