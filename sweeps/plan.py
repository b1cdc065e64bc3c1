"""sweep.py's flags made into a checked sweep, before anything runs or is written.

The config is read as train.py reads it (load_json, with_defaults, --set through
parse_override and apply_override), and every trial's config goes through ConfigParser, the
project's validation, so a trial that train.py would refuse stops the sweep before it starts.
"""

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parse_config import ConfigParser, apply_override, load_json, parse_override, with_defaults
from sweeps.optuna_search import require_optuna
from sweeps.space import (
    Dimension,
    SweepError,
    Trial,
    build_space,
    check_keys_exist,
    corner_trials,
    describe,
    describe_values,
    grid_trials,
    random_trials,
    trial_config,
)
from utils.config.config_checks import NAME


@dataclass
class Sweep:
    """A checked sweep: where it goes, its space, its trials and what ranks them."""

    name: str
    sweep_dir: Path  # <save_dir>/sweeps/<name>
    method: str  # "grid", "random" or "optuna"
    dimensions: list[Dimension]
    trials: list[Trial]  # grid and random; Optuna's come from its study
    num_trials: int
    seed: int
    base: dict  # the config file with --set applied and defaults filled in
    monitor: str  # trainer.monitor, e.g. "max val/accuracy"
    mode: str  # "min" or "max"
    key: str  # the monitored metric, e.g. "val/accuracy"

    @property
    def sweep_values(self) -> dict[str, Any]:
        """What the sweep sets in every trial: its run folder under the sweep's, resumed there."""
        values = {"trainer.save_dir": str(self.sweep_dir), "trainer.auto_resume": True}
        if self.method == "optuna":  # it prunes on per-epoch values, read from the checkpoints
            values["trainer.save_period"] = 1
        return values

    @property
    def definition(self) -> dict:
        """What makes two runs of sweep.py the same sweep (the number of trials may grow)."""
        return {
            "method": self.method,
            "space": describe(self.dimensions),
            "seed": None if self.method == "grid" else self.seed,
            "base config": self.base,
        }

    def parser(self, trial: Trial, source: str = "") -> ConfigParser:
        """The trial's validated config, as train.py will read it."""
        config = trial_config(self.base, trial, self.sweep_values)
        return ConfigParser(config, source=source or trial.name, run_id=trial.name)

    def run_dir(self, trial: Trial) -> Path:
        """The trial's run folder: <sweep folder>/models/<name>/trial-NNN."""
        return self.parser(trial).run_checkpoint_dir


def check_flags(args: argparse.Namespace) -> None:
    """Flags that do not go together."""
    conflicts = [
        (args.submit and not args.slurm, "--submit: only with --slurm"),
        (
            args.slurm and args.optuna is not None,
            "--slurm: not with --optuna (Optuna picks each trial from the ones before it; "
            "run the study where its trials run)",
        ),
        (
            args.trial is not None and (args.slurm or args.optuna is not None),
            "--trial: for grid and random sweeps, without --slurm",
        ),
        (args.requeue_file is not None and args.trial is None, "--requeue-file: only with --trial"),
        (
            args.parallel is not None and args.parallel < 1,
            f"--parallel {args.parallel}: must be 1 or more",
        ),
    ]
    for conflict, message in conflicts:
        if conflict:
            raise SweepError(message)


def plan(args: argparse.Namespace) -> Sweep:
    """Read the config and the space, and check every trial's config."""
    check_flags(args)
    method, dimensions = build_space(
        grid=args.grid,
        uniform=args.uniform,
        log_uniform=args.log_uniform,
        choice=args.choice,
        num_random=args.random,
        num_optuna=args.optuna,
    )
    if method == "optuna":
        require_optuna()
    base = with_defaults(load_json(Path(args.config)))
    for text in args.set:
        keys, value = parse_override(text)
        apply_override(base, keys, value, f"--set {text}")
    check_keys_exist(base, dimensions, args.config)
    parser = ConfigParser(base, source=args.config)
    if parser.monitor_mode == "off":
        raise SweepError(
            f'{args.config}: trainer.monitor: a sweep ranks its trials by it; set e.g. "max '
            'val/accuracy", not "off"'
        )
    name = args.name or base["name"]
    if not NAME[0](name):
        raise SweepError(f"--name {name!r}: must be {NAME[1]}")
    if method == "grid":
        trials = grid_trials(dimensions)
    else:
        trials = random_trials(dimensions, args.random, args.seed) if method == "random" else []
    sweep = Sweep(
        name=name,
        sweep_dir=Path(base["trainer"]["save_dir"]) / "sweeps" / name,
        method=method,
        dimensions=dimensions,
        trials=trials,
        num_trials=len(trials) or args.optuna,
        seed=args.seed,
        base=base,
        monitor=base["trainer"]["monitor"],
        mode=parser.monitor_mode,
        key=parser.monitor_key,
    )
    # Optuna's values come as it runs: check the ends of every range and every choice instead.
    for trial in trials or corner_trials(dimensions):
        source = f"{args.config} with {describe_values(trial.values)}"
        if sweep.parser(trial, source).fold is not None:
            # One fold writes no folds_summary.json: the trial would finish with no value.
            raise SweepError(
                f"{source}: data_loader.args.fold: a sweep ranks a cross-validated trial by "
                "its value over all its folds; drop fold (keep data_loader.args.folds)"
            )
    if args.trial is not None and not 0 <= args.trial < len(trials):
        raise SweepError(f"--trial {args.trial}: this sweep has trials 0 to {len(trials) - 1}")
    return sweep
