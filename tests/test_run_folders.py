"""No command that writes changes another run's files (issue 31, items 1 and 12): a fine-tune
into an existing run id (given, or torchrun's fixed --rdzv-id) is refused; -r from model_best.pth
or a renamed checkpoint continues its run; hypothesis searches the ways to start a run."""

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_main, shrink
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.state.checkpoint import checkpoint_order, state_order

RUN = Path("Demo_CifarCNN")


def demo(folder: Path) -> Path:
    """The shrunk demo (8 steps an epoch), 2 epochs, StopAt's trainer, no TensorBoard."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), folder / "saved")
    config["trainer"].update({"type": "StopAt", "tensorboard": False, "deterministic": True})
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def fingerprints(save_dir: Path) -> dict[str, dict[str, str]]:
    """{run id: {file under its checkpoint or log folder: sha256}} for every run under save_dir."""
    runs: dict[str, dict[str, str]] = {}
    for kind in ("models", "log"):
        for run_dir in sorted((save_dir / kind / RUN).glob("*")):
            files = runs.setdefault(run_dir.name, {})
            for path in sorted(run_dir.rglob("*")):
                if path.is_file():
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                    files[f"{kind}/{path.relative_to(run_dir)}"] = digest
    return runs


def train(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """train.py's exit code and what it printed (the log, then the error line last)."""
    result = run_main("train.py", *args, env=env)
    return result.returncode, result.stdout + result.stderr


@pytest.fixture
def two_runs(tmp_path: Path, stop_at: None) -> Path:
    """Runs A (2 epochs done) and B (stopped inside epoch 2, at step 11), and copies of their
    checkpoints under other names: A/kept.pth (epoch 1), B/mid.pth (the mid-epoch one)."""
    config = demo(tmp_path)
    models = tmp_path / "saved" / "models" / RUN
    assert train("-c", str(config), "--run-id", "A")[0] == 0
    assert train("-c", str(config), "--run-id", "B", "--set", "trainer.args.stop_at_step=11")[0]
    shutil.copy(models / "A" / "checkpoint-epoch1.pth", models / "A" / "kept.pth")
    shutil.copy(models / "B" / "checkpoint-epoch2-step11.pth", models / "B" / "mid.pth")
    return config


def test_a_fine_tune_into_an_existing_run_is_refused_and_changes_nothing(two_runs: Path):
    save_dir = two_runs.parent / "saved"
    source = save_dir / "models" / RUN / "A" / "checkpoint-epoch2.pth"
    before = fingerprints(save_dir)
    code, stderr = train("-r", str(source), "-c", str(two_runs), "--run-id", "A")
    assert code == 2 and "this run already exists" in stderr.splitlines()[-1]
    # torchrun's --rdzv-id, the default run id of every launch with it: the same.
    code, stderr = train("-r", str(source), "-c", str(two_runs), env={"TORCHELASTIC_RUN_ID": "B"})
    assert code == 2 and "B: this run already exists" in stderr.splitlines()[-1]
    assert fingerprints(save_dir) == before


def test_an_elastic_restart_of_a_fine_tune_continues_its_own_run(two_runs: Path):
    """The restarted workers find the fine-tune's own checkpoints and go on from them, as any
    run does; they neither start it over nor touch the run it came from."""
    save_dir = two_runs.parent / "saved"
    source = save_dir / "models" / RUN / "A" / "checkpoint-epoch2.pth"
    stop = ("--set", "trainer.args.stop_at_step=5")
    assert train("-r", str(source), "-c", str(two_runs), "--run-id", "F", *stop)[0] == 143
    before = fingerprints(save_dir)
    restart = {"TORCHELASTIC_RUN_ID": "F", "TORCHELASTIC_RESTART_COUNT": "1"}
    code, stderr = train("-r", str(source), "-c", str(two_runs), env=restart)
    assert code == 0, stderr[-2000:]
    assert "Resumed from" in stderr and "checkpoint-epoch1-step5.pth" in stderr
    after = fingerprints(save_dir)
    assert {run: after[run] for run in ("A", "B")} == {run: before[run] for run in ("A", "B")}
    state = torch.load(save_dir / "models" / RUN / "F" / "checkpoint-epoch2.pth", weights_only=True)
    assert (state["epoch"], state["global_step"]) == (2, 16)


@pytest.mark.parametrize("name", ["model_best.pth", "kept.pth"])
def test_resume_from_model_best_or_a_renamed_checkpoint_continues_its_run(two_runs: Path, name):
    """Its place in the run is read from what it holds: epoch 1 (model_best.pth may hold either
    epoch), the checkpoints after it set aside as from checkpoint-epoch1.pth."""
    run_dir = two_runs.parent / "saved" / "models" / RUN / "A"
    held = torch.load(run_dir / name, weights_only=True)
    code, stderr = train("-r", str(run_dir / name))
    assert code == 0, stderr[-2000:]
    assert f"Resumed from {run_dir / name} (epoch {held['epoch']} done)" in stderr
    state = torch.load(run_dir / "checkpoint-epoch2.pth", weights_only=True)
    assert (state["epoch"], state["global_step"]) == (2, 16)


def test_the_place_of_a_checkpoint_read_from_its_contents_is_the_place_its_name_gives(
    two_runs: Path,
):
    run_dirs = two_runs.parent / "saved" / "models" / RUN
    paths = [*run_dirs.glob("*/checkpoint-*.pth")]
    assert any("-step" in path.name for path in paths)
    for path in paths:
        assert state_order(torch.load(path, weights_only=True)) == checkpoint_order(path), path


def test_continuing_a_run_under_another_run_id_is_refused(two_runs: Path):
    """Its checkpoints would go on in A, its logs into B's log folder."""
    save_dir = two_runs.parent / "saved"
    before = fingerprints(save_dir)
    code, stderr = train("-r", str(save_dir / "models" / RUN / "A"), "--run-id", "B")
    assert code == 2 and stderr.splitlines()[-1].startswith("error: --run-id B: -r continues")
    assert fingerprints(save_dir) == before


@dataclass(frozen=True)
class Command:
    source: str | None  # -r: a run folder or a checkpoint file under saved/models/<name>/
    config: bool  # -c CONFIG: a fine-tune from -r (or a new run)
    run_id: str | None  # --run-id
    elastic_id: str | None  # TORCHELASTIC_RUN_ID: torchrun's --rdzv-id, the default run id
    auto_resume: bool
    epochs: int

    def args(self, config: Path, models: Path) -> list[str]:
        args = ["--epochs", str(self.epochs)]
        if self.source is not None:
            args += ["-r", str(models / self.source)]
        if self.config or self.source is None:
            args += ["-c", str(config)]
        if self.run_id is not None:
            args += ["--run-id", self.run_id]
        return [*args, "--set", f"trainer.auto_resume={json.dumps(self.auto_resume)}"]

    def continues(self, existing: set[str]) -> str | None:
        """The existing run this command may change: the one it resumes (-r without -c), or the
        run its id names when trainer.auto_resume asks to continue it. Every other run that
        exists must keep every byte."""
        if self.source is not None and not self.config:
            return self.source.split("/")[0]
        run_id = self.run_id or self.elastic_id
        return run_id if self.auto_resume and run_id in existing else None


SOURCES = [
    "A", "A/checkpoint-epoch1.pth", "A/checkpoint-epoch2.pth", "A/model_best.pth", "A/kept.pth",
    "B", "B/checkpoint-epoch2-step11.pth", "B/mid.pth",
]  # fmt: skip
commands = st.builds(
    Command,
    source=st.sampled_from([None, *SOURCES]),
    config=st.booleans(),
    run_id=st.sampled_from([None, "A", "B", "C"]),
    elastic_id=st.sampled_from([None, "A", "B", "C"]),
    auto_resume=st.booleans(),
    epochs=st.sampled_from([2, 3]),
)


@pytest.mark.parametrize(
    "num_examples",
    [
        pytest.param(8, id="8-examples"),
        pytest.param(120, id="120-examples", marks=pytest.mark.slow),
    ],
)
def test_no_command_that_writes_changes_another_runs_files(two_runs: Path, num_examples: int):
    """Any way of starting train.py, on a save folder with two runs: it exits 0, or 2 with one
    line; every run other than the one it continues keeps every file byte for byte."""
    save_dir = two_runs.parent / "saved"
    pristine = two_runs.parent / "pristine"
    shutil.copytree(save_dir, pristine)
    models = save_dir / "models" / RUN
    before = fingerprints(save_dir)

    @settings(max_examples=num_examples)
    @given(command=commands)
    def check(command: Command) -> None:
        shutil.rmtree(save_dir)
        shutil.copytree(pristine, save_dir)
        env = {"TORCHELASTIC_RUN_ID": command.elastic_id} if command.elastic_id else None
        code, stderr = train(*command.args(two_runs, models), env=env)
        if code == 2:
            assert len(stderr.strip().splitlines()) >= 1 and "Traceback" not in stderr
            assert stderr.strip().splitlines()[-1].startswith("error: ")
        else:
            assert code == 0, stderr[-3000:]
        after = fingerprints(save_dir)
        allowed = command.continues(set(before))
        for run, files in before.items():
            if run != allowed:
                assert after[run] == files, f"{command} changed run {run}"

    check()
