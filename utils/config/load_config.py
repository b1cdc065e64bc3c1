"""Read a config file, apply overrides, fill in defaults and check it against config_schema.

Parsing is pure: nothing here creates folders, configures logging or seeds RNGs.
Every user mistake raises ConfigError with the file and the key path in its message.
"""

import copy
import dataclasses
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from config_schema import (
    REQUIRED,
    Config,
    DataLoaderSection,
    OptimizerArgs,
    OptimizerSection,
    SchedulerSection,
    Section,
    TrainerConfig,
)
from utils.config.config_checks import (
    PARAM_KINDS,
    PREFIX_LIST,
    STRING,
    Check,
    Marker,
    check_across_sections,
    check_metric_names,
    check_trainer,
    metric_names,
    read_json,
)
from utils.config.monitor import parse_monitor
from utils.util import ConfigError

# data_loader.args that only one kind of sampler reads: setting them for another is a mistake.
SAMPLER_ARGS = {
    "replacement": ("random",),
    "num_samples": ("random", "weighted"),
    "class_weights": ("weighted",),
}
# Learning-rate schedulers that step on a metric, once per validated epoch.
METRIC_SCHEDULERS = ("ReduceLROnPlateau",)


def load_json(path: Path) -> dict:
    """Read a JSON object from `path`; syntax errors give line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config file: {error.strerror}") from None
    try:
        config = read_json(text, str(path))
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
    # Python's spellings are strings here, and a constructor takes the string "False" as true.
    if spelled := {"True": "true", "False": "false", "None": "null"}.get(raw_value):
        raise ConfigError(f"--set {text!r}: {raw_value} is no JSON; write {key_path}={spelled}")
    try:
        value = read_json(raw_value, f"--set {text!r}")
    except json.JSONDecodeError:
        value = raw_value
    return keys, value


def apply_override(config: dict, keys: list[str], value: Any, source: str) -> None:
    """Set config[k1][k2]... = value. The path must exist or be declared in config_schema.py (an
    optional key the file leaves out, e.g. arch.freeze), except a new key inside an `args` dict."""
    node, schema = config, Config
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
        declared = _declared_fields(schema)
        if key not in node and key in declared and not is_last:
            raise ConfigError(f"{source}: {where}: not in the config; set it whole ({where}=...)")
        if key not in node and not new_argument and not (is_last and key in declared):
            known = ", ".join(sorted(set(node) | set(declared))) or "nothing"
            raise ConfigError(f"{source}: {where}: unknown key (known here: {known})")
        schema = _nested_schema(declared[key]) if key in declared else None
        if is_last:
            node[key] = value
        else:
            node = node[key]


def _declared_fields(schema: type | None) -> dict[str, dataclasses.Field]:
    """The keys config_schema.py declares for a section (none for `args` and lists)."""
    return {item.name: item for item in dataclasses.fields(schema)} if schema else {}


def _nested_schema(item: dataclasses.Field) -> type | None:
    """The dataclass describing the field's value, when it is a section of its own."""
    for candidate in (item.type, *typing.get_args(item.type)):
        if dataclasses.is_dataclass(candidate):
            return candidate
    return None


def with_defaults(config: dict) -> dict:
    """A copy with every missing optional key filled in (no checking)."""
    config = copy.deepcopy(config)
    _fill_defaults(config, Config)
    return config


def _fill_defaults(values: dict, schema: type) -> None:
    for item in dataclasses.fields(schema):
        # REQUIRED and OPTIONAL keys stay absent; known_args are the constructor's to fill in.
        if item.name not in values and not isinstance(item.metadata["default"], Marker):
            values[item.name] = copy.deepcopy(item.metadata["default"])
        nested = _nested_schema(item)
        if nested is not None and isinstance(values.get(item.name), dict):
            _fill_defaults(values[item.name], nested)


def _check_value(value: Any, check: Check, where: str, source: str) -> None:
    predicate, what = check
    if not predicate(value):
        raise ConfigError(f"{source}: {where}: must be {what}, got {json.dumps(value)}")


def validate(config: dict, source: str) -> dict:
    """Check every key of a config; return a copy with defaults filled in."""
    config = with_defaults(config)
    _check_section(config, Config, "", source)
    check_across_sections(config, source)
    check_metric_names(config["metrics"], source)
    ema = config["trainer"]["ema_decay"] is not None
    parse_monitor(config["trainer"]["monitor"], metric_names(config["metrics"]), source, ema=ema)
    return config


def _check_section(values: Any, schema: type, where: str, source: str) -> None:
    """`values` against one schema dataclass: no unknown key, every required one, each checked."""
    prefix = f"{where}." if where else ""
    builds = issubclass(schema, Section)  # a {"type", "args"} section
    if not isinstance(values, dict):
        shape = '{"type": ..., "args": {...}}' if builds else "an object {...}"
        raise ConfigError(f"{source}: {where}: must be {shape}")
    names = [item.name for item in dataclasses.fields(schema)]
    for key in values:
        if key not in names:
            known = f"allowed: {sorted(names)}" if builds else f"known: {', '.join(names)}"
            raise ConfigError(f"{source}: {prefix}{key}: unknown key ({known})")
    for item in dataclasses.fields(schema):
        if item.name in values:
            _check_field(values[item.name], item, prefix + item.name, source)
        elif item.metadata["default"] is REQUIRED:
            raise ConfigError(f"{source}: {prefix}{item.name}: missing required key")
        # The args a section knows are checked once args is known to be an object.
        if builds and item.name == "args" and schema.known_args is not None:
            _check_known_args(values["args"], schema.known_args, f"{prefix}args", source)
    if schema in CROSS_CHECKS:
        CROSS_CHECKS[schema](values, source)


def _check_field(value: Any, item: dataclasses.Field, where: str, source: str) -> None:
    nested = _nested_schema(item)
    # A key that is a name or a section (loss): a name is checked as a value.
    if nested is not None and not (isinstance(value, str) and str in typing.get_args(item.type)):
        # A section that defaults to null (lr_scheduler) may be null: there is none.
        if not (value is None and item.metadata["default"] is None):
            _check_section(value, nested, where, source)
    elif item.metadata["check"] is not None:
        _check_value(value, item.metadata["check"], where, source)
    elif not isinstance(value, dict):  # keyword arguments (args)
        raise ConfigError(f"{source}: {where}: must be an object {{...}}")


def _check_known_args(args: dict, schema: type, where: str, source: str) -> None:
    """The keys of `args` that `schema` declares; any others are the constructor's to check."""
    checks = {item.name: item.metadata["check"] for item in dataclasses.fields(schema)}
    for key, value in args.items():
        if key in checks:
            _check_value(value, checks[key], f"{where}.{key}", source)


def _check_scheduler(section: dict, source: str) -> None:
    metric_scheduler = section["type"] in METRIC_SCHEDULERS
    if metric_scheduler and section["interval"] == "step":
        raise ConfigError(
            f'{source}: lr_scheduler.interval: must be "epoch" for {section["type"]}, '
            'which steps on the monitored metric once per epoch; got "step"'
        )
    epochs, steps = section["warmup_epochs"], section["warmup_steps"]
    if epochs and steps:
        raise ConfigError(
            f"{source}: lr_scheduler.warmup_steps: set warmup_epochs or warmup_steps, not both"
        )
    if (epochs or steps) and metric_scheduler:
        raise ConfigError(
            f"{source}: lr_scheduler.warmup_epochs: {section['type']} cannot follow a warmup "
            "(it steps on a metric, not on a count); warm up with another schedule"
        )
    if section["interval"] == "epoch" and steps:
        raise ConfigError(
            f'{source}: lr_scheduler.warmup_steps: needs "interval": "step" (this schedule '
            "steps once per epoch); use warmup_epochs"
        )
    if section["interval"] == "epoch" and epochs != int(epochs):
        raise ConfigError(
            f"{source}: lr_scheduler.warmup_epochs: must be a whole number of epochs for a "
            f'schedule that steps once per epoch, got {epochs}; or set "interval": "step"'
        )


def _check_param_groups(section: dict, source: str) -> None:
    """optimizer.param_groups: [{"params": PREFIX or [PREFIX, ...], "kind": KIND, <optimizer
    option>: ...}], with params, kind or both (utils/optim/optimizer.py's PARAM_KINDS)."""
    for index, group in enumerate(section.get("param_groups") or []):
        where = f"optimizer.param_groups[{index}]"
        if not isinstance(group, dict) or not ("params" in group or "kind" in group):
            raise ConfigError(
                f'{source}: {where}: must be an object with "params" (parameter-name prefixes) '
                f'or "kind", and the group\'s optimizer options, got {json.dumps(group)}'
            )
        if "kind" in group and group["kind"] not in PARAM_KINDS:
            raise ConfigError(
                f"{source}: {where}.kind: must be one of {', '.join(PARAM_KINDS)}, got "
                f"{json.dumps(group['kind'])}"
            )
        params = group.get("params", ["(any)"])
        _check_value(
            [params] if isinstance(params, str) else params, PREFIX_LIST, f"{where}.params", source
        )
        if not params:
            raise ConfigError(f"{source}: {where}.params: must name at least one prefix")
        _check_known_args(group, OptimizerArgs, where, source)
        if "optimizer" in group:  # a torch.optim class's name: build_optimizer checks it
            _check_value(group["optimizer"], STRING, f"{where}.optimizer", source)


def _check_data_loader(section: dict, source: str) -> None:
    """data_loader.args that contradict each other: sampler options, shuffle, folds and fold."""
    args = section["args"]
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


# Checks across the keys of one section, run once each key has passed its own check.
CROSS_CHECKS: dict[type, Callable[[dict, str], None]] = {
    DataLoaderSection: _check_data_loader,
    OptimizerSection: _check_param_groups,
    SchedulerSection: _check_scheduler,
    TrainerConfig: check_trainer,
}
