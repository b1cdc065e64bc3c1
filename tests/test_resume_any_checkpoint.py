"""Resume from any checkpoint file a run folder holds, in the batches it was saved with or in
others (issue 31, "What users get"): in the same batch geometry the run ends bit for bit where
the uninterrupted run ended, every schedule-like state included (learning rate, EMA, Lookahead);
in another it says what changed, and the run still ends on the schedule's last rate and on
Lookahead's slow weights, its steps counted in the new batches. Hypothesis draws the checkpoint
(periodic, mid-epoch, model_best.pth, a renamed copy, a run folder) and the geometry.

Another world size is left to the tests that need torchrun (tests/test_resume_changes.py and
tests/test_distributed.py): here every run is one process, in this process (run_main)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_main, shrink
from hypothesis import given, settings
from hypothesis import strategies as st

RUN = Path("models") / "Demo_CifarCNN"
EPOCHS = 3
# The state that must continue exactly: weights, optimizer (moments, step counts, rates), the
# schedule, and the averaged and slow weights.
EXACT_KEYS = ("model", "optimizer", "lr_scheduler", "ema", "lookahead")


def config(tmp_path: Path) -> Path:
    """The shrunk demo (256 training samples, batch 32: 8 steps an epoch), 3 epochs, with every
    state that counts steps: a per-step cosine schedule with warm-up, EMA every 2 steps, and
    Lookahead every 3 with a ramp. Deterministic kernels; StopAt's trainer."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["lr_scheduler"] = {
        "type": "CosineAnnealingLR", "args": {}, "interval": "step", "warmup_epochs": 0.5,
    }  # fmt: skip
    config["trainer"].update(
        type="StopAt", epochs=EPOCHS, deterministic=True, tensorboard=False, ema_decay=0.9,
        ema_period=2, lookahead_period=3, lookahead_decay=0.8, lookahead_ramp=2,
    )  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def same(left: object, right: object) -> bool:
    """Equal tensors (bit for bit) and equal values, through nested dicts and lists."""
    if isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor):
        return left.dtype == right.dtype and torch.equal(left, right)
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        return False
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same(left[key], right[key]) for key in left)
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(map(same, left, right))
    return left == right


@pytest.fixture
def runs(tmp_path: Path, stop_at: None) -> Path:
    """Run R, trained 3 epochs uninterrupted, and run M, the same config stopped inside epoch 2
    (at step 11); copies under other names: R/kept.pth (epoch 1), M/mid.pth (the mid-epoch
    checkpoint). Returns the config."""
    path = config(tmp_path)
    runs = tmp_path / "saved" / RUN
    assert run_main("train.py", "-c", str(path), "--run-id", "R").returncode == 0
    stop = ("--set", "trainer.args.stop_at_step=11")
    assert run_main("train.py", "-c", str(path), "--run-id", "M", *stop).returncode == 143
    shutil.copy(runs / "R" / "checkpoint-epoch1.pth", runs / "R" / "kept.pth")
    shutil.copy(runs / "M" / "checkpoint-epoch2-step11.pth", runs / "M" / "mid.pth")
    return path


SOURCES = [
    "R/checkpoint-epoch1.pth", "R/checkpoint-epoch2.pth", "R/kept.pth", "R/model_best.pth",
    "M", "M/checkpoint-epoch2-step11.pth", "M/mid.pth",
]  # fmt: skip


@pytest.mark.parametrize(
    "num_examples",
    [
        pytest.param(10, id="10-examples"),
        pytest.param(100, id="100-examples", marks=pytest.mark.slow),
    ],
)
def test_a_resume_from_any_checkpoint_continues_exactly_or_says_what_changed(
    runs: Path, num_examples: int
):
    save_dir = runs.parent / "saved"
    pristine = runs.parent / "pristine"
    shutil.copytree(save_dir, pristine)
    reference = load(pristine / RUN / "R" / f"checkpoint-epoch{EPOCHS}.pth")

    @settings(max_examples=num_examples)
    @given(
        source=st.sampled_from(SOURCES),
        batch_size=st.sampled_from([32, 16, 64]),
        grad_accum_steps=st.sampled_from([1, 2]),
    )
    def check(source: str, batch_size: int, grad_accum_steps: int) -> None:
        shutil.rmtree(save_dir)
        shutil.copytree(pristine, save_dir)
        path = save_dir / RUN / source
        held = load(path) if path.is_file() else None
        if held is not None and held["epoch"] == EPOCHS:
            return  # model_best.pth of the last epoch: nothing left to train
        result = run_main(
            "train.py", "-r", str(path), "--bs", str(batch_size),
            "--set", f"trainer.grad_accum_steps={grad_accum_steps}",
        )  # fmt: skip
        log = result.stdout + result.stderr
        assert result.returncode == 0, log[-3000:]
        state = load(save_dir / RUN / source.split("/")[0] / f"checkpoint-epoch{EPOCHS}.pth")
        changed = [
            f"data_loader.args.batch_size 32 -> {batch_size}" if batch_size != 32 else None,
            f"trainer.grad_accum_steps 1 -> {grad_accum_steps}" if grad_accum_steps != 1 else None,
        ]
        changed = [words for words in changed if words is not None]
        if not changed:
            for key in EXACT_KEYS:
                assert same(state[key], reference[key]), (source, key)
            assert "in this run's batches" not in log  # nothing said to have changed
            return
        # Another geometry: said, in the warning of the resume.
        assert all(words in log for words in changed), (changed, log[-3000:])
        # The schedule ends where it ends in any geometry; the run on Lookahead's slow weights.
        end_lrs = [group["lr"] for group in state["optimizer"]["param_groups"]]
        expected = [group["lr"] for group in reference["optimizer"]["param_groups"]]
        assert end_lrs == pytest.approx(expected, abs=1e-12), (end_lrs, expected)
        for key, slow in state["lookahead"].items():
            assert torch.equal(state["model"][key], slow), key
        # EMA and Lookahead count the steps of the new batches, as the schedule does: from an
        # epoch's end, every epoch in them (inside one, the samples done round down).
        if held is not None and not held.get("resume_batch") and "step" not in path.name:
            steps_per_epoch = 256 // (batch_size * grad_accum_steps)
            assert state["global_step"] - state["step_offset"] == EPOCHS * steps_per_epoch

    check()
