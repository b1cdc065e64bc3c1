"""Load, override and validate the JSON config; build objects from it.

Parsing is pure: nothing here creates folders, configures logging or seeds RNGs.
Every user mistake raises ConfigError with the file and the key path in its message.
"""

import argparse
import copy
import functools
import inspect
import json
import re
import secrets
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from base.base_data_loader import SAMPLERS
from utils import ConfigValueError, UserError
from utils.checkpoint import latest_checkpoint
from utils.run_folder import is_restartable

REQUIRED = object()  # marks a key without a default


class ConfigError(UserError):
    """A config file, override or value that cannot be used."""


# A check is (predicate, what the value must be); the message reads "must be <what>".
Check = tuple[Callable[[Any], bool], str]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _optional(check: Check) -> Check:
    predicate, what = check
    return (lambda value: value is None or predicate(value), f"{what} or null")


POSITIVE_INT: Check = (lambda v: _is_int(v) and v > 0, "a positive integer")
NON_NEGATIVE_INT: Check = (lambda v: _is_int(v) and v >= 0, "an integer >= 0")
POSITIVE_NUMBER: Check = (lambda v: _is_number(v) and v > 0, "a number > 0")
NON_NEGATIVE_NUMBER: Check = (lambda v: _is_number(v) and v >= 0, "a number >= 0")
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
VERBOSITY: Check = (lambda v: v in (0, 1, 2) and not isinstance(v, bool), "0, 1 or 2")
# A fraction of the training set in [0, 1), or a number of samples.
VALIDATION_SPLIT: Check = (
    lambda v: (_is_int(v) and v >= 0) or (isinstance(v, float) and 0.0 <= v < 1.0),
    "a fraction in [0, 1) or a whole number of samples >= 0",
)
SAMPLER: Check = (
    lambda v: isinstance(v, str) and v in SAMPLERS,
    "one of " + ", ".join(f'"{name}"' for name in SAMPLERS),
)
CLASS_WEIGHTS: Check = (
    lambda v: (
        isinstance(v, list)
        and all(_is_number(item) and item >= 0 for item in v)
        and any(item > 0 for item in v)
    ),
    "a list of one number >= 0 per class, not all 0",
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

# Top-level keys: default (or REQUIRED) and check. "section" entries are {"type", "args"} dicts.
TOP_LEVEL: dict[str, tuple[Any, Check | str]] = {
    "name": (REQUIRED, NAME),
    "n_gpu": (1, NON_NEGATIVE_INT),
    "seed": (0, NON_NEGATIVE_INT),
    "arch": (REQUIRED, "section"),
    "data_loader": (REQUIRED, "section"),
    "optimizer": (REQUIRED, "section"),
    "loss": (REQUIRED, STRING),
    "metrics": ([], STRING_LIST),
    "lr_scheduler": (None, "section"),
    "trainer": (REQUIRED, "trainer"),
    "distributed": ({}, "distributed"),
}

# The "distributed" section (used only under torchrun).
DISTRIBUTED: dict[str, tuple[Any, Check]] = {
    "backend": (
        None,
        (lambda v: v in (None, "nccl", "gloo"), '"nccl", "gloo" or null (automatic)'),
    ),
    "sync_bn": (False, BOOL),
}

TRAINER: dict[str, tuple[Any, Check]] = {
    "epochs": (REQUIRED, POSITIVE_INT),
    "save_dir": ("saved/", STRING),
    "save_period": (1, POSITIVE_INT),
    "verbosity": (1, VERBOSITY),
    "monitor": ("off", STRING),
    "early_stop": (0, _optional(NON_NEGATIVE_INT)),
    "tensorboard": (True, BOOL),
    "len_epoch": (None, _optional(POSITIVE_INT)),
    "log_step": (10, POSITIVE_INT),
    "keep_last": (None, _optional(POSITIVE_INT)),
    "deterministic": (False, BOOL),
    "nonfinite": ("stop", (lambda v: v in ("stop", "skip"), '"stop" or "skip"')),
    "max_skipped_steps": (10, NON_NEGATIVE_INT),
    "auto_resume": (False, BOOL),
    "amp": (None, (lambda v: v in (None, "bf16", "fp16"), 'null, "bf16" or "fp16"')),
    "channels_last": (False, BOOL),
    "compile": (False, BOOL),
    "compile_mode": (
        "default",
        (
            lambda v: (
                v in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
            ),
            '"default", "reduce-overhead", "max-autotune" or "max-autotune-no-cudagraphs"',
        ),
    ),
    "grad_accum_steps": (1, POSITIVE_INT),
    "grad_clip": (None, _optional(POSITIVE_NUMBER)),
    "cudnn_benchmark": (False, BOOL),
    "tf32": (None, _optional(BOOL)),
    "type": ("Trainer", STRING),
    "args": ({}, (lambda v: isinstance(v, dict), "an object {...}")),
}

# Arguments inside {"type", "args"} sections that are common enough to check up front.
KNOWN_ARGS: dict[tuple[str, str], Check] = {
    ("optimizer", "lr"): POSITIVE_NUMBER,
    ("optimizer", "weight_decay"): NON_NEGATIVE_NUMBER,
    ("data_loader", "batch_size"): POSITIVE_INT,
    ("data_loader", "num_workers"): NON_NEGATIVE_INT,
    ("data_loader", "validation_split"): VALIDATION_SPLIT,
    ("data_loader", "shuffle"): BOOL,
    ("data_loader", "pin_memory"): BOOL,
    ("data_loader", "persistent_workers"): BOOL,
    ("data_loader", "prefetch_factor"): _optional(POSITIVE_INT),
    ("data_loader", "sampler"): SAMPLER,
    ("data_loader", "replacement"): BOOL,
    ("data_loader", "num_samples"): _optional(POSITIVE_INT),
    ("data_loader", "class_weights"): _optional(CLASS_WEIGHTS),
    ("data_loader", "folds"): _optional(FOLDS),
    ("data_loader", "fold"): _optional(NON_NEGATIVE_INT),
}
# data_loader.args that only one kind of sampler reads: setting them for another is a mistake.
SAMPLER_ARGS = {
    "replacement": ("random",),
    "num_samples": ("random", "weighted"),
    "class_weights": ("weighted",),
}

SECTION_KEYS = {"type", "args"}
# Keys a section may hold besides type and args (none is filled in when absent, except interval).
EXTRA_SECTION_KEYS = {
    "arch": {"freeze"},
    "optimizer": {"param_groups"},
    "lr_scheduler": {"interval"},
}
# Learning-rate schedulers that step on a metric, once per validated epoch.
METRIC_SCHEDULERS = ("ReduceLROnPlateau",)
SCHEDULER_INTERVALS = ("epoch", "step")
# victoresque/pytorch-template spells monitored metrics "val_loss"; accept it as "val/loss".
MONITOR_PATTERN = re.compile(r"(train|val)[/_](\w+)")


def load_json(path: Path) -> dict:
    """Read a JSON object from `path`; syntax errors give line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config file: {error.strerror}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"{path}: invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object {{...}}")
    return config


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split 'KEY.PATH=VALUE' into keys and a value (JSON if it parses, else the raw string)."""
    key_path, separator, raw_value = text.partition("=")
    keys = key_path.split(".")
    if not separator or any(key == "" for key in keys):
        raise ConfigError(f"--set {text!r}: expected KEY.PATH=VALUE, e.g. trainer.epochs=5")
    try:
        value = json.loads(raw_value)
    except json.JSONDecodeError:
        value = raw_value
    return keys, value


def apply_override(config: dict, keys: list[str], value: Any, source: str) -> None:
    """Set config[k1][k2]... = value. The path must exist, except a new key inside an `args` dict."""
    node = config
    for depth, key in enumerate(keys):
        where = ".".join(keys[: depth + 1])
        is_last = depth == len(keys) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(f"{source}: {where}: no list index {key} (length {len(node)})")
            index = int(key)
            if is_last:
                node[index] = value
            node = node[index]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{source}: {where}: {'.'.join(keys[:depth])} is not a section")
        # A new key inside `args` becomes a new keyword argument; anywhere else it is a typo.
        new_argument = is_last and depth > 0 and keys[depth - 1] == "args"
        if key not in node and not new_argument:
            known = ", ".join(sorted(node)) or "nothing"
            raise ConfigError(f"{source}: {where}: unknown key (known here: {known})")
        if is_last:
            node[key] = value
        else:
            node = node[key]


def _check_value(value: Any, check: Check, where: str, source: str) -> None:
    predicate, what = check
    if not predicate(value):
        raise ConfigError(f"{source}: {where}: must be {what}, got {json.dumps(value)}")


def with_defaults(config: dict) -> dict:
    """A copy with every missing optional key filled in (no checking)."""
    config = copy.deepcopy(config)
    for key, (default, _) in TOP_LEVEL.items():
        if key not in config and default is not REQUIRED:
            config[key] = copy.deepcopy(default)
    if isinstance(config.get("trainer"), dict):
        for key, (default, _) in TRAINER.items():
            if default is not REQUIRED:
                config["trainer"].setdefault(key, copy.deepcopy(default))
    for name in ("arch", "data_loader", "optimizer", "lr_scheduler"):
        if isinstance(config.get(name), dict):
            config[name].setdefault("args", {})
    if isinstance(config.get("lr_scheduler"), dict):
        config["lr_scheduler"].setdefault("interval", "epoch")
    if isinstance(config.get("distributed"), dict):
        for key, (default, _) in DISTRIBUTED.items():
            config["distributed"].setdefault(key, default)
    return config


def _validate_section(name: str, section: Any, source: str) -> None:
    allowed = SECTION_KEYS | EXTRA_SECTION_KEYS.get(name, set())
    if not isinstance(section, dict):
        raise ConfigError(f'{source}: {name}: must be {{"type": ..., "args": {{...}}}}')
    for key in section:
        if key not in allowed:
            raise ConfigError(f"{source}: {name}.{key}: unknown key (allowed: {sorted(allowed)})")
    if "type" not in section:
        raise ConfigError(f"{source}: {name}.type: missing required key")
    _check_value(section["type"], STRING, f"{name}.type", source)
    if not isinstance(section["args"], dict):
        raise ConfigError(f"{source}: {name}.args: must be an object {{...}}")
    for key, value in section["args"].items():
        if (name, key) in KNOWN_ARGS:
            _check_value(value, KNOWN_ARGS[(name, key)], f"{name}.args.{key}", source)
    if name == "data_loader":
        _check_data_loader_args(section["args"], source)
    if name == "lr_scheduler":
        if section["interval"] not in SCHEDULER_INTERVALS:
            raise ConfigError(
                f"{source}: lr_scheduler.interval: must be one of {SCHEDULER_INTERVALS}, "
                f"got {json.dumps(section['interval'])}"
            )
        if section["type"] in METRIC_SCHEDULERS and section["interval"] == "step":
            raise ConfigError(
                f'{source}: lr_scheduler.interval: must be "epoch" for {section["type"]}, '
                'which steps on the monitored metric once per epoch; got "step"'
            )
    if "freeze" in section:
        _check_value(section["freeze"], PREFIX_LIST, f"{name}.freeze", source)
    if "param_groups" in section:
        _check_param_groups(section["param_groups"], source)


def _check_param_groups(groups: Any, source: str) -> None:
    """optimizer.param_groups: [{"params": PREFIX or [PREFIX, ...], <optimizer option>: ...}]."""
    if not isinstance(groups, list):
        raise ConfigError(
            f'{source}: optimizer.param_groups: must be a list of {{"params": ..., "lr": ...}} '
            f"objects, got {json.dumps(groups)}"
        )
    for index, group in enumerate(groups):
        where = f"optimizer.param_groups[{index}]"
        if not isinstance(group, dict) or "params" not in group:
            raise ConfigError(
                f'{source}: {where}: must be an object with "params" (parameter-name prefixes) '
                f"and the group's optimizer options, got {json.dumps(group)}"
            )
        params = group["params"]
        _check_value(
            [params] if isinstance(params, str) else params, PREFIX_LIST, f"{where}.params", source
        )
        if not params:
            raise ConfigError(f"{source}: {where}.params: must name at least one prefix")
        for key, value in group.items():
            if ("optimizer", key) in KNOWN_ARGS:
                _check_value(value, KNOWN_ARGS[("optimizer", key)], f"{where}.{key}", source)


def _check_data_loader_args(args: dict, source: str) -> None:
    """data_loader.args that contradict each other: sampler options, shuffle, folds and fold."""
    sampler = args.get("sampler", "random")
    if args.get("shuffle") is False:
        if sampler != "sequential" and "sampler" in args:
            raise ConfigError(
                f'{source}: data_loader.args.shuffle: false contradicts sampler "{sampler}"; '
                "remove shuffle"
            )
        sampler = "sequential"  # shuffle false is the older spelling
    for key, samplers in SAMPLER_ARGS.items():
        if args.get(key) is not None and sampler not in samplers:
            raise ConfigError(
                f"{source}: data_loader.args.{key}: only used by sampler "
                f"{' or '.join(json.dumps(name) for name in samplers)}, not {json.dumps(sampler)}; "
                "remove it"
            )
    folds, fold = args.get("folds"), args.get("fold")
    if fold is not None and folds is None:
        raise ConfigError(
            f"{source}: data_loader.args.fold: needs data_loader.args.folds, the number of folds"
        )
    if fold is not None and fold >= folds:
        raise ConfigError(
            f"{source}: data_loader.args.fold: must be a fold index from 0 to {folds - 1} "
            f"(folds is {folds}), got {fold}"
        )


def parse_monitor(monitor: str, metric_names: list[str], source: str) -> tuple[str, str]:
    """'max val/accuracy' -> ('max', 'val/accuracy'); 'off' -> ('off', '')."""
    if monitor == "off":
        return "off", ""
    mode, _, name = monitor.partition(" ")
    if mode not in ("min", "max"):
        raise ConfigError(
            f'{source}: trainer.monitor: must be "off" or "min|max <metric>", got "{monitor}"'
        )
    match = MONITOR_PATTERN.fullmatch(name.strip())
    known = [
        f"{split}/{metric}" for split in ("val", "train") for metric in ["loss", *metric_names]
    ]
    key = f"{match.group(1)}/{match.group(2)}" if match else name.strip()
    if key not in known:
        raise ConfigError(
            f'{source}: trainer.monitor: unknown metric "{name.strip()}" '
            f"(choose from {', '.join(known)})"
        )
    return mode, key


def validate(config: dict, source: str) -> dict:
    """Check every key of a config; return a copy with defaults filled in."""
    config = with_defaults(config)
    for key in config:
        if key not in TOP_LEVEL:
            raise ConfigError(f"{source}: {key}: unknown key (known: {', '.join(TOP_LEVEL)})")
    for key, (_, check) in TOP_LEVEL.items():
        if key not in config:
            raise ConfigError(f"{source}: {key}: missing required key")
        value = config[key]
        if check == "section":
            if not (key == "lr_scheduler" and value is None):
                _validate_section(key, value, source)
        elif check in ("trainer", "distributed"):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {key}: must be an object {{...}}")
        else:
            _check_value(value, check, key, source)
    trainer = config["trainer"]
    for key in trainer:
        if key not in TRAINER:
            raise ConfigError(f"{source}: trainer.{key}: unknown key (known: {', '.join(TRAINER)})")
    for key, (_, check) in TRAINER.items():
        if key not in trainer:
            raise ConfigError(f"{source}: trainer.{key}: missing required key")
        _check_value(trainer[key], check, f"trainer.{key}", source)
    for key, value in config["distributed"].items():
        if key not in DISTRIBUTED:
            raise ConfigError(
                f"{source}: distributed.{key}: unknown key (known: {', '.join(DISTRIBUTED)})"
            )
        _check_value(value, DISTRIBUTED[key][1], f"distributed.{key}", source)
    if trainer["deterministic"] and trainer["cudnn_benchmark"]:
        raise ConfigError(
            f"{source}: trainer.cudnn_benchmark: must be false when trainer.deterministic is true "
            "(benchmarking picks kernels by timing)"
        )
    parse_monitor(trainer["monitor"], config["metrics"], source)
    return config


def new_run_id() -> str:
    """A run id that sorts by start time and does not collide for runs started in the same second."""
    return f"{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


class ConfigParser:
    """A validated config plus where this run's outputs go.

    config["optimizer"]["args"]["lr"] reads the config; init_obj / init_ftn build objects from
    {"type", "args"} sections, looking the type up only in the module they are given.
    """

    def __init__(
        self,
        config: dict,
        *,
        source: str,
        run_id: str | None = None,
        resume: Path | None = None,
        run_dir: Path | None = None,
    ) -> None:
        self.source = source
        self.config = validate(config, source)
        # Whether the user named the run (--run-id, or resuming one): else main() may pick
        # a shared default for all ranks under torchrun.
        self.run_id_given = run_id is not None
        self.run_id = run_id or new_run_id()
        self.resume = resume
        self.run_dir = run_dir
        # -r CKPT with -c CONFIG: a new run from the checkpoint's weights (see BaseTrainer.resume);
        # with --continue it keeps the checkpoint's epoch count and training state.
        self.fine_tune = False
        self.continue_run = False
        self.monitor_mode, self.monitor_key = parse_monitor(
            self.config["trainer"]["monitor"], self.config["metrics"], source
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ConfigParser":
        """Build from train.py/test.py arguments: -c, -r, --run-id, the shortcuts and --set."""
        run_dir = None
        resume = Path(args.resume) if getattr(args, "resume", None) else None
        continue_run = bool(getattr(args, "continue_run", False))
        if continue_run and not (resume is not None and args.config):
            raise ConfigError(
                "--continue: only with -r CHECKPOINT -c CONFIG (a plain -r always continues its run)"
            )
        if resume is not None and resume.is_dir():
            # A run folder: resume from its newest checkpoint, or restart one that stopped before
            # its first checkpoint (it holds only its config.json).
            latest = latest_checkpoint(resume)
            if latest is None and not is_restartable(resume):
                raise ConfigError(f"{resume}: no checkpoint-epoch*.pth in this run folder")
            if latest is None and args.config:
                raise ConfigError(
                    f"{resume}: no checkpoint to start from; drop -c to restart this run with its "
                    "own config.json"
                )
            if latest is None:
                run_dir, resume = resume, None
            else:
                resume = latest
        if args.config:
            source = args.config
        elif run_dir is not None:
            source = str(run_dir / "config.json")
        elif resume is not None:
            # Resuming without -c: the run's own config, saved beside its checkpoints.
            source = str(resume.parent / "config.json")
            if not resume.is_file():
                raise ConfigError(f"{resume}: checkpoint not found")
            if not Path(source).is_file():
                raise ConfigError(f"{source}: not found beside the checkpoint; pass -c CONFIG")
            run_dir = resume.parent
        else:
            raise ConfigError("no config given: pass -c CONFIG (or -r CHECKPOINT to resume)")
        config = with_defaults(load_json(Path(source)))

        overrides = [
            (["optimizer", "args", "lr"], getattr(args, "lr", None), "--lr"),
            (["data_loader", "args", "batch_size"], getattr(args, "bs", None), "--bs"),
            (["trainer", "epochs"], getattr(args, "epochs", None), "--epochs"),
            (["data_loader", "args", "folds"], getattr(args, "folds", None), "--folds"),
            (["data_loader", "args", "fold"], getattr(args, "fold", None), "--fold"),
        ]
        fold_flags = [getattr(args, "folds", None), getattr(args, "fold", None)]
        if run_dir is not None and fold_flags != [None, None]:
            raise ConfigError(
                f"--folds/--fold: {resume} continues its own run, folds included; "
                "start a new run with -c CONFIG to cross-validate"
            )
        for keys, value, flag in overrides:
            if value is not None:
                apply_override(config, keys, value, flag)
        for text in getattr(args, "set", None) or []:
            keys, value = parse_override(text)
            apply_override(config, keys, value, f"--set {text}")

        run_id = getattr(args, "run_id", None)
        if run_id is not None and not NAME[0](run_id):
            raise ConfigError(f"--run-id {run_id!r}: must be {NAME[1]}")
        if run_dir is not None:
            run_id = run_id or run_dir.name
        parser = cls(config, source=source, run_id=run_id, resume=resume, run_dir=run_dir)
        parser.fine_tune = resume is not None and bool(args.config)
        parser.continue_run = continue_run
        if run_dir is not None and run_dir.name == f"fold-{parser.fold}":
            # A fold's checkpoints lie in <run folder>/fold-<i>/: its run is the folder above.
            parser.run_dir = run_dir.parent
            parser.run_id = getattr(args, "run_id", None) or run_dir.parent.name
        return parser

    @property
    def fold(self) -> int | None:
        """The cross-validation fold this run trains (data_loader.args.fold), or None."""
        return self.config["data_loader"]["args"].get("fold")

    @property
    def num_folds(self) -> int | None:
        """The number of cross-validation folds (data_loader.args.folds), or None."""
        return self.config["data_loader"]["args"].get("folds")

    def for_fold(self, fold: int) -> "ConfigParser":
        """This config training cross-validation fold `fold`, in the same run folder."""
        config = copy.deepcopy(self.config)
        config["data_loader"]["args"]["fold"] = fold
        parser = ConfigParser(
            config, source=self.source, run_id=self.run_id, resume=self.resume, run_dir=self.run_dir
        )
        parser.fine_tune, parser.continue_run = self.fine_tune, self.continue_run
        return parser

    @property
    def run_checkpoint_dir(self) -> Path:
        """saved/models/<name>/<run_id>; resuming continues in the checkpoint's own run."""
        save_dir = Path(self.config["trainer"]["save_dir"])
        return self.run_dir or save_dir / "models" / self.config["name"] / self.run_id

    @property
    def run_log_dir(self) -> Path:
        """saved/log/<name>/<run_id>."""
        return Path(self.config["trainer"]["save_dir"]) / "log" / self.config["name"] / self.run_id

    @property
    def checkpoint_dir(self) -> Path:
        """This run's checkpoints: run_checkpoint_dir, or its fold-<i>/ when training one fold."""
        return self._in_fold(self.run_checkpoint_dir)

    @property
    def log_dir(self) -> Path:
        """This run's logs: run_log_dir, or its fold-<i>/ when training one fold."""
        return self._in_fold(self.run_log_dir)

    def _in_fold(self, run_dir: Path) -> Path:
        return run_dir if self.fold is None else run_dir / f"fold-{self.fold}"

    def __getitem__(self, name: str) -> Any:
        return self.config[name]

    def lookup(self, module: ModuleType, name: str, where: str) -> Callable:
        """The public callable `name` of `module`; the error lists what is available there."""
        available = sorted(getattr(module, "__all__", None) or _public_callables(module))
        if name not in available:
            raise ConfigError(
                f"{self.source}: {where}: unknown name {name!r} in {module.__name__} "
                f"(available: {', '.join(available)})"
            )
        return getattr(module, name)

    def init_obj(self, name: str, module: ModuleType, *args: Any, **kwargs: Any) -> Any:
        """module.<config[name].type>(*args, **config[name].args, **kwargs).

        Arguments that do not fit the signature are a ConfigError, and so is a bad value: a
        ConfigValueError from the project's own classes, or a TypeError / ValueError from
        torch's (e.g. "Invalid momentum value: -1"). Anything else raised inside the project's
        own constructor is a bug and keeps its traceback.
        """
        target, config_args = self._resolve(name, module, kwargs)
        try:
            inspect.signature(target).bind(*args, **config_args, **kwargs)
        except TypeError as error:
            raise ConfigError(f"{self.source}: {name}.args: {error}") from None
        except ValueError:
            pass  # some builtins have no inspectable signature; the call itself will tell
        is_torch = module.__name__ == "torch" or module.__name__.startswith("torch.")
        try:
            return target(*args, **config_args, **kwargs)
        except ConfigValueError as error:
            raise ConfigError(f"{self.source}: {name}.args: {error}") from None
        except (TypeError, ValueError) as error:
            if not is_torch:
                raise
            raise ConfigError(f"{self.source}: {name}.args: {error}") from None

    def init_ftn(self, name: str, module: ModuleType, *args: Any, **kwargs: Any) -> Callable:
        """functools.partial(module.<config[name].type>, *args, **config[name].args, **kwargs)."""
        target, config_args = self._resolve(name, module, kwargs)
        return functools.partial(target, *args, **config_args, **kwargs)

    def _resolve(self, name: str, module: ModuleType, kwargs: dict) -> tuple[Callable, dict]:
        section = self.config[name]
        config_args = dict(section["args"])
        clashing = sorted(set(config_args) & set(kwargs))
        if clashing:
            raise ConfigError(
                f"{self.source}: {name}.args: {', '.join(clashing)} is set by the program; "
                "remove it from the config"
            )
        return self.lookup(module, section["type"], f"{name}.type"), config_args


def _public_callables(module: ModuleType) -> list[str]:
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and callable(value) and not isinstance(value, ModuleType)
    ]
