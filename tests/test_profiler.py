"""trainer.profile (issue 35, item 3): torch.profiler over a window of the first training
batches writes a trace Perfetto opens and the top operators, on rank 0; on or off, the run
trains the same weights; off, no profiler is made and the batches are the loader's own."""

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, run_main, run_script, shrink
from hypothesis import example, given, settings
from hypothesis import strategies as st

from base.profiling import profiled, profiling

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


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 3), st.integers(0, 2), st.integers(1, 3), st.integers(1, 7))
@example(wait=5, warmup=2, active=5, num_batches=4)  # wrote nothing, said nothing
@example(wait=2, warmup=1, active=3, num_batches=5)  # said batches 4-6 of a 5-batch run
def test_the_profile_names_the_batches_it_recorded_or_warns_it_recorded_none(
    wait, warmup, active, num_batches
):
    """A window past the run's last batch writes no profile and says so in a warning; one the
    run ends inside is saved, its message naming the batches recorded, not the window's."""
    with tempfile.TemporaryDirectory() as folder:
        messages = []
        logger = SimpleNamespace(
            info=lambda text, *args: messages.append(("info", text % args)),
            warning=lambda text, *args: messages.append(("warning", text % args)),
        )
        trainer = SimpleNamespace(
            options={"profile": [wait, warmup, active], "profile_all_ranks": False}, rank=0,
            config=SimpleNamespace(log_dir=Path(folder)), device=torch.device("cpu"),
            logger=logger, profiler=None,
        )  # fmt: skip
        with profiling(trainer):
            for _ in profiled(trainer.profiler, range(num_batches)):
                torch.ones(4).sum()
        first = wait + warmup + 1
        written = (Path(folder) / "profile" / "trace.json").exists()
        ((kind, text),) = messages
        if num_batches < first:
            assert not written and kind == "warning"
            assert f"the run trained {num_batches} batches" in text
        else:
            last = min(first + active - 1, num_batches)
            assert written and kind == "info"
            assert text.startswith(f"Profile of training batches {first}-{last}")
            assert ("ended inside the window" in text) == (last < first + active - 1)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 3), st.integers(0, 2))
@example(num_parts=2, rank=0)  # the resumed part's profile replaced the first part's
def test_a_resumed_part_profiles_into_a_folder_of_its_own(num_parts, rank):
    """A resume logs into the run's log folder again: each part's profile (of its own first
    batches) is kept in its own folder, each rank's apart, and no earlier file changes."""
    with tempfile.TemporaryDirectory() as folder:
        log_dir, written = Path(folder), {}
        for _ in range(num_parts):
            trainer = SimpleNamespace(
                options={"profile": [0, 0, 1], "profile_all_ranks": True}, rank=rank,
                config=SimpleNamespace(log_dir=log_dir), device=torch.device("cpu"),
                logger=SimpleNamespace(info=lambda *args: None, warning=lambda *args: None),
                profiler=None,
            )  # fmt: skip
            with profiling(trainer):
                for _ in profiled(trainer.profiler, range(2)):
                    torch.ones(4).sum()
            for path, content in written.items():
                assert path.read_bytes() == content, path
            written = {path: path.read_bytes() for path in log_dir.rglob("*") if path.is_file()}
        folders = {path.parent.name for path in written}
        base = "profile" if rank == 0 else f"profile-rank{rank}"
        assert folders == {base, *(f"{base}-{number}" for number in range(2, num_parts + 1))}
