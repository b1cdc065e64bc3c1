"""Speed knobs: each trains on the CPU and the loss goes down (trainer.compile: in
test_first_contact.py's run, which also checks that it compiles once); gradient accumulation
equals one big batch; fp16 with GradScaler; no host-device sync per step on CUDA."""

import json
import warnings
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_main, shrink
from torch import nn

from data_loader.data_loaders import SyntheticDataLoader
from model.loss import cross_entropy
from model.model import CifarCNN
from parse_config import ConfigParser
from trainer import Trainer
from utils import derive_seed, seed_everything
from utils.optim.optimizer import build_optimizer

KNOBS = {
    "bf16": {"trainer.amp": "bf16"},
    "fp16": {"trainer.amp": "fp16"},
    "channels_last": {"trainer.channels_last": True},
    "grad_accum": {"trainer.grad_accum_steps": 2},
    "grad_clip": {"trainer.grad_clip": 1.0},
    "cuda_flags": {"trainer.cudnn_benchmark": True, "trainer.tf32": True},  # no-ops on the CPU
    "workers": {
        "data_loader.args.num_workers": 2,
        "data_loader.args.persistent_workers": True,
        "data_loader.args.prefetch_factor": 4,
    },
}


def train_with(make_config, overrides: dict, run_id: str) -> list[dict]:
    config = make_config(
        **{
            "data_loader.args.num_train": 640,
            "trainer.epochs": 3,
            "trainer.tensorboard": False,
            **overrides,
        }
    )
    result = run_main("train.py", "-c", str(config), "--run-id", run_id)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = config.parent / "saved" / "models" / "Demo_CifarCNN" / run_id
    return [
        torch.load(run_dir / f"checkpoint-epoch{epoch}.pth", weights_only=True) for epoch in (1, 3)
    ]


@pytest.mark.parametrize("knob", KNOBS)
def test_each_knob_trains_and_the_loss_goes_down(make_config, knob: str) -> None:
    first, last = train_with(make_config, KNOBS[knob], knob)
    assert last["metrics"]["train/loss"] < first["metrics"]["train/loss"] - 0.05
    assert 0 <= last["metrics"]["time/data_wait_fraction"] <= 1
    if knob == "fp16":
        # The GradScaler's state travels with the checkpoint.
        assert last["grad_scaler"]["scale"] > 0
    if knob == "grad_accum":
        assert last["global_step"] == 3 * 8  # 512 samples: 16 batches per epoch, a step per 2


def make_trainer(
    tmp_path: Path,
    *,
    batch_size: int,
    accumulate: int,
    model: nn.Module,
    device: torch.device = torch.device("cpu"),  # noqa: B008
) -> Trainer:
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["data_loader"]["args"].update(
        batch_size=batch_size, shuffle=False, validation_split=0.0, num_train=128
    )
    config["trainer"].update(
        grad_accum_steps=accumulate, len_epoch=accumulate, monitor="off", tensorboard=False
    )
    config["lr_scheduler"] = None
    parser = ConfigParser(config, source="test")
    data = SyntheticDataLoader(**{**config["data_loader"]["args"], "seed": 0})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return Trainer(model, cross_entropy, {}, optimizer, config=parser, device=device, data=data)


def test_accumulating_k_batches_equals_one_batch_k_times_larger(tmp_path: Path) -> None:
    # No BatchNorm: its batch statistics would differ between 4 x 16 and 1 x 64 by design.
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    small = make_trainer(tmp_path / "a", batch_size=16, accumulate=4, model=reference)
    large_model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    large_model.load_state_dict(reference.state_dict())
    large = make_trainer(tmp_path / "b", batch_size=64, accumulate=1, model=large_model)
    for trainer in (small, large):
        seed_everything(derive_seed(0, 1, 0))  # what BaseTrainer does at the start of an epoch
        trainer.train_epoch(1)
    assert small.global_step == large.global_step == 1
    for accumulated, single in zip(reference.parameters(), large_model.parameters(), strict=True):
        torch.testing.assert_close(accumulated, single, rtol=1e-5, atol=1e-6)
    # And it did move: the comparison is not between two untouched models.
    assert not torch.equal(reference[1].bias, torch.zeros(10))


def synchronizing_calls(trainer: Trainer) -> list[str]:
    """The synchronizing CUDA calls one train_epoch makes, as torch's sync debug mode reports
    them (as warnings, so that all of them are counted rather than the first one raising), each
    with the line of Python that made it, so that a failure says where they are."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train_epoch(1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [
        f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "synchroniz" in str(w.message)
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_host_device_sync_between_log_intervals(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10)).cuda()
    device = torch.device("cuda")  # the trainer moves the model to its device
    trainer = make_trainer(tmp_path, batch_size=16, accumulate=1, model=model, device=device)
    trainer.len_epoch = trainer.log_step = 8  # one read, at the last step
    trainer.train_epoch(1)  # warm-up: lazy initialisation may sync once, as in the fp16 test
    syncs = synchronizing_calls(trainer)
    assert len(syncs) <= 3, syncs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fused", [True, False])
def test_fp16_steps_without_a_sync_only_with_a_fused_optimizer(tmp_path: Path, fused: bool) -> None:
    """GradScaler.step reads its inf check on the host unless the optimizer takes it as a device
    tensor, which the fused Adam does: build_optimizer picks it on CUDA."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["data_loader"]["args"].update(validation_split=0.0, num_train=256)
    config["trainer"].update(amp="fp16", len_epoch=8, log_step=8, tensorboard=False, monitor="off")
    if not fused:
        config["optimizer"]["args"]["fused"] = False
    parser = ConfigParser(config, source="test")
    device = torch.device("cuda")
    model = CifarCNN(**config["arch"]["args"]).to(device)
    optimizer = build_optimizer(parser, model, device)
    assert optimizer.defaults["fused"] is fused
    data = SyntheticDataLoader(**{**config["data_loader"]["args"], "seed": 0})
    trainer = Trainer(model, cross_entropy, {}, optimizer, config=parser, device=device, data=data)
    assert trainer.scaler.is_enabled()
    trainer.train_epoch(1)  # warm-up: lazy initialisation may sync once
    syncs = synchronizing_calls(trainer)
    if fused:
        assert len(syncs) <= 3, syncs  # the log_step read and the epoch's end
    else:
        assert len(syncs) >= 8, syncs  # GradScaler.step: one per step
