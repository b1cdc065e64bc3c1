"""Learning-rate schedules: built from config with their length derived from the run, a linear
warmup in front, when they step, and what a resume needs to know of them (their signature, and
how far into them the run is)."""

import logging
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import lr_scheduler as schedulers

from utils.util import UserError

if TYPE_CHECKING:
    from parse_config import ConfigParser

# The argument that sets a schedule's whole length, derived from the run when the config leaves
# it out: then --epochs rescales the schedule instead of leaving a longer one half done.
LENGTH_ARGS = {
    "CosineAnnealingLR": "T_max",
    "LinearLR": "total_iters",  # torch's default, 5, would end a linear decay after 5 steps
    "OneCycleLR": "total_steps",
    "PolynomialLR": "total_iters",
}
# The learning rates a schedule sets itself, overriding the optimizer's: reference_batch_size
# scales them as it scales the optimizer's (CyclicLR starts every group at base_lr).
RATE_ARGS = {"OneCycleLR": ("max_lr",), "CyclicLR": ("base_lr", "max_lr")}
# The names in torch.optim.lr_scheduler that a JSON config cannot build, and why.
NOT_FROM_CONFIG = {
    "LRScheduler": "is the base class of torch's schedules, not one",
    "LambdaLR": "takes a Python function (lr_lambda), which a config cannot hold",
    "MultiplicativeLR": "takes a Python function (lr_lambda), which a config cannot hold",
    "SequentialLR": "takes other schedulers, which a config cannot hold",
    "ChainedScheduler": "takes other schedulers, which a config cannot hold",
}
# The keys of lr_scheduler that shape a schedule (a resume compares them).
SHAPE_KEYS = ("type", "args", "interval", "warmup_epochs", "warmup_steps", "warmup_start_factor")


def schedule_length(config: "ConfigParser", steps_per_epoch: int) -> tuple[int, int]:
    """(whole run, warmup) in the schedule's own unit: optimizer steps for a per-step schedule,
    epochs for a per-epoch one."""
    section, epochs = config["lr_scheduler"], config["trainer"]["epochs"]
    if section["interval"] == "epoch":
        return epochs, int(section["warmup_epochs"])
    warmup = section["warmup_steps"] or round(section["warmup_epochs"] * steps_per_epoch)
    return epochs * steps_per_epoch, warmup


def warmup_steps(config: "ConfigParser", steps_per_epoch: int) -> int:
    """The schedule's warmup in optimizer steps (0 without a schedule)."""
    if config["lr_scheduler"] is None:
        return 0
    warmup = schedule_length(config, steps_per_epoch)[1]
    return warmup if config["lr_scheduler"]["interval"] == "step" else warmup * steps_per_epoch


def given_length(section: dict) -> int | None:
    """The schedule's length set in lr_scheduler.args (None: derived from the run)."""
    args = section["args"]
    if section["type"] == "OneCycleLR" and "epochs" in args:
        return args["epochs"] * args.get("steps_per_epoch", 1)
    name = LENGTH_ARGS.get(section["type"])
    return args.get(name) if name else None


def check_given_length(
    config: "ConfigParser", length: int, warmup: int, logger: logging.Logger
) -> None:
    """A length in args shorter than the run: OneCycleLR cannot step past its end (refused);
    a cosine climbs back up after it and a polynomial stays at 0 (warned). Longer: the run ends
    before the learning rate comes down to the schedule's end (warned)."""
    section = config["lr_scheduler"]
    given, needed = given_length(section), length - warmup
    if given is None or given == needed:
        return
    unit = "epochs" if section["interval"] == "epoch" else "optimizer steps"
    kind, fix = section["type"], f"leave {LENGTH_ARGS.get(section['type'], 'its length')} out"
    name = LENGTH_ARGS.get(kind)
    # A cosine of length 0 divides by it at its first step, after the run has begun.
    if name in section["args"] and not (type(given) in (int, float) and given >= 1):
        raise UserError(
            f"{config.source}: lr_scheduler.args.{name}: must be at least 1 ({unit}), got "
            f"{given!r}; {fix} to fit the run"
        )
    if given > needed:
        logger.warning(
            "lr_scheduler: %s ends after %d %s, the run has %d: the run ends before the "
            "schedule does, its learning rate not down to the schedule's end; %s of "
            "lr_scheduler.args to fit the run.",
            kind, given, unit, needed, fix,
        )  # fmt: skip
        return
    if kind == "OneCycleLR":
        raise UserError(
            f"{config.source}: lr_scheduler.args: OneCycleLR's length ({given} {unit}) is shorter "
            f"than the run's {needed} {unit} after warmup, and it cannot step past its end; "
            f"{fix} of lr_scheduler.args to fit the run"
        )
    after = "climbs back up" if kind == "CosineAnnealingLR" else "stays at its end"
    logger.warning(
        "lr_scheduler: %s ends after %d %s, the run has %d: the learning rate reaches its minimum "
        "before the last epoch and %s; %s of lr_scheduler.args to fit the run.",
        kind, given, unit, needed, after, fix,
    )  # fmt: skip


def build_scheduler(
    config: "ConfigParser",
    optimizer: torch.optim.Optimizer,
    steps_per_epoch: int,
    *,
    lr_scale: float = 1.0,
    logger: logging.Logger | None = None,
) -> Any:
    """lr_scheduler.type from torch.optim.lr_scheduler, after warmup_epochs/warmup_steps of
    LinearLR from warmup_start_factor x lr (SequentialLR chains them), or None.

    lr_scale: optimizer.reference_batch_size's factor, applied to the rates a schedule sets
    itself (RATE_ARGS: OneCycleLR's max_lr, CyclicLR's base_lr and max_lr) as build_optimizer applies it to the optimizer's.
    """
    section = config["lr_scheduler"]
    if section is None:
        return None
    if section["type"] in NOT_FROM_CONFIG:  # else a traceback, or a hint to add schedulers
        raise UserError(
            f"{config.source}: lr_scheduler.type: {section['type']} "
            f"{NOT_FROM_CONFIG[section['type']]}; name a schedule (e.g. CosineAnnealingLR), "
            "with warmup_epochs or warmup_steps for a warmup before it"
        )
    check_cycled_momentum(config, optimizer)
    length, warmup = schedule_length(config, steps_per_epoch)
    derived: dict[str, Any] = {}
    length_arg = LENGTH_ARGS.get(section["type"])
    # OneCycleLR also takes its length as epochs x steps_per_epoch.
    if length_arg and length_arg not in section["args"] and "epochs" not in section["args"]:
        if length - warmup < 1:
            unit = "epochs" if section["interval"] == "epoch" else "optimizer steps"
            raise UserError(
                f"{config.source}: lr_scheduler: the warmup ({warmup} {unit}) leaves nothing of "
                f"the run ({length} {unit}) for {section['type']}; shorten the warmup"
            )
        derived[length_arg] = length - warmup
    check_given_length(config, length, warmup, logger or logging.getLogger("train"))
    if section["type"] == "ReduceLROnPlateau":
        derived.update(plateau_mode(config))
    scaled = {}
    for key in RATE_ARGS.get(section["type"], ()) if lr_scale != 1 else ():
        if key in section["args"]:  # a rate, or one per parameter group
            rate = section["args"][key]
            scaled[key] = (
                [r * lr_scale for r in rate] if isinstance(rate, list) else rate * lr_scale
            )
    main = config.init_obj("lr_scheduler", schedulers, optimizer, overrides=scaled, **derived)
    if warmup == 0:
        return main
    start = schedulers.LinearLR(
        optimizer, start_factor=section["warmup_start_factor"], total_iters=warmup
    )
    return schedulers.SequentialLR(optimizer, [start, main], milestones=[warmup])


def check_cycled_momentum(config: "ConfigParser", optimizer: torch.optim.Optimizer) -> None:
    """OneCycleLR and CyclicLR cycle every group's momentum under optimizer.type's key, "betas"
    (Adam's) or "momentum": a group of optimizer.param_groups stepped by an algorithm without
    that key would be a KeyError inside torch, or get a key its algorithm ignores."""
    section = config["lr_scheduler"]
    cycles = section["type"] in ("OneCycleLR", "CyclicLR")
    if not (cycles and section["args"].get("cycle_momentum", True)):
        return
    key = "betas" if "betas" in optimizer.defaults else "momentum"
    if all(key in group for group in optimizer.param_groups):
        return
    raise UserError(
        f"{config.source}: lr_scheduler.args.cycle_momentum: {section['type']} cycles the "
        f"momentum of every parameter group as {config['optimizer']['type']}'s {key!r}, and a "
        f"group of optimizer.param_groups steps with an algorithm that has no {key!r}; set "
        '"cycle_momentum": false, or give every group one kind of momentum'
    )


def plateau_mode(config: "ConfigParser") -> dict[str, str]:
    """ReduceLROnPlateau's mode, that of the metric step_scheduler gives it: trainer.monitor's
    ("max val/accuracy": "max"), or "min" for the loss it watches without one. torch's default,
    "min", would cut the learning rate while an accuracy keeps rising. A contradicting
    lr_scheduler.args.mode is refused."""
    wanted = "min" if config.monitor_mode == "off" else config.monitor_mode
    given = config["lr_scheduler"]["args"].get("mode")
    if given is None:
        return {"mode": wanted}
    if given != wanted:
        watched = f'trainer.monitor "{config.monitor_mode} {config.monitor_key}"'
        if config.monitor_mode == "off":
            watched = "the loss (trainer.monitor is off)"
        raise UserError(
            f'{config.source}: lr_scheduler.args.mode: "{given}", but ReduceLROnPlateau steps '
            f'on {watched}, which wants "{wanted}"; leave mode out to follow the monitor'
        )
    return {}


def step_scheduler(
    scheduler: Any, metrics: dict[str, float], monitor_key: str, per_batch: bool
) -> None:
    """Step an epoch-interval learning-rate schedule after an epoch (per-step ones step in the
    loop). ReduceLROnPlateau is given the monitored value; without a monitor it watches val/loss,
    or train/loss when there is no validation data.

    It follows the epochs: it steps also after an epoch whose batches trainer.nonfinite "skip"
    all dropped, as a resume steps a rebuilt schedule to the epochs done."""
    if scheduler is None or per_batch:
        return
    with warnings.catch_warnings():
        # After a first epoch that took no optimizer step, torch warns that the schedule's first
        # rate is skipped; it is not: that epoch had it, the next one has the schedule's second.
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler.step\(\)` before")
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            key = monitor_key or ("val/loss" if "val/loss" in metrics else "train/loss")
            scheduler.step(metrics[key])
        else:
            scheduler.step()


def schedule_signature(
    config: "ConfigParser", optimizer: torch.optim.Optimizer, steps_per_epoch: int
) -> dict | None:
    """What a schedule's state depends on: its config, the run's length and its optimizer steps
    per epoch, and the learning rates it starts from. A checkpoint keeps it; a resume whose
    signature differs rebuilds the schedule rather than restore a state that no longer fits."""
    section = config["lr_scheduler"]
    if section is None:
        return None
    return {
        **{key: section[key] for key in SHAPE_KEYS},
        "epochs": config["trainer"]["epochs"],
        "steps_per_epoch": steps_per_epoch,
        "base_lrs": [group.get("initial_lr", group["lr"]) for group in optimizer.param_groups],
    }


def schedule_change(saved: dict | None, current: dict) -> str | None:
    """What differs between two signatures, in words, or None. A checkpoint without one (format
    1) is compared by its config alone, by the caller."""
    if saved is None:
        return None
    names = {
        "epochs": "trainer.epochs",
        "steps_per_epoch": "optimizer steps per epoch",
        "base_lrs": "the learning rates it starts from",
    }
    changed = []
    for key, value in current.items():
        before = saved.get(key)
        if key == "base_lrs":
            same = len(before or []) == len(value) and all(
                abs(a - b) <= 1e-12 * max(abs(a), abs(b))
                for a, b in zip(before, value, strict=True)
            )
        else:
            same = before == value
        if not same:
            shown = f" {before} -> {value}" if key in ("epochs", "steps_per_epoch") else " changed"
            changed.append(names.get(key, f"lr_scheduler.{key}") + shown)
    return ", ".join(changed) if changed else None


def is_positional(scheduler: Any) -> bool:
    """A schedule whose learning rate is a function of how many times it stepped (every torch
    scheduler but ReduceLROnPlateau, which follows a metric)."""
    return not isinstance(scheduler, schedulers.ReduceLROnPlateau)


def fast_forward(scheduler: Any, num_steps: int) -> None:
    """Step a newly built schedule `num_steps` times: where the run stands in it."""
    with warnings.catch_warnings():
        # "lr_scheduler.step() before optimizer.step()": no optimizer step is due here.
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(num_steps):
            scheduler.step()
