"""What config values must look like: a check is a predicate and the phrase for what it accepts.

config_schema.py gives each key one of these; a failed check reads
"<file>: <key path>: must be <what>, got <value as JSON>".
"""

import copy
import dataclasses
import json
import math
import re
from collections.abc import Callable
from typing import Any

from utils.util import ConfigError, is_number

# data_loader.args.sampler: how each epoch draws the training data (BaseDataLoader).
SAMPLERS = ("random", "sequential", "subset_random", "weighted")
# The values of the config key `device`; -d takes GPU indices instead (CUDA_VISIBLE_DEVICES).
DEVICE_NAME = re.compile(r"auto|cpu|mps|cuda(:\d+)?")

Check = tuple[Callable[[Any], bool], str]


def read_json(text: str, source: str) -> Any:
    """json.loads without what Python's json reads beyond JSON: NaN, Infinity, -Infinity and a
    number too large for a float (1e400 reads as inf). No config value may be one: a range check
    passes lr Infinity, and a NaN fails every comparison far from where it was written."""

    def refuse(token: str) -> float:
        raise ConfigError(f"{source}: {token} is not a finite number; a config holds finite ones")

    def finite(token: str) -> float:
        return value if math.isfinite(value := float(token)) else refuse(token)

    return json.loads(text, parse_constant=refuse, parse_float=finite)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def optional(check: Check) -> Check:
    """`check`, or null."""
    predicate, what = check
    return (lambda value: value is None or predicate(value), f"{what} or null")


def choice(*choices: Any) -> Check:
    """One of `choices`, spelled as JSON: '"stop" or "skip"'."""
    spelled = [json.dumps(option) for option in choices]
    return (lambda value: value in choices, f"{', '.join(spelled[:-1])} or {spelled[-1]}")


POSITIVE_INT: Check = (lambda v: _is_int(v) and v > 0, "a positive integer")
NON_NEGATIVE_INT: Check = (lambda v: _is_int(v) and v >= 0, "an integer >= 0")
POSITIVE_NUMBER: Check = (lambda v: is_number(v) and v > 0, "a number > 0")
NON_NEGATIVE_NUMBER: Check = (lambda v: is_number(v) and v >= 0, "a number >= 0")
BOOL: Check = (lambda v: isinstance(v, bool), "true or false")
STRING: Check = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
NAME: Check = (
    lambda v: (
        isinstance(v, str)
        and re.fullmatch(r"[A-Za-z0-9._-]+", v) is not None
        and v not in (".", "..")
    ),
    "a name of letters, digits, '.', '_' or '-' (it becomes a folder name)",
)
STRING_LIST: Check = (
    lambda v: isinstance(v, list) and all(isinstance(item, str) for item in v),
    "a list of strings",
)
# metrics: names, or {"type": NAME, "name": KEY, "args": {...}} for a metric with arguments; KEY
# (by default NAME) is its key, val/<KEY>, so one type may appear twice with other arguments.
METRIC_KEY = re.compile(r"(?!ema_)\w+")  # a key not read as the averaged weights' val/ema_<KEY>
METRICS: Check = (
    lambda v: (
        isinstance(v, list)
        and all(
            isinstance(item, str)
            or (
                isinstance(item, dict)
                and set(item) <= {"type", "name", "args"}
                and isinstance(item.get("type"), str)
                and isinstance(item.get("name", ""), str)
                and isinstance(item.get("args", {}), dict)
            )
            for item in v
        )
        and all(METRIC_KEY.fullmatch(name) and name != "loss" for name in metric_names(v))
    ),
    'a list of metric names or {"type": NAME, "name": KEY, "args": {...}}, each name or KEY '
    'letters, digits and "_", not "loss" nor "ema_..."',
)
VERBOSITY: Check = (lambda v: v in (0, 1, 2) and not isinstance(v, bool), "0, 1 or 2")
# A fraction of the training set in [0, 1), or a number of samples.
VALIDATION_SPLIT: Check = (
    lambda v: (_is_int(v) and v >= 0) or (isinstance(v, float) and 0.0 <= v < 1.0),
    "a fraction in [0, 1) or a whole number of samples >= 0",
)
SAMPLER: Check = (
    lambda v: isinstance(v, str) and v in SAMPLERS,
    "one of " + ", ".join(json.dumps(name) for name in SAMPLERS),
)
# Finite: JSON's Infinity (or 1e400, which json reads as inf) would make the draw's
# probabilities nan, and numpy's choice fail with a traceback.
CLASS_WEIGHTS: Check = (
    lambda v: (
        isinstance(v, list)
        and all(is_number(item) and 0 <= item < math.inf for item in v)
        and any(item > 0 for item in v)
    ),
    "a list of one finite number >= 0 per class, not all 0",
)
FOLDS: Check = (lambda v: _is_int(v) and v >= 2, "an integer >= 2")
# Parameter-name prefixes, e.g. ["network.conv1", "network.layer1"].
PREFIX_LIST: Check = (
    lambda v: (
        isinstance(v, list)
        and all(isinstance(item, str) and item != "" for item in v)
        and len(set(v)) == len(v)
    ),
    'a list of distinct parameter-name prefixes, e.g. ["network.layer1"]',
)
# Each group's own keys are checked in utils/config/load_config.py.
# optimizer.param_groups[].kind: parameters by what they are, whatever their names
# (utils/optim/optimizer.py): those of normalisation layers, their scales, their shifts, biases,
# and the weights of two or more dimensions outside them (linear layers' matrices, filters).
PARAM_KINDS = ("norm", "norm_weight", "norm_bias", "bias", "matrix")
PARAM_GROUPS: Check = (
    lambda v: isinstance(v, list),
    'a list of {"params": ..., "lr": ...} objects',
)
# In (0, 1]: a probability that may be 1, a decay, a starting fraction.
PROBABILITY: Check = (lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]")
# In [0, 1): a share of a whole that leaves something over (label smoothing, Lookahead's decay).
SHARE: Check = (lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)")
PROFILE_WINDOW: Check = (
    lambda v: (
        isinstance(v, list) and len(v) == 3 and all(_is_int(n) and n >= 0 for n in v) and v[2] > 0
    ),
    "[wait, warmup, active]: three integers >= 0, active > 0",
)
INTERVAL: Check = (lambda v: v in ("epoch", "step"), "one of ('epoch', 'step')")
DEVICE: Check = (
    lambda v: isinstance(v, str) and DEVICE_NAME.fullmatch(v) is not None,
    '"auto", "cpu", "cuda", "cuda:N" (N = 0, 1, ...) or "mps"',
)
STRATEGY: Check = choice("ddp", "fsdp")
BACKEND: Check = (lambda v: v in (None, "nccl", "gloo"), '"nccl", "gloo" or null (automatic)')
NONFINITE: Check = choice("stop", "skip")
AMP: Check = choice(None, "bf16", "fp16")
# logger/loggers.py builds these; "wandb" and "mlflow" need their optional packages.
LOGGER_NAMES = ("tensorboard", "csv", "wandb", "mlflow")
LOGGERS: Check = (
    lambda v: (
        isinstance(v, list)
        and all(isinstance(item, str) and item in LOGGER_NAMES for item in v)
        and len(set(v)) == len(v)
    ),
    "a list of distinct names from " + ", ".join(json.dumps(name) for name in LOGGER_NAMES),
)
WANDB_MODE: Check = choice(None, "online", "offline")
COMPILE_MODE: Check = choice(
    "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
)


@dataclasses.dataclass(frozen=True)
class Marker:
    """A default that is not a value; `label` is how the docs show it."""

    label: str


REQUIRED = Marker("required")  # the key must be given
OPTIONAL = Marker("not set")  # the key may be left out, and nothing is filled in for it


def key(default: Any, check: Check | None, doc: str) -> Any:
    """One config key. check None: an object, checked by its own dataclass or not at all (args)."""
    metadata = {"default": default, "check": check, "doc": doc}
    if default is REQUIRED:
        return dataclasses.field(metadata=metadata)
    if isinstance(default, dict | list):  # a fresh copy for each instance
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=None if default is OPTIONAL else default, metadata=metadata)


def metric_names(metrics: list) -> list[str]:
    """The names of the config's metrics (their keys: val/<name>), entries given either way."""
    return [
        item if isinstance(item, str) else item.get("name", item.get("type")) for item in metrics
    ]


def check_metric_names(metrics: list, source: str) -> None:
    """Refuse two metrics of one name: the second would overwrite the first's val/<name>."""
    names = metric_names(metrics)
    for index, name in enumerate(names):
        if name in names[:index]:
            raise ConfigError(
                f'{source}: metrics[{index}]: a second metric named "{name}" (val/{name}); give '
                'each entry of one type its own "name", e.g. {"type": ..., "name": '
                f'"{name}_2", "args": {{...}}}}'
            )


def check_trainer(trainer: dict, source: str) -> None:
    """trainer keys that contradict each other, or one that would silently do nothing."""
    if trainer["deterministic"] and trainer["cudnn_benchmark"]:
        raise ConfigError(
            f"{source}: trainer.cudnn_benchmark: must be false when trainer.deterministic is true "
            "(benchmarking picks kernels by timing)"
        )
    # Without shifted views there is nothing for the weight to weigh: a run that sets it
    # expecting the record's weighting would get equal weights and not know it.
    if trainer["tta_translate_weight"] != 1 and not trainer["tta_translate"]:
        raise ConfigError(
            f"{source}: trainer.tta_translate_weight: weighs the shifted views, and "
            "trainer.tta_translate is 0 (none); set tta_translate > 0 or remove the weight"
        )


def check_strategy(config: dict, source: str) -> None:
    """What FSDP (distributed.strategy "fsdp") does not combine with, refused up front."""
    if config["distributed"]["strategy"] != "fsdp":
        if config["trainer"]["async_checkpoint"]:
            raise ConfigError(
                f'{source}: trainer.async_checkpoint: needs distributed.strategy "fsdp" (it writes '
                "the shards in the background)"
            )
        return
    trainer = config["trainer"]
    refused = {
        "distributed.sync_bn": (config["distributed"]["sync_bn"], "SyncBatchNorm wraps DDP's"),
        "trainer.ema_decay": (
            trainer["ema_decay"] is not None,
            "the average would be a whole copy of the model on every rank",
        ),
        "trainer.lookahead_period": (
            trainer["lookahead_period"] is not None,
            "the slow weights would be a whole copy of the model on every rank",
        ),
        "trainer.compile": (trainer["compile"], "compiling a sharded model is not supported here"),
        "trainer.amp": (trainer["amp"] == "fp16", 'use "bf16" (no GradScaler for shards)'),
    }
    for name, (used, why) in refused.items():
        if used:
            raise ConfigError(f'{source}: {name}: not with distributed.strategy "fsdp" ({why})')


def check_train_epochs(config: dict, source: str) -> None:
    """optimizer.param_groups[i].train_epochs: a positive integer. As many as trainer.epochs or
    more train the group throughout: a recipe's schedule, run shorter (--epochs 3), still runs."""
    for index, group in enumerate(config["optimizer"].get("param_groups") or []):
        value, (predicate, what) = group.get("train_epochs", 1), POSITIVE_INT
        if not predicate(value):
            raise ConfigError(
                f"{source}: optimizer.param_groups[{index}].train_epochs: must be {what}, got "
                f"{json.dumps(value)}"
            )


def check_across_sections(config: dict, source: str) -> None:
    """What one section's keys refuse of another's (FSDP's: check_strategy), and param_groups'
    train_epochs. Run once every section has passed its own checks."""
    check_strategy(config, source)
    check_train_epochs(config, source)
