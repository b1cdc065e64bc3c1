"""K-fold cross-validation outputs: each finished fold's result, and the summary over all folds.

A run of K folds keeps fold i in <run folder>/fold-<i>/. A fold is finished when its training
returned (it ran to its last epoch or stopped early): train.py then writes fold-<i>/result.json.
Once every fold has one, folds_summary.json in the run folder gives, per metric, its value
pooled over every fold's validation samples (means over samples by their counts, a
StatefulMetric from its sums, which result.json keeps) and the mean and standard deviation of
the folds' values; so folds run one at a time (--fold i) are summarised by the last
to finish, wherever it ran.
"""

import json
import logging
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from utils.distributed.process_group import ProcessInfo, broadcast_object
from utils.evaluation.metric_sums import StatefulMetric, keeps_own_state
from utils.state.checkpoint import load_checkpoint, write_text_atomic
from utils.state.run_folder import SUMMARY, default_run_id
from utils.state.timeline import choose
from utils.util import json_text

if TYPE_CHECKING:
    from parse_config import ConfigParser

RESULT = "result.json"


def write_fold_result(config: "ConfigParser", num_val_samples: int | None, means: set[str]) -> dict:
    """Record a finished fold: the epoch and metrics of its model_best.pth (of its last
    checkpoint when trainer.monitor is off), its number of validation samples (None: not known),
    which metrics are means over them (`means`: model.metric.sample_mean_names) and the sums of
    the others (StatefulMetric: F1's counts per class, R2's), which the summary pools. Returns
    what was written."""
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
        "num_val_samples": num_val_samples,
        "sample_means": sample_mean_keys(means, state["metrics"]),
    }
    if state.get("metric_sums") is not None:  # a checkpoint saved before they were kept: none
        result["metric_sums"] = state["metric_sums"]
    write_text_atomic(checkpoint_dir / RESULT, json_text(result))
    return result


def sample_mean_keys(means: set[str], metrics: dict[str, float]) -> list[str]:
    """The val/ keys of `metrics` that are means over the validation samples (`means`, by name:
    model.metric.sample_mean_names), also of the averaged weights (val/ema_<name>)."""
    return [
        key
        for key in metrics
        if key.startswith("val/") and key.removeprefix("val/").removeprefix("ema_") in means
    ]


def pool(results: list[dict], key: str, metrics: dict[str, Any]) -> tuple[float | None, str]:
    """(`key` over every fold's validation samples, the score of the concatenated out-of-fold
    predictions: each fold's mean weighted by its number of samples, or a StatefulMetric of
    `metrics` (the configured ones, by name) from its sums over the folds; "") or (None, why
    not)."""
    if not key.startswith("val/"):  # a monitored train/ metric: num_val_samples do not count it
        return None, "not a validation metric"
    # val/<name>, val/ema_<name> (the averaged weights'), val/<name>/<class> (a breakdown)
    name = key.removeprefix("val/").removeprefix("ema_").split("/")[0]
    metric = metrics.get(name)
    if isinstance(metric, StatefulMetric):
        return pool_sums(results, key, metric)
    if keeps_own_state(metric):
        return None, "keeps its own state (torchmetrics): a checkpoint has its value, no sums"
    for result in results:
        if "sample_means" not in result:  # result.json written before the summary pooled
            return None, f"fold-{result['fold']}/{RESULT} predates pooling"
        if key not in result["sample_means"]:
            return None, "not a mean over samples"
        if result["num_val_samples"] is None:  # an IterableDataset: not counted ahead
            return None, f"fold {result['fold']}'s number of validation samples is not known"
    counts = [result["num_val_samples"] for result in results]
    values = [
        math.nan if result["metrics"][key] is None else result["metrics"][key] for result in results
    ]
    # value x count is the fold's sum (its mean was that sum / count); fsum rounds the total
    # once, but raises on inf + -inf (folds that diverged): a plain sum gives their nan or inf.
    sums = [v * n for v, n in zip(values, counts, strict=True)]
    total = math.fsum(sums) if all(math.isfinite(v) for v in sums) else sum(sums)
    return total / math.fsum(counts), ""


def pool_sums(results: list[dict], key: str, metric: StatefulMetric) -> tuple[float | None, str]:
    """pool() of a StatefulMetric's `key`: `metric` computed from each of its sums added over
    the folds, as if one epoch had seen every fold's validation samples."""
    sums_key = "/".join(key.split("/")[:2])  # a breakdown's (val/iou/cat) are its metric's
    fold_sums = []
    for result in results:
        if "metric_sums" not in result:  # result.json or checkpoint from before they were kept
            return None, f"fold {result['fold']}'s {RESULT} or checkpoint predates its sums"
        sums = result["metric_sums"].get(sums_key)
        if sums is None or len(sums) != metric.num_sums:  # another metric (args) then
            return None, f"fold {result['fold']} has no sums of this metric as configured now"
        fold_sums.append([math.nan if value is None else value for value in sums])
    totals = [math.fsum(column) for column in zip(*fold_sums, strict=True)]
    if not all(math.isfinite(total) for total in totals):  # a fold that diverged
        return math.nan, ""
    if key == sums_key:
        return metric.compute(totals), ""
    return metric.breakdown(totals).get(key.split("/", 2)[2], math.nan), ""


def summarize_folds(
    run_dir: Path, num_folds: int, monitor: tuple[str, str], metrics: dict[str, Any] | None = None
) -> dict | None:
    """For the monitored metric and every validation metric: its value pooled over all folds'
    samples (means over samples, and `metrics`' StatefulMetrics, the configured metrics by name,
    from their sums; "not_pooled" names the others and why), the mean and sample standard
    deviation of the folds' values, and each fold's value; None while a fold has no result yet.

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
    configured, metrics, not_pooled = metrics or {}, {}, {}
    for key in keys:
        # null: a metric that was NaN or infinite (json_text); nan again, so the mean is too.
        values = [
            math.nan if result["metrics"][key] is None else result["metrics"][key]
            for result in results
            if key in result["metrics"]
        ]
        if len(values) == num_folds:  # folds trained with other metrics leave theirs out
            pooled, why = pool(results, key, configured)
            if pooled is None:
                not_pooled[key] = why
            # A fold's nan or inf (a diverged run): stdev's exact fractions raise on it, and
            # fmean's fsum on inf + -inf; a plain sum gives the mean's nan or inf, the spread nan.
            finite = all(math.isfinite(value) for value in values)
            metrics[key] = {
                **({"pooled": pooled} if pooled is not None else {}),
                "mean_over_folds": statistics.fmean(values) if finite else sum(values) / num_folds,
                "std_over_folds": statistics.stdev(values) if finite else math.nan,
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
        "not_pooled": not_pooled,
    }


def finish_fold(
    config: "ConfigParser",
    num_val_samples: int | None,
    means: set[str],
    metrics: dict[str, Any] | None = None,
) -> dict | None:
    """Write the fold's result and, when every fold has one, the summary (`metrics`: the
    configured ones by name, which pool their sums); returns the summary."""
    write_fold_result(config, num_val_samples, means)
    run_dir = config.run_checkpoint_dir
    monitor = (config.monitor_mode, config.monitor_key)
    summary = summarize_folds(run_dir, config.num_folds, monitor, metrics)
    if summary is None:
        return None
    path, text = run_dir / SUMMARY, json_text(summary)
    # A finished fold run again (resumed, auto_resume) gives the same summary: leave the file
    # as it is, so that nothing that watches or syncs it sees a change that is none.
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        write_text_atomic(path, text)
    return summary


def summary_lines(summary: dict) -> list[str]:
    """The summary as log lines: one per metric (its pooled value, the folds' mean +- std and
    each fold's value), and one naming the metrics not pooled."""
    chosen = "best epoch" if summary["monitor"] != "off" else "last epoch"
    lines = [
        f"Cross-validation over {summary['num_folds']} folds "
        f"({chosen} of each fold, monitor {summary['monitor']}):"
    ]
    for key, values in summary["metrics"].items():
        pooled = f"{values['pooled']:.4f}" if "pooled" in values else "n/a"
        folds = " ".join(f"{value:.4f}" for value in values["folds"])
        lines.append(
            f"  {key:<20} pooled {pooled:<8} mean over folds {values['mean_over_folds']:.4f} "
            f"+- {values['std_over_folds']:.4f}  (folds: {folds})"
        )
    if summary.get("not_pooled"):
        reasons = "; ".join(f"{key} ({why})" for key, why in summary["not_pooled"].items())
        lines.append(f"  not pooled over samples, mean over folds only: {reasons}")
    return lines


def cross_validate(
    config: "ConfigParser",
    info: ProcessInfo,
    device: torch.device,
    train: Callable[
        [
            "ConfigParser",
            ProcessInfo,
            torch.device,
            Callable[["ConfigParser", int | None], dict | None],
        ],
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
