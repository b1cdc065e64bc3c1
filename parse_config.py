"""The validated config of a run, where its outputs go, and the objects it builds.

Parsing is pure: nothing here creates folders, configures logging or seeds RNGs.
Every user mistake raises ConfigError with the file and the key path in its message.
The keys are declared in config_schema.py; utils/config/load_config.py reads, overrides and checks them.
"""

import argparse
import copy
import functools
import inspect
import secrets
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from utils import ConfigValueError
from utils.config.config_checks import NAME, metric_names
from utils.config.keywords import check_keywords
from utils.config.load_config import (
    ConfigError,
    apply_override,
    load_json,
    parse_monitor,
    parse_override,
    validate,
    with_defaults,
)

# What `from parse_config import ...` offers: the parser and, for callers, the steps it takes.
__all__ = [
    "ConfigError",
    "ConfigParser",
    "apply_override",
    "load_json",
    "new_run_id",
    "parse_monitor",
    "parse_override",
    "validate",
    "with_defaults",
]


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
        # --allow-data-change: resume (or test.py --split val) on data other than the checkpoint's.
        self.allow_data_change = False
        self.monitor_mode, self.monitor_key = parse_monitor(
            self.config["trainer"]["monitor"],
            metric_names(self.config["metrics"]),
            source,
            ema=self.config["trainer"]["ema_decay"] is not None,
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
        if resume is not None and resume.is_dir() and not args.config:
            # A run folder: train.py resumes the newest checkpoint of its timeline that loads,
            # or restarts a run that stopped before its first checkpoint (only config.json).
            run_dir = resume
        if args.config:
            source = args.config
        elif run_dir is not None:
            source = str(run_dir / "config.json")
            if not Path(source).is_file() and (run_dir / "fold-0").is_dir():  # not "not found"
                raise ConfigError(
                    f"{run_dir}: the run folder of a cross-validation; name one of its folds, "
                    f"e.g. -r {run_dir / 'fold-0'}"
                )
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
        parser.allow_data_change = bool(getattr(args, "allow_data_change", False))
        if run_dir is not None and run_dir.name == f"fold-{parser.fold}":
            # A fold's checkpoints lie in <run folder>/fold-<i>/: its run is the folder above.
            parser.run_dir = run_dir.parent
            parser.run_id = getattr(args, "run_id", None) or run_dir.parent.name
        if parser.run_dir is not None and parser.run_id != parser.run_dir.name:
            # Its checkpoints would go on in run_dir, its logs into another run's log folder.
            raise ConfigError(
                f"--run-id {parser.run_id}: -r continues the run {parser.run_dir.name} "
                f"({parser.run_dir}); drop --run-id, or fine-tune into a new run with -c CONFIG"
            )
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
        parser.allow_data_change = self.allow_data_change
        return parser

    @property
    def run_checkpoint_dir(self) -> Path:
        """saved/models/<name>/<run_id>; resuming continues in the checkpoint's own run."""
        save_dir = Path(self.config["trainer"]["save_dir"])
        return self.run_dir or save_dir / "models" / self.config["name"] / self.run_id

    @property
    def experiment_log_dir(self) -> Path:
        """saved/log/<name>, the logs of the experiment's runs. A resumed run's follow its run
        folder, never another run's: <X>/log/<name> beside <X>/models/<name>/<run>, whatever
        trainer.save_dir says; a run folder elsewhere (a copy) keeps them in its own log/."""
        if self.run_dir is None:
            return Path(self.config["trainer"]["save_dir"]) / "log" / self.config["name"]
        run_dir = self.run_dir.absolute()
        if run_dir.parent.parent.name == "models":
            return run_dir.parent.parent.parent / "log" / run_dir.parent.name
        return run_dir / "log"  # utils/state/run_folder.py LOG_FOLDER: not one of the run's files

    @property
    def run_log_dir(self) -> Path:
        """saved/log/<name>/<run_id>: experiment_log_dir/<run_id>."""
        return self.experiment_log_dir / self.run_id

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

    def init_obj(
        self,
        name: str,
        module: ModuleType,
        *args: Any,
        overrides: dict | None = None,
        **kwargs: Any,
    ) -> Any:
        """module.<config[name].type>(*args, **config[name].args, **kwargs).

        overrides: values that replace some of config[name].args, which the program derives
        from them (e.g. a learning rate scaled to the batch); kwargs must not collide with args.

        Arguments that do not fit the signature are a ConfigError, and so is a bad value: a
        ConfigValueError from the project's own classes, or a TypeError / ValueError from
        torch's (e.g. "Invalid momentum value: -1"). Anything else raised inside the project's
        own constructor is a bug and keeps its traceback.
        """
        target, config_args = self._resolve(name, module, kwargs)
        config_args.update(overrides or {})
        check_keywords(self.source, name, self.config[name]["type"], target, config_args, kwargs)
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
