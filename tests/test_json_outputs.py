"""A fold summary over a NaN or infinite value (a fold whose run diverged) is still written."""

import json
import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.state.folds import RESULT, summarize_folds

NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf])
VALUES = st.floats(-1e6, 1e6) | NONFINITE


@settings(max_examples=30, deadline=None)
@given(folds=st.lists(VALUES, min_size=2, max_size=5))
def test_a_fold_summary_over_nonfinite_values_is_numpys_mean_and_std(tmp_path_factory, folds):
    """A fold whose metric is NaN or inf (a run that diverged) still gets a summary: the mean
    and the sample standard deviation are numpy's, the spread unknown (nan) where a value is."""
    run_dir = tmp_path_factory.mktemp("run")
    for fold, value in enumerate(folds):
        (run_dir / f"fold-{fold}").mkdir()
        result = {"fold": fold, "checkpoint": "model_best.pth", "epoch": 1}
        # Python's json, as earlier versions wrote result.json: NaN and Infinity literals.
        text = json.dumps({**result, "metrics": {"val/loss": value}})
        (run_dir / f"fold-{fold}" / RESULT).write_text(text)
    summary = summarize_folds(run_dir, len(folds), ("min", "val/loss"))
    metric = summary["metrics"]["val/loss"]
    with np.errstate(all="ignore"):  # inf - inf in numpy's spread: nan, as expected
        mean, std = np.mean(folds), np.std(folds, ddof=1)
    assert metric["mean_over_folds"] == pytest.approx(mean, nan_ok=True)
    if all(map(math.isfinite, folds)):
        assert (
            metric["std_over_folds"] == pytest.approx(std) == pytest.approx(statistics.stdev(folds))
        )
    else:
        assert math.isnan(metric["std_over_folds"])


def test_a_fold_with_a_nan_metric_is_summarized_not_a_traceback(tmp_path):
    """The exact case: statistics.stdev raised AttributeError on a nan."""
    for fold, value in enumerate([0.5, math.nan]):
        (tmp_path / f"fold-{fold}").mkdir()
        result = {"fold": fold, "checkpoint": "model_best.pth", "epoch": 1}
        text = json.dumps({**result, "metrics": {"val/loss": value}})
        (tmp_path / f"fold-{fold}" / RESULT).write_text(text)
    metric = summarize_folds(tmp_path, 2, ("min", "val/loss"))["metrics"]["val/loss"]
    assert math.isnan(metric["mean_over_folds"]) and math.isnan(metric["std_over_folds"])
