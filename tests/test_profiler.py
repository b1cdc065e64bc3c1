"""trainer.profile (issue 35, item 3): torch.profiler over a window of the first training
batches writes a trace Perfetto opens and the top operators, on rank 0; on or off, the run
trains the same weights; off, no profiler is made and the batches are the loader's own."""

import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_main, run_script, shrink

from base.profiling import profiled

RUN = Path("Demo_CifarCNN")


def demo(tmp_path: Path, **trainer) -> Path:
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update(tensorboard=False, deterministic=True, **trainer)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_the_profile_window_writes_a_trace_and_the_top_operators_and_changes_no_weight(tmp_path):
    # The profiled run as its own process, end to end; the plain one in this process.
    profiled_run = run_script("train.py", "-c", str(demo(tmp_path / "on", profile=[1, 1, 2])),
                              "--run-id", "on")  # fmt: skip
    plain_run = run_main("train.py", "-c", str(demo(tmp_path / "off")), "--run-id", "off")
    assert profiled_run.returncode == plain_run.returncode == 0, profiled_run.stderr[-3000:]
    out = tmp_path / "on" / "saved" / "log" / RUN / "on" / "profile"
    trace = json.loads((out / "trace.json").read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any(name.startswith("aten::") for name in names)
    assert "aten::" in (out / "top_operators.txt").read_text()
    assert "Profile of training batches 3-4" in profiled_run.stdout + profiled_run.stderr
    assert not (tmp_path / "off" / "saved" / "log" / RUN / "off" / "profile").exists()
    weights = [
        torch.load(folder / "saved" / "models" / RUN / run / "checkpoint-epoch2.pth",
                   weights_only=True)["model"]
        for folder, run in ((tmp_path / "on", "on"), (tmp_path / "off", "off"))
    ]  # fmt: skip
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key


def test_off_the_batches_are_the_loaders_own_iterator():
    batches = iter([1, 2, 3])
    assert profiled(None, batches) is batches


@pytest.mark.parametrize("window", [[1, 2], [1, 1, 0], [-1, 1, 1], "5"])
def test_a_bad_profile_window_is_one_line(tmp_path, window):
    result = run_main("train.py", "-c", str(demo(tmp_path, profile=window)))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "trainer.profile: must be [wait, warmup, active]" in result.stderr
