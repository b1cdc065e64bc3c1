"""A sweep's search space from sweep.py's flags, and the trials it gives.

Parsing is pure: nothing here runs a trial or writes a file. Every value is read the way
train.py's --set reads one (load_config.parse_override: JSON if it parses, else a string) and
set the way --set sets it (apply_override); each trial's config is checked by the project's
own validation before any trial runs.
"""

import copy
import itertools
import json
import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from utils.config.load_config import ConfigError, apply_override, parse_override
from utils.util import UserError

# How each kind of dimension is spelled on the command line.
FORMS = {
    "grid": ("--grid", "KEY.PATH=[VALUE, ...]"),
    "choice": ("--choice", "KEY.PATH=[VALUE, ...]"),
    "uniform": ("--uniform", "KEY.PATH=LOW,HIGH"),
    "log_uniform": ("--log-uniform", "KEY.PATH=LOW,HIGH"),
}
# Keys the sweep sets itself: where each trial's run folder goes and that it resumes there.
SWEEP_KEYS = ("trainer.save_dir", "trainer.auto_resume")


class SweepError(UserError):
    """A sweep specification that cannot be used (reported in one line, exit code 2)."""


@dataclass(frozen=True)
class Dimension:
    """One swept key: a grid or a choice of `values`, or a [low, high] range to draw from."""

    key: str  # a dotted config key path, e.g. "optimizer.args.lr"
    kind: str  # "grid", "choice", "uniform" or "log_uniform"
    values: list

    @property
    def key_path(self) -> list[str]:
        return self.key.split(".")


@dataclass(frozen=True)
class Trial:
    """Trial `index` of a sweep: the value of every swept key."""

    index: int
    values: dict[str, Any]

    @property
    def name(self) -> str:
        """Its run id, the name of its run folder."""
        return f"trial-{self.index:03d}"


def parse_dimension(kind: str, text: str) -> Dimension:
    """'optimizer.args.lr=[0.1,0.01]' (grid, choice) or 'optimizer.args.lr=1e-4,1e-1' (ranges)."""
    flag, form = FORMS[kind]
    try:
        keys, value = parse_override(text)
    except ConfigError:
        raise SweepError(f"{flag} {text!r}: expected {form}") from None
    key = ".".join(keys)
    if key in SWEEP_KEYS:
        raise SweepError(f"{flag} {text!r}: {key} is set by the sweep for every trial")
    if kind in ("grid", "choice"):
        if not isinstance(value, list) or not value:
            raise SweepError(f"{flag} {text!r}: expected a non-empty JSON list, {form}")
        # A repeated grid value runs the same trial twice; a repeated choice is drawn twice as
        # often, where the docs promise each value is as likely.
        repeated = [item for index, item in enumerate(value) if _listed(item, value[:index])]
        if repeated:
            raise SweepError(f"{flag} {text!r}: {json.dumps(repeated[0])} is listed twice")
        return Dimension(key, kind, value)
    bounds = value if isinstance(value, list) else str(value).split(",")
    try:
        low, high = (float(bound) for bound in bounds)
    except ValueError:  # not two numbers
        raise SweepError(f"{flag} {text!r}: expected {form}, two numbers") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise SweepError(f"{flag} {text!r}: LOW must be below HIGH, both finite")
    if kind == "log_uniform" and low <= 0:
        raise SweepError(f"{flag} {text!r}: LOW must be > 0 on a log scale")
    return Dimension(key, kind, [low, high])


def _listed(value: Any, values: list) -> bool:
    """`value` is among `values` as a config sees it: 1 and 1.0 alike, but not True (a bool
    key and a number key are told apart by validation)."""
    return any(
        item == value and isinstance(item, bool) == isinstance(value, bool) for item in values
    )


def build_space(
    *,
    grid: list[str],
    uniform: list[str],
    log_uniform: list[str],
    choice: list[str],
    num_random: int | None,
    num_optuna: int | None,
) -> tuple[str, list[Dimension]]:
    """The sweep method ("grid", "random" or "optuna") and its dimensions, checked."""
    drawn = [
        *(parse_dimension("uniform", text) for text in uniform),
        *(parse_dimension("log_uniform", text) for text in log_uniform),
        *(parse_dimension("choice", text) for text in choice),
    ]
    gridded = [parse_dimension("grid", text) for text in grid]
    for flag, count in (("--random", num_random), ("--optuna", num_optuna)):
        if count is not None and count < 1:
            raise SweepError(f"{flag} {count}: must be a number of trials >= 1")
    if num_random is not None and num_optuna is not None:
        raise SweepError("--random and --optuna: choose one way to draw the trials")
    drawing = num_random is not None or num_optuna is not None
    if gridded and (drawn or drawing):
        raise SweepError(
            "--grid: runs every combination and does not mix with --random/--optuna or "
            "--uniform/--log-uniform/--choice; list the grid's values with --choice instead"
        )
    if drawn and not drawing:
        raise SweepError(
            "--uniform/--log-uniform/--choice: say how many trials to draw, with "
            "--random N or --optuna N"
        )
    if drawing and not drawn:
        raise SweepError(
            "--random/--optuna: give the space to draw from, with --uniform, "
            "--log-uniform or --choice"
        )
    if not gridded and not drawn:
        raise SweepError(
            "nothing to sweep: give --grid KEY=[...], or --random N / --optuna N "
            "with --uniform, --log-uniform or --choice"
        )
    dimensions = gridded or drawn
    keys = [dimension.key for dimension in dimensions]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise SweepError(f"{', '.join(repeated)}: swept more than once")
    method = "grid" if gridded else "random" if num_random is not None else "optuna"
    # Every trial is ranked by the base config's monitored metric, and Optuna's pruner reads a
    # checkpoint every epoch: a trial's own value of either would be ignored, not used.
    if "trainer.monitor" in keys:
        raise SweepError(
            "trainer.monitor: the sweep ranks every trial by one metric; set it with --set"
        )
    if method == "optuna" and "trainer.save_period" in keys:
        raise SweepError(
            "trainer.save_period: --optuna saves every epoch (its pruner reads each epoch's "
            "value); sweep it with --grid or --random"
        )
    return method, dimensions


def check_keys_exist(config: dict, dimensions: list[Dimension], source: str) -> None:
    """Every swept key must already be in the config (with its defaults): a misspelt
    argument, which --set would pass on to a constructor, is caught before any trial runs."""
    for dimension in dimensions:
        node: Any = config
        for depth, key in enumerate(dimension.key_path):
            where = ".".join(dimension.key_path[: depth + 1])
            if isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            elif isinstance(node, dict) and key in node:
                node = node[key]
            else:
                known = ", ".join(sorted(node)) if isinstance(node, dict) else "none"
                raise SweepError(
                    f"{FORMS[dimension.kind][0]} {dimension.key}: {source}: {where}: not in the "
                    f"config (known here: {known}); to sweep a new argument, add it to the "
                    "config or --set it first"
                )


def grid_trials(dimensions: list[Dimension]) -> list[Trial]:
    """Every combination, the last --grid varying fastest."""
    keys = [dimension.key for dimension in dimensions]
    combinations = itertools.product(*(dimension.values for dimension in dimensions))
    return [
        Trial(index, dict(zip(keys, values, strict=True)))
        for index, values in enumerate(combinations)
    ]


def random_trials(dimensions: list[Dimension], num_trials: int, seed: int) -> list[Trial]:
    """`num_trials` draws from one stream seeded by `seed`: asking for more trials later
    gives the same first ones, so a sweep can be extended.

    Every trial trains with the config's seed, so two trials with the same values would be the
    same run twice: a space of --choice alone (the only one that repeats a point) is drawn
    without repeats, and asking it for more trials than it has points is refused."""
    finite = all(dimension.kind == "choice" for dimension in dimensions)
    num_points = math.prod(len(dimension.values) for dimension in dimensions)
    if finite and num_trials > num_points:
        raise SweepError(
            f"--random {num_trials}: the --choice space has only {num_points} distinct trials; "
            f"ask for {num_points} or fewer, or run them all with --grid"
        )
    rng, trials, seen = random.Random(seed), [], set()
    while len(trials) < num_trials:
        values = {dimension.key: draw(dimension, rng) for dimension in dimensions}
        point = json.dumps(values, sort_keys=True)
        if finite and point in seen:
            continue  # drawn again: the next draw of the one stream
        seen.add(point)
        trials.append(Trial(len(trials), values))
    return trials


def draw(dimension: Dimension, rng: random.Random) -> Any:
    """One value of a --choice, --uniform or --log-uniform dimension."""
    if dimension.kind == "choice":
        return copy.deepcopy(rng.choice(dimension.values))
    low, high = dimension.values
    if dimension.kind == "uniform":
        value = rng.uniform(low, high)
    else:
        value = math.exp(rng.uniform(math.log(low), math.log(high)))
    # 6 significant digits: names and tables stay readable, and --set gives back the same value.
    return float(f"{value:.6g}")


def trial_config(base: dict, trial: Trial, sweep_values: dict[str, Any]) -> dict:
    """A copy of `base` with the trial's values and the sweep's own keys set as --set sets them."""
    config = copy.deepcopy(base)
    for key, value in {**trial.values, **sweep_values}.items():
        apply_override(config, key.split("."), value, f"{trial.name}: --set {key}")
    return config


def set_flags(values: dict[str, Any]) -> list[str]:
    """{"a.b": value} as train.py arguments: ["--set", "a.b=<value as JSON>", ...]."""
    return [
        item for key, value in values.items() for item in ("--set", f"{key}={json.dumps(value)}")
    ]


def describe(dimensions: list[Dimension]) -> list[dict]:
    """The dimensions as JSON-ready dicts, for sweep.json."""
    return [asdict(dimension) for dimension in dimensions]


def corner_trials(dimensions: list[Dimension]) -> list[Trial]:
    """Trials at both ends of every range and at every choice, the other keys at their first
    value: what an Optuna sweep, whose values come later, can check before it starts."""
    first = {dimension.key: dimension.values[0] for dimension in dimensions}
    return [
        Trial(index, {**first, dimension.key: value})
        for index, (dimension, value) in enumerate(
            (dimension, value) for dimension in dimensions for value in dimension.values
        )
    ]


def describe_values(values: dict[str, Any]) -> str:
    """{"optimizer.args.lr": 0.1} as "optimizer.args.lr=0.1", as --set spells it."""
    return " ".join(f"{key}={json.dumps(value)}" for key, value in values.items())
