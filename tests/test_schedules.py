"""The learning rate of every optimizer step of a real run (BaseTrainer's loop) against torch's
own schedulers run by hand, with gradient accumulation and its short last group, per step and
per epoch, with warmup; the weight average updated once per optimizer step; schedule lengths
and ReduceLROnPlateau's mode from config; skipped steps (non-finite losses, GradScaler's) and
clipping."""

import itertools
import json
import logging
import math
import types
import warnings
from pathlib import Path

import pytest
import torch
from conftest import NUM_EXAMPLES, ROOT, shrink
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.optim import lr_scheduler as schedulers

import train
from build import build_trainer
from logger import Loggers
from parse_config import ConfigParser
from utils import UserError
from utils.distributed.process_group import ProcessInfo
from utils.optim.schedule import build_scheduler, schedule_signature, step_scheduler
from utils.state.optimizer_state import restore_schedule, schedule_position
from utils.state.training_state import TrainingState

# Schedules whose length the run sets (left out of args), and where each one ends: at 0.
SCHEDULES = {
    "CosineAnnealingLR": {},
    "PolynomialLR": {"power": 1.0},
    "LinearLR": {"start_factor": 1.0, "end_factor": 0.0},
}
LENGTH = {"CosineAnnealingLR": "T_max", "PolynomialLR": "total_iters", "LinearLR": "total_iters"}


def tiny_run(save_dir: Path, *, num_batches: int, schedule: dict, **trainer: object) -> dict:
    """The shrunk demo with batches of 4 samples, `num_batches` of them an epoch, and a tiny
    network: a run of a few optimizer steps in a fraction of a second."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), save_dir)
    config["data_loader"]["args"].update(
        num_train=4 * num_batches + 4, num_test=4, batch_size=4, validation_split=4
    )
    config["arch"]["args"]["widths"] = [4, 4]
    config["trainer"].update(tensorboard=False, save_period=1000, **trainer)
    config["lr_scheduler"] = schedule
    return config


def by_hand(
    name: str, args: dict, *, num_steps: int, warmup: int, start_factor: float, lr: float
) -> tuple[list[float], float]:
    """(the rate of each of num_steps steps, the rate after them) of torch's `name` over
    num_steps - warmup steps after `warmup` steps of LinearLR, on one parameter."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    main = getattr(schedulers, name)(optimizer, **{**args, LENGTH[name]: num_steps - warmup})
    scheduler = main
    if warmup:
        start = schedulers.LinearLR(optimizer, start_factor=start_factor, total_iters=warmup)
        scheduler = schedulers.SequentialLR(optimizer, [start, main], milestones=[warmup])
    rates = []
    for _ in range(num_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates, optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_every_step_takes_the_rate_of_the_schedule_run_by_hand(num_examples, tmp_path):
    """Whatever the epoch's batches, accumulation (a last group maybe short), epochs, interval
    and warmup: an optimizer step per accumulation group, each at the rate torch's schedulers
    give when stepped by hand (per step, or per epoch and then the same all epoch long), the
    schedule ending exactly with the run, and the average updated once per optimizer step."""

    @settings(max_examples=num_examples, deadline=None)
    @given(
        name=st.sampled_from(sorted(SCHEDULES)),
        num_batches=st.integers(1, 7),
        accumulate=st.integers(1, 4),
        epochs=st.integers(1, 3),
        per_step=st.booleans(),
        warmup=st.integers(0, 3),
    )
    def check(
        name: str, num_batches: int, accumulate: int, epochs: int, per_step: bool, warmup: int
    ) -> None:
        steps_per_epoch = math.ceil(num_batches / accumulate)
        length = epochs * steps_per_epoch if per_step else epochs
        warmup = min(warmup, length - 1)  # a warmup as long as the run is refused
        schedule = {
            "type": name, "args": SCHEDULES[name], "interval": "step" if per_step else "epoch",
            "warmup_steps" if per_step else "warmup_epochs": warmup, "warmup_start_factor": 0.1,
        }  # fmt: skip
        save_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        config = ConfigParser(
            tiny_run(
                save_dir,
                num_batches=num_batches,
                schedule=schedule,
                epochs=epochs,
                grad_accum_steps=accumulate,
                ema_decay=0.5,
            ),
            source="t.json",
        )
        Path(config.checkpoint_dir).mkdir(parents=True)  # train.py's main() makes it
        trainer = build_trainer(config, ProcessInfo(), torch.device("cpu"), logging.getLogger("t"))
        rates: list[float] = []
        trainer.optimizer.register_step_pre_hook(
            lambda optimizer, args, kwargs: rates.append(optimizer.param_groups[0]["lr"])
        )
        trainer.fit()
        lr = config["optimizer"]["args"]["lr"]
        expected, end = by_hand(
            name, SCHEDULES[name], num_steps=length, warmup=warmup, start_factor=0.1, lr=lr
        )
        if not per_step:  # a rate for each epoch, for each of its optimizer steps
            expected = [rate for rate in expected for _ in range(steps_per_epoch)]
        assert rates == pytest.approx(expected, rel=1e-12, abs=1e-15)
        assert all(rate > 0 for rate in rates)  # the schedule does not end before the run
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(end, abs=1e-15) == 0
        assert int(trainer.ema.n_averaged) == epochs * steps_per_epoch == len(rates)

    check()


class Recorded(logging.Handler):
    """The messages of the records a logger emits."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_a_length_in_args_that_disagrees_with_the_run_is_refused_or_warned(num_examples, tmp_path):
    """A schedule length given in lr_scheduler.args: silent only when it is the run's (after the
    warmup); shorter, refused for OneCycleLR and warned for the others; longer, warned (the run
    ends before the learning rate comes down)."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path)

    @settings(max_examples=num_examples, deadline=None)
    @given(
        name=st.sampled_from([*SCHEDULES, "OneCycleLR"]),
        given_length=st.integers(1, 40),
        epochs=st.integers(1, 4),
        steps_per_epoch=st.integers(1, 5),
        per_step=st.booleans(),
        warmup=st.integers(0, 2),
    )
    def check(
        name: str, given_length: int, epochs: int, steps_per_epoch: int, per_step: bool,
        warmup: int,
    ) -> None:  # fmt: skip
        run = epochs * steps_per_epoch if per_step else epochs
        warmup = min(warmup, run - 1)
        length_arg = {**LENGTH, "OneCycleLR": "total_steps"}[name]
        args = {**SCHEDULES.get(name, {"max_lr": 0.1}), length_arg: given_length}
        config["lr_scheduler"] = {
            "type": name, "args": args, "interval": "step" if per_step else "epoch",
            "warmup_steps" if per_step else "warmup_epochs": warmup,
        }  # fmt: skip
        config["trainer"]["epochs"] = epochs
        parsed = ConfigParser(config, source="t.json")
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        logger, recorded = logging.Logger("schedule"), Recorded()
        logger.addHandler(recorded)
        needed = run - warmup
        if name == "OneCycleLR" and given_length < needed:
            with pytest.raises(UserError, match=r"OneCycleLR's length .* is shorter than the run"):
                build_scheduler(parsed, optimizer, steps_per_epoch, logger=logger)
            return
        build_scheduler(parsed, optimizer, steps_per_epoch, logger=logger)
        unit = "optimizer steps" if per_step else "epochs"
        said = f"{name} ends after {given_length} {unit}, the run has {needed}"
        assert [said in message for message in recorded.messages] == [True] * (
            given_length != needed
        )

    check()


def test_one_cycle_given_the_loaders_batches_under_accumulation_is_warned(tmp_path):
    """OneCycleLR's epochs x steps_per_epoch copied from the loader's 8 batches while 2 of them
    make an optimizer step: 24 steps for a run of 12, the rate left halfway up its cycle."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path)
    config["trainer"].update(epochs=3, grad_accum_steps=2)
    config["lr_scheduler"] = {
        "type": "OneCycleLR", "interval": "step",
        "args": {"max_lr": 0.1, "epochs": 3, "steps_per_epoch": 8},
    }  # fmt: skip
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    logger, recorded = logging.Logger("schedule"), Recorded()
    logger.addHandler(recorded)
    build_scheduler(ConfigParser(config, source="t.json"), optimizer, 4, logger=logger)
    (message,) = recorded.messages
    assert "OneCycleLR ends after 24 optimizer steps, the run has 12" in message
    assert "the run ends before the schedule does" in message


def trainer_scaling_losses(config: ConfigParser, factors: dict[int, float]) -> object:
    """The config's trainer (its run folder made), the loss of its training batch i (counted
    over the whole run) multiplied by factors[i]."""
    Path(config.checkpoint_dir).mkdir(parents=True)
    trainer = build_trainer(config, ProcessInfo(), torch.device("cpu"), logging.getLogger("t"))
    real_step, batch_index = trainer.training_step, itertools.count()

    def training_step(batch: object) -> object:
        result = real_step(batch)
        result.loss = result.loss * factors.get(next(batch_index), 1.0)
        return result

    trainer.training_step = training_step
    return trainer


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_a_skipped_batch_that_ends_its_group_takes_no_step_and_the_schedule_waits(
    num_examples, tmp_path
):
    """trainer.nonfinite "skip": every batch with a non-finite loss is counted; an accumulation
    group whose last batch was dropped takes no optimizer step, and then neither the per-step
    schedule, global_step nor the average moves: the rates are the schedule's, in order, one
    per step taken."""

    @settings(max_examples=num_examples, deadline=None)
    @given(
        num_batches=st.integers(1, 6),
        accumulate=st.integers(1, 3),
        nonfinite=st.sets(st.integers(0, 11), max_size=4),  # batch indices of the whole run
    )
    def check(num_batches: int, accumulate: int, nonfinite: set[int]) -> None:
        epochs, steps_per_epoch = 2, math.ceil(num_batches / accumulate)
        schedule = {"type": "CosineAnnealingLR", "args": {}, "interval": "step"}
        save_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        config = ConfigParser(
            tiny_run(
                save_dir, num_batches=num_batches, schedule=schedule, epochs=epochs,
                grad_accum_steps=accumulate, ema_decay=0.5, nonfinite="skip",
                max_skipped_steps=12,
            ),
            source="t.json",
        )  # fmt: skip
        trainer = trainer_scaling_losses(config, dict.fromkeys(nonfinite, float("nan")))
        rates: list[float] = []
        trainer.optimizer.register_step_pre_hook(
            lambda optimizer, args, kwargs: rates.append(optimizer.param_groups[0]["lr"])
        )
        trainer.fit()
        dropped = {index for index in nonfinite if index < epochs * num_batches}
        # A group steps unless its last batch was dropped (groups count from each epoch's start).
        group_ends = [
            epoch * num_batches + min(start + accumulate, num_batches) - 1
            for epoch in range(epochs)
            for start in range(0, num_batches, accumulate)
        ]
        num_steps = sum(end not in dropped for end in group_ends)
        lr = config["optimizer"]["args"]["lr"]
        expected, _ = by_hand(
            "CosineAnnealingLR", {}, num_steps=epochs * steps_per_epoch, warmup=0,
            start_factor=1.0, lr=lr,
        )  # fmt: skip
        assert trainer.state.num_skipped_steps == len(dropped)
        assert rates == pytest.approx(expected[:num_steps], rel=1e-12, abs=1e-15)
        assert trainer.global_step == trainer.lr_scheduler.last_epoch == num_steps
        assert int(trainer.ema.n_averaged) == num_steps
        assert all(torch.isfinite(param).all() for param in trainer.model.parameters())

    check()


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_an_epoch_schedule_follows_the_epochs_also_one_whose_batches_were_all_skipped(
    num_examples, tmp_path
):
    """trainer.nonfinite "skip" with interval "epoch": the schedule steps at every epoch's end,
    also after an epoch that took no optimizer step (its batches all dropped), without torch's
    "lr_scheduler.step() before optimizer.step()" warning; each step taken has the rate torch's
    scheduler gives for its epoch, and a resume, which steps a rebuilt schedule to the epochs
    done, stands where the uninterrupted run's schedule stands."""

    @settings(max_examples=num_examples, deadline=None)
    @given(
        num_batches=st.integers(1, 3),
        skipped_epochs=st.sets(st.integers(0, 2), min_size=1, max_size=2),
        warmup=st.integers(0, 1),
    )
    def check(num_batches: int, skipped_epochs: set[int], warmup: int) -> None:
        epochs = 3
        schedule = {
            "type": "CosineAnnealingLR", "args": {}, "interval": "epoch",
            "warmup_epochs": warmup, "warmup_start_factor": 0.1,
        }  # fmt: skip
        save_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        config = ConfigParser(
            tiny_run(
                save_dir, num_batches=num_batches, schedule=schedule, epochs=epochs,
                nonfinite="skip", max_skipped_steps=12,
            ),
            source="t.json",
        )  # fmt: skip
        nan = {
            e * num_batches + b: float("nan") for e in skipped_epochs for b in range(num_batches)
        }
        trainer = trainer_scaling_losses(config, nan)
        rates: list[float] = []
        trainer.optimizer.register_step_pre_hook(
            lambda optimizer, args, kwargs: rates.append(optimizer.param_groups[0]["lr"])
        )
        with warnings.catch_warnings():
            # The warning this test is about (torch 2.6's SequentialLR warns of its own
            # step(epoch) call, which is not).
            warnings.filterwarnings("error", r"Detected call of `lr_scheduler.step\(\)` before")
            trainer.fit()
        lr = config["optimizer"]["args"]["lr"]
        expected, end = by_hand(
            "CosineAnnealingLR", {}, num_steps=epochs, warmup=warmup, start_factor=0.1, lr=lr
        )
        taken = [e for e in range(epochs) if e not in skipped_epochs for _ in range(num_batches)]
        assert rates == pytest.approx([expected[e] for e in taken], rel=1e-12, abs=1e-15)
        assert trainer.lr_scheduler.last_epoch == epochs == schedule_position(trainer)
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(end, abs=1e-15)

    check()


def test_every_log_step_row_is_logged_whichever_batches_are_skipped(tmp_path, monkeypatch):
    """trainer.nonfinite "skip": the train/step_loss rows are a function of the steps alone, a
    row at every log_step-th batch and at each epoch's last, skipped batches or not. A row is
    the mean of the interval's finite losses, NaN where every batch of it was skipped (no
    sample to average); its step never goes back, nor past the next step taken."""

    @settings(max_examples=15, deadline=None)
    @given(
        num_batches=st.integers(1, 6),
        log_step=st.integers(1, 4),
        accumulate=st.integers(1, 3),
        nonfinite=st.sets(st.integers(0, 11), max_size=6),  # batch indices of the whole run
    )
    def check(num_batches: int, log_step: int, accumulate: int, nonfinite: set[int]) -> None:
        epochs = 2
        save_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        config = ConfigParser(
            tiny_run(
                save_dir, num_batches=num_batches, schedule=None, epochs=epochs,
                grad_accum_steps=accumulate, nonfinite="skip", max_skipped_steps=12,
                log_step=log_step,
            ),
            source="t.json",
        )  # fmt: skip
        trainer = trainer_scaling_losses(config, dict.fromkeys(nonfinite, float("nan")))
        losses: list[float] = []  # every training batch's loss, in order
        scaled_step = trainer.training_step

        def training_step(batch: object) -> object:
            result = scaled_step(batch)
            losses.append(float(result.loss.detach()))
            return result

        rows: list[dict] = []
        monkeypatch.setattr(trainer, "training_step", training_step)
        monkeypatch.setattr(
            Loggers,
            "log_step",
            lambda self, values, *, step, epoch, batch: rows.append(
                {"epoch": epoch, "batch": batch, "step": step, **values}
            ),
        )
        trainer.fit()
        due = [
            (epoch, batch)
            for epoch in range(1, epochs + 1)
            for batch in range(1, num_batches + 1)
            if batch % log_step == 0 or batch == num_batches
        ]
        assert [(row["epoch"], row["batch"]) for row in rows] == due
        previous = 0
        for epoch, batch in due:
            # The interval's batches, as indices of the whole run.
            start = (epoch - 1) * num_batches
            interval = losses[start + previous : start + batch]
            previous = 0 if batch == num_batches else batch
            finite = [loss for loss in interval if math.isfinite(loss)]
            row = rows[due.index((epoch, batch))]
            if finite:
                assert row["train/step_loss"] == pytest.approx(sum(finite) / len(finite))
            else:
                assert math.isnan(row["train/step_loss"])
        steps = [row["step"] for row in rows]
        assert steps == sorted(steps) and steps[-1] <= trainer.global_step + 1

    check()


def test_a_log_step_row_whose_batches_were_all_skipped_is_nan(tmp_path, monkeypatch):
    """The exact case: log_step 1, the second batch's loss NaN: its row is there, NaN, at the
    step the next group makes (before: missing, and the epoch's last row too)."""
    config = ConfigParser(
        tiny_run(tmp_path, num_batches=3, schedule=None, epochs=1, nonfinite="skip", log_step=1),
        source="t.json",
    )
    trainer = trainer_scaling_losses(config, {1: float("nan"), 2: float("nan")})
    rows: list[tuple[int, int, float]] = []
    monkeypatch.setattr(
        Loggers,
        "log_step",
        lambda self, values, *, step, epoch, batch: rows.append(
            (batch, step, values["train/step_loss"])
        ),
    )
    trainer.fit()
    assert [(batch, step) for batch, step, _ in rows] == [(1, 1), (2, 2), (3, 2)]
    assert math.isfinite(rows[0][2]) and math.isnan(rows[1][2]) and math.isnan(rows[2][2])


def test_a_step_grad_scaler_skips_moves_the_schedule_on_and_is_not_counted(tmp_path):
    """fp16: a step whose gradients overflow is skipped by GradScaler (its scale halves); as in
    torch's AMP recipe the schedule, global_step and the average move on, and it is no
    non-finite loss (not counted), as docs/config.md says."""
    schedule = {"type": "CosineAnnealingLR", "args": {}, "interval": "step"}
    config = ConfigParser(
        tiny_run(tmp_path, num_batches=4, schedule=schedule, epochs=1, amp="fp16",
                 ema_decay=0.5, grad_clip=1.0),
        source="t.json",
    )  # fmt: skip
    trainer = trainer_scaling_losses(config, {1: 1e35})  # finite; its scaled gradients overflow
    taken: list[int] = []
    trainer.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: taken.append(1))
    trainer.fit()
    # Each skip halves the scale from 2**16 (4 steps are too few for it to grow): ours, and any
    # the initial scale itself overflowed.
    num_skipped = round(math.log2(2.0**16 / trainer.scaler.get_scale()))
    assert num_skipped >= 1 and len(taken) == 4 - num_skipped
    assert trainer.global_step == trainer.lr_scheduler.last_epoch == 4
    assert int(trainer.ema.n_averaged) == 4 and trainer.state.num_skipped_steps == 0


# Every kind of positional schedule, with args that need no run length (those that do get it
# from the run), each ending within a few steps.
RESUMABLE = {
    "CosineAnnealingLR": {},
    "LinearLR": {"start_factor": 1.0, "end_factor": 0.0},
    "PolynomialLR": {"power": 2.0},
    "OneCycleLR": {"max_lr": 0.05},
    "StepLR": {"step_size": 2, "gamma": 0.5},
    "MultiStepLR": {"milestones": [1, 3], "gamma": 0.5},
    "ExponentialLR": {"gamma": 0.8},
    "CyclicLR": {"base_lr": 0.001, "max_lr": 0.01, "step_size_up": 2},
    "CosineAnnealingWarmRestarts": {"T_0": 2},
}


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_a_schedule_resumed_at_any_step_goes_on_as_the_uninterrupted_one(num_examples, tmp_path):
    """Any schedule the config offers, per step or per epoch, with or without warmup: stopped
    after any number of its steps and resumed (its state restored, or rebuilt from the config
    and stepped to where the run stands, as restore_schedule does), every later rate equals
    the uninterrupted schedule's, in every parameter group."""

    @settings(max_examples=num_examples, deadline=None)
    @given(
        name=st.sampled_from(sorted(RESUMABLE)),
        per_step=st.booleans(),
        steps_per_epoch=st.integers(1, 3),
        warmup=st.integers(0, 2),
        resume_at=st.integers(0, 6),
        exact=st.booleans(),
    )
    def check(
        name: str, per_step: bool, steps_per_epoch: int, warmup: int, resume_at: int, exact: bool
    ) -> None:
        epochs = 3
        length = epochs * steps_per_epoch if per_step else epochs
        warmup, resume_at = min(warmup, length - 1), min(resume_at, length - 1)
        schedule = {
            "type": name, "args": RESUMABLE[name], "interval": "step" if per_step else "epoch",
            "warmup_steps" if per_step else "warmup_epochs": warmup, "warmup_start_factor": 0.1,
        }  # fmt: skip
        config = ConfigParser(
            tiny_run(tmp_path, num_batches=steps_per_epoch, schedule=schedule, epochs=epochs),
            source="t.json",
        )

        def new_optimizer() -> torch.optim.Optimizer:
            groups = [{"params": [torch.zeros(1)]}, {"params": [torch.zeros(1)], "lr": 0.02}]
            return torch.optim.SGD(groups, lr=0.01, momentum=0.9)  # CyclicLR cycles momentum

        def rates(optimizer: torch.optim.Optimizer, scheduler: object, num_steps: int) -> list:
            seen = []
            for _ in range(num_steps):
                seen.extend(group["lr"] for group in optimizer.param_groups)
                optimizer.step()
                scheduler.step()  # after each optimizer step, or each epoch of them
            return seen

        optimizer = new_optimizer()
        scheduler = build_scheduler(config, optimizer, steps_per_epoch)
        signature = schedule_signature(config, optimizer, steps_per_epoch)
        whole = rates(optimizer, scheduler, length)

        optimizer = new_optimizer()
        scheduler = build_scheduler(config, optimizer, steps_per_epoch)
        before = rates(optimizer, scheduler, resume_at)
        saved = {"schedule": signature, "lr_scheduler": scheduler.state_dict()}
        optimizer_state = optimizer.state_dict()
        # The resumed run, in the trainer's order: a new optimizer and schedule, then the
        # checkpoint's optimizer hyperparameters (exact; else the config's: the schedule is
        # rebuilt), then the schedule's state.
        optimizer = new_optimizer()
        scheduler = build_scheduler(config, optimizer, steps_per_epoch)
        if exact:
            optimizer.load_state_dict(optimizer_state)
        trainer = types.SimpleNamespace(
            lr_scheduler=scheduler,
            logger=logging.getLogger("t"), config=config, optimizer=optimizer, epochs=epochs,
            steps_per_epoch=steps_per_epoch, lr_scale=1.0, step_per_batch=per_step,
            schedule_signature=schedule_signature(config, optimizer, steps_per_epoch),
            state=TrainingState(
                epoch=resume_at // steps_per_epoch if per_step else resume_at,
                global_step=resume_at if per_step else resume_at * steps_per_epoch,
            ),
            start_epoch=(resume_at // steps_per_epoch if per_step else resume_at) + 1,
        )  # fmt: skip
        restore_schedule(trainer, saved, {}, hyperparameters_restored=exact)
        after = rates(optimizer, trainer.lr_scheduler, length - resume_at)
        assert before + after == pytest.approx(whole, rel=1e-12, abs=1e-15)

    check()


@pytest.mark.parametrize("name", schedulers.__all__)
def test_every_torch_schedule_builds_from_a_config_or_is_refused_in_one_line(name, tmp_path):
    """Each lr_scheduler.type torch offers, its required args filled in where a config can give
    them: it builds, or it is refused in one line naming lr_scheduler.type (never a traceback,
    nor a hint to add an argument a JSON config cannot hold: schedulers or a function)."""
    required = {
        "StepLR": {"step_size": 2}, "MultiStepLR": {"milestones": [1]},
        "OneCycleLR": {"max_lr": 0.1}, "CyclicLR": {"base_lr": 0.01, "max_lr": 0.1},
        "CosineAnnealingWarmRestarts": {"T_0": 2}, "ExponentialLR": {"gamma": 0.9},
    }  # fmt: skip
    schedule = {"type": name, "args": required.get(name, {})}
    config = ConfigParser(tiny_run(tmp_path, num_batches=2, schedule=schedule), source="t.json")
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
    try:
        built = build_scheduler(config, optimizer, steps_per_epoch=2)
    except UserError as error:
        assert str(error).startswith("t.json: lr_scheduler.type: ") and "\n" not in str(error)
        assert name in {"LRScheduler", "SequentialLR", "ChainedScheduler", "LambdaLR",
                        "MultiplicativeLR"}  # fmt: skip
        return
    assert isinstance(built, schedulers.LRScheduler | schedulers.ReduceLROnPlateau)
    step_scheduler(built, {"val/loss": 1.0}, "", per_batch=False)


@pytest.mark.parametrize("schedule", ["OneCycleLR", "CyclicLR"])
@pytest.mark.parametrize(
    ("main", "other"),
    [("SGD", "Muon"), ("AdamW", "Muon"), ("SGD", "Adam"), ("Adam", "SGD"), ("AdamW", "Adam"),
     ("SGD", "RMSprop")],
)  # fmt: skip
def test_a_cycled_momentum_reaches_every_group_or_is_refused_in_one_line(
    schedule, main, other, tmp_path
):
    """OneCycleLR and CyclicLR cycle the momentum (cycle_momentum, on by default) under the key
    of optimizer.type's algorithm, "momentum" or "betas". A group stepped by another algorithm
    (optimizer.param_groups[].optimizer) that lacks that key is refused in one line (before: a
    KeyError traceback, or a key its algorithm ignores set silently); else every group starts
    at the cycle's momentum under its own key, and with cycle_momentum false any mix builds."""
    if other == "Muon" and not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon came with torch 2.9")
    from utils.optim.optimizer import build_optimizer

    args = {"OneCycleLR": {"max_lr": 0.1}, "CyclicLR": {"base_lr": 0.01, "max_lr": 0.1}}[schedule]
    config = tiny_run(tmp_path, num_batches=2, schedule=None)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    config["optimizer"] = {
        "type": main, "args": {"lr": 0.01, **({"momentum": 0.5} if main == "SGD" else {})},
        "param_groups": [{"params": "1", "kind": "matrix", "optimizer": other, "lr": 0.02,
                          **({"momentum": 0.5} if other in ("SGD", "RMSprop") else {})}],
    }  # fmt: skip
    for cycle in (True, False):
        config["lr_scheduler"] = {
            "type": schedule,
            "args": {**args, "cycle_momentum": cycle},
            "interval": "step",
        }
        parsed = ConfigParser(config, source="t.json")
        optimizer = build_optimizer(parsed, model, torch.device("cpu"))
        key = "betas" if "betas" in optimizer.defaults else "momentum"
        if cycle and any(key not in group for group in optimizer.param_groups):
            with pytest.raises(UserError) as refused:
                build_scheduler(parsed, optimizer, steps_per_epoch=2)
            assert str(refused.value).startswith("t.json: lr_scheduler.args.cycle_momentum: ")
            assert "\n" not in str(refused.value)
            continue
        build_scheduler(parsed, optimizer, steps_per_epoch=2)
        for group in optimizer.param_groups:
            if cycle:
                momentum = group["betas"][0] if key == "betas" else group["momentum"]
                assert momentum == group["max_momentum"]  # both cycles start at their top
            else:
                assert "max_momentum" not in group


PLATEAU = {"type": "ReduceLROnPlateau", "args": {"patience": 1, "factor": 0.5}}


@pytest.mark.parametrize("monitor", ["max val/accuracy", "min val/loss", "off"])
@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_reduce_on_plateau_follows_the_monitored_metric_as_torch_does(
    num_examples, monitor, tmp_path
):
    """ReduceLROnPlateau over any sequence of epoch metrics: the rates of torch's, built by hand
    in the monitor's mode ("off": the loss, "min"), given the metric step_scheduler picks."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path)
    config["trainer"]["monitor"], config["lr_scheduler"] = monitor, PLATEAU
    parsed = ConfigParser(config, source="t.json")
    mode = "min" if monitor == "off" else monitor.split()[0]

    @settings(max_examples=num_examples, deadline=None)
    @given(st.lists(st.floats(0, 1), min_size=1, max_size=8))
    def check(values: list[float]) -> None:
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        scheduler = build_scheduler(parsed, optimizer, 4)
        by_hand = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        reference = schedulers.ReduceLROnPlateau(by_hand, mode=mode, **PLATEAU["args"])
        for value in values:
            metrics = {"val/accuracy": value, "val/loss": value, "train/loss": value}
            step_scheduler(scheduler, metrics, parsed.monitor_key, per_batch=False)
            reference.step(value)
            assert optimizer.param_groups[0]["lr"] == by_hand.param_groups[0]["lr"]

    check()


def test_a_rising_accuracy_keeps_the_rate_and_a_contradicting_mode_is_refused(tmp_path):
    """monitor "max val/accuracy": an accuracy that rises every epoch never cuts the rate (torch's
    default mode "min" cut it after `patience` epochs); "mode": "min" in args is refused."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path)
    config["trainer"]["monitor"], config["lr_scheduler"] = "max val/accuracy", PLATEAU
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler = build_scheduler(ConfigParser(config, source="t.json"), optimizer, 4)
    for accuracy in (0.2, 0.4, 0.6, 0.8):
        step_scheduler(scheduler, {"val/accuracy": accuracy}, "val/accuracy", per_batch=False)
    assert optimizer.param_groups[0]["lr"] == 0.1
    config["lr_scheduler"] = {**PLATEAU, "args": {**PLATEAU["args"], "mode": "min"}}
    with pytest.raises(UserError, match=r'^t\.json: lr_scheduler\.args\.mode: "min", but .*"max"'):
        build_scheduler(ConfigParser(config, source="t.json"), optimizer, 4)


@pytest.mark.parametrize("value", [0, -3, 0.5, "10", True])
@pytest.mark.parametrize("schedule", ["CosineAnnealingLR", "PolynomialLR", "LinearLR"])
def test_a_length_below_one_is_refused_in_one_line_before_the_run_starts(
    schedule, value, tmp_path, capsys
):
    """T_max 0 made CosineAnnealingLR divide by zero at its first step, a traceback after the
    run folder was made; any length in args that is not a number >= 1 is one line, exit 2."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"]["tensorboard"] = False
    config["lr_scheduler"] = {"type": schedule, "args": {LENGTH[schedule]: value}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert train.main(["-c", str(path), "--run-id", "run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"lr_scheduler.args.{LENGTH[schedule]}: must be at least 1" in err
    assert not list((tmp_path / "saved").glob("models/*/run"))


@pytest.mark.parametrize("amp", [None, "fp16"])
def test_clipping_bounds_the_true_accumulated_gradient(amp, tmp_path):
    """grad_clip with accumulation (a short last group too) and fp16's GradScaler: each step
    sees the group's gradient, unscaled, at norm min(its norm, grad_clip): clipped after
    unscaling (not the scaled gradient, which would leave it 2**16 times too small)."""
    config = ConfigParser(
        tiny_run(tmp_path, num_batches=5, schedule=None, epochs=1, amp=amp,
                 grad_accum_steps=2, grad_clip=1e-3),  # far below the norms
        source="t.json",
    )  # fmt: skip
    Path(config.checkpoint_dir).mkdir(parents=True)
    trainer = build_trainer(config, ProcessInfo(), torch.device("cpu"), logging.getLogger("t"))
    norms: list[float] = []
    trainer.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: norms.append(
            float(torch.stack([p.grad.norm() for p in trainer.model.parameters()]).norm())
        )
    )
    trainer.fit()
    # Groups of 2, 2 and 1 batches; under fp16 GradScaler may skip a step (overflow).
    assert len(norms) == 3 or (amp and norms)
    assert norms == pytest.approx([1e-3] * len(norms), rel=1e-4)


@pytest.mark.parametrize("ema_period", [3, 4])
def test_an_ema_period_longer_than_the_run_is_warned(ema_period, tmp_path, caplog):
    """3 optimizer steps (5 batches in groups of 2): an ema_period of 4 never updates the
    average, which stays the initial weights; it is said. 3 updates it once, silently."""
    config = ConfigParser(
        tiny_run(tmp_path, num_batches=5, schedule=None, epochs=1, grad_accum_steps=2,
                 ema_decay=0.9, ema_period=ema_period),
        source="t.json",
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="train"):
        trainer = build_trainer(config, ProcessInfo(), torch.device("cpu"), logging.getLogger("t"))
    said = "trainer.ema_period: 4 optimizer steps, the run has 3: the average is never updated"
    assert [said in record.getMessage() for record in caplog.records] == [True] * (ema_period == 4)
    Path(config.checkpoint_dir).mkdir(parents=True)
    trainer.fit()
    assert int(trainer.ema.n_averaged) == (ema_period == 3)


def test_a_lookahead_period_longer_than_the_run_is_warned(tmp_path, capsys):
    """Lookahead with no synchronisation before the run's end ends it mostly on the initial
    weights (the slow weights move once): said, with both numbers. A period of the run's
    length, silent."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update(tensorboard=False, epochs=1, lookahead_period=9)  # 8 steps
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    said = "trainer.lookahead_period: 9 optimizer steps, the run has 8: the slow weights move once"
    assert train.main(["-c", str(path), "--run-id", "long"]) == 0
    assert said in capsys.readouterr().out
    fits = ["--set", "trainer.lookahead_period=8"]
    assert train.main(["-c", str(path), "--run-id", "fits", *fits]) == 0
    assert "trainer.lookahead_period" not in capsys.readouterr().out


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_reference_batch_size_scales_every_rate_of_a_schedule_that_sets_its_own(
    num_examples, tmp_path
):
    """OneCycleLR and CyclicLR set the learning rate themselves (max_lr; base_lr and max_lr):
    under reference_batch_size's factor the rate of every step is that factor x the rate the
    unscaled schedule gives, for one rate or one per parameter group."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path)

    def rates(schedule: dict, num_groups: int, lr_scale: float) -> list[list[float]]:
        params = [torch.zeros(1, requires_grad=True) for _ in range(num_groups)]
        optimizer = torch.optim.SGD(
            [{"params": [param]} for param in params], lr=0.1 * lr_scale, momentum=0.9
        )
        config["lr_scheduler"] = {"interval": "step", **schedule}
        scheduler = build_scheduler(ConfigParser(config, source="t.json"), optimizer, 4,
                                    lr_scale=lr_scale)  # fmt: skip
        steps = []
        for _ in range(8):
            steps.append([group["lr"] for group in optimizer.param_groups])
            optimizer.step()
            scheduler.step()
        return steps

    @settings(max_examples=num_examples, deadline=None)
    @given(
        name=st.sampled_from(["OneCycleLR", "CyclicLR"]),
        num_groups=st.integers(1, 2),
        per_group=st.booleans(),
        lr_scale=st.sampled_from([0.25, 0.5, 2.0, 3.0]),
    )
    def check(name: str, num_groups: int, per_group: bool, lr_scale: float) -> None:
        def rate(value: float) -> float | list[float]:
            return [value * (index + 1) for index in range(num_groups)] if per_group else value

        args = {"max_lr": rate(0.4), "total_steps": 8}
        if name == "CyclicLR":
            args = {"base_lr": rate(0.05), "max_lr": rate(0.4), "step_size_up": 3}
        schedule = {"type": name, "args": args}
        scaled, unscaled = rates(schedule, num_groups, lr_scale), rates(schedule, num_groups, 1.0)
        for step_scaled, step_unscaled in zip(scaled, unscaled, strict=True):
            assert step_scaled == pytest.approx([r * lr_scale for r in step_unscaled])

    check()


def test_reference_batch_size_scales_cyclic_lrs_base_and_max_lr(tmp_path):
    """CyclicLR at twice the reference batch: was base_lr and max_lr as given, the optimizer's
    scaled rate overwritten by the unscaled base_lr."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path)
    config["lr_scheduler"] = {
        "type": "CyclicLR", "interval": "step",
        "args": {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 2},
    }  # fmt: skip
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.02, momentum=0.9)
    scheduler = build_scheduler(ConfigParser(config, source="t.json"), optimizer, 4, lr_scale=2.0)
    assert scheduler.base_lrs == pytest.approx([0.02]) and scheduler.max_lrs == pytest.approx([0.2])
