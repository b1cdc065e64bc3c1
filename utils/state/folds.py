"""K-fold cross-validation outputs: each finished fold's result, and the summary over all folds.

A run of K folds keeps fold i in <run folder>/fold-<i>/. A fold is finished when its training
returned (it ran to its last epoch or stopped early): train.py then writes fold-<i>/result.json.
Once every fold has one, folds_summary.json in the run folder gives the mean and standard
deviation over the folds; so folds run one at a time (--fold i) are summarised by the last to
finish, wherever it ran.
"""

import json
import logging
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from utils.distributed.process_group import ProcessInfo, broadcast_object
from utils.state.checkpoint import load_checkpoint, write_text_atomic
from utils.state.run_folder import SUMMARY, default_run_id
from utils.state.timeline import choose

if TYPE_CHECKING:
    from parse_config import ConfigParser

RESULT = "result.json"


def write_fold_result(config: "ConfigParser") -> dict:
    """Record a finished fold: the epoch and metrics of its model_best.pth (of its last
    checkpoint when trainer.monitor is off). Returns what was written."""
    checkpoint_dir = config.checkpoint_dir
    best = checkpoint_dir / "model_best.pth"
    use_best = config.monitor_mode != "off" and best.is_file()
    path = best if use_best else choose(checkpoint_dir, logging.getLogger("train")).path
    state = load_checkpoint(path)
    result = {
        "fold": config.fold,
        "checkpoint": path.name,
        "epoch": state["epoch"],
        "metrics": state["metrics"],
    }
    write_text_atomic(checkpoint_dir / RESULT, json.dumps(result, indent=4) + "\n")
    return result


def summarize_folds(run_dir: Path, num_folds: int, monitor: tuple[str, str]) -> dict | None:
    """Mean and sample standard deviation over the folds of the monitored metric and of every
    validation metric, with each fold's value; None while a fold has no result yet.

    monitor: (mode, key) as ConfigParser parses trainer.monitor, ("off", "") for none.
    """
    results = []
    for fold in range(num_folds):
        path = run_dir / f"fold-{fold}" / RESULT
        if not path.is_file():
            return None
        results.append(json.loads(path.read_text(encoding="utf-8")))
    mode, monitor_key = monitor
    keys = [key for key in results[0]["metrics"] if key.startswith("val/")]
    if monitor_key:
        keys = [monitor_key, *(key for key in keys if key != monitor_key)]
    metrics = {}
    for key in keys:
        values = [result["metrics"][key] for result in results if key in result["metrics"]]
        if len(values) == num_folds:  # folds trained with other metrics leave theirs out
            metrics[key] = {
                "mean": statistics.fmean(values),
                "std": statistics.stdev(values),
                "folds": values,
            }
    return {
        "num_folds": num_folds,
        "monitor": f"{mode} {monitor_key}" if monitor_key else "off",
        "folds": [
            {
                "fold": result["fold"],
                "checkpoint": f"fold-{result['fold']}/{result['checkpoint']}",
                "epoch": result["epoch"],
            }
            for result in results
        ],
        "metrics": metrics,
    }


def finish_fold(config: "ConfigParser") -> dict | None:
    """Write the fold's result and, when every fold has one, the summary; returns the summary."""
    write_fold_result(config)
    run_dir = config.run_checkpoint_dir
    summary = summarize_folds(run_dir, config.num_folds, (config.monitor_mode, config.monitor_key))
    if summary is not None:
        write_text_atomic(run_dir / SUMMARY, json.dumps(summary, indent=4) + "\n")
    return summary


def summary_lines(summary: dict) -> list[str]:
    """The summary as log lines: one per metric, mean +- std and the value of each fold."""
    chosen = "best epoch" if summary["monitor"] != "off" else "last epoch"
    lines = [
        f"Cross-validation over {summary['num_folds']} folds "
        f"({chosen} of each fold, monitor {summary['monitor']}):"
    ]
    for key, values in summary["metrics"].items():
        folds = " ".join(f"{value:.4f}" for value in values["folds"])
        lines.append(f"  {key:<20} {values['mean']:.4f} +- {values['std']:.4f}  (folds: {folds})")
    return lines


def cross_validate(
    config: "ConfigParser",
    info: ProcessInfo,
    device: torch.device,
    train: Callable[
        ["ConfigParser", ProcessInfo, torch.device, Callable[["ConfigParser"], dict | None]],
        dict | None,
    ],
) -> dict | None:
    """train() fold data_loader.args.fold, or every fold in turn, each in the run's fold-<i>/;
    once every fold has finished, write folds_summary.json (rank 0). Returns the summary (None
    on the other ranks, and while a fold has no result yet).

    train(fold config, info, device, finish) calls finish_fold on rank 0 while it still holds
    the fold's lock: no other process takes the folders while the result is written."""
    if not config.run_id_given:
        # Every fold (and rank) writes into one run folder: name it before the first fold.
        config.run_id = default_run_id(config.run_id, broadcast_object)
    summary = None
    for fold in range(config.num_folds) if config.fold is None else [config.fold]:
        fold_config = config.for_fold(fold)
        summary = train(fold_config, info, device, finish_fold)
    if info.is_main and summary is None:
        # Nothing else trains them: a resumed fold (-r fold-<i>/) runs that fold alone, so name
        # what is missing and how to train it rather than let the user wait for the summary.
        run_dir = config.run_checkpoint_dir
        missing = [
            i for i in range(config.num_folds) if not (run_dir / f"fold-{i}" / RESULT).is_file()
        ]
        logging.getLogger("train").info(
            "Fold %d finished; %s follows when every fold (0 to %d) has. Without a result yet: "
            "fold %s; train each with --folds %d --fold <i> --run-id %s (one that has started: "
            "-r %s)",
            fold, SUMMARY, config.num_folds - 1, ", ".join(map(str, missing)), config.num_folds,
            config.run_id, run_dir / "fold-<i>",
        )  # fmt: skip
    return summary
