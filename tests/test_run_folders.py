"""No command that writes changes another run's files (issue 31, items 1 and 12): a fine-tune
into an existing run id (given, or torchrun's fixed --rdzv-id) is refused; -r from model_best.pth
or a renamed checkpoint continues its run; hypothesis searches the ways to start a run."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_main, shrink, wait_for_file
from hypothesis import HealthCheck, given, settings
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
    folds: bool  # --folds 2 --fold 0: one fold of a cross-validation, in the run's fold-0/

    def args(self, config: Path, models: Path) -> list[str]:
        args = ["--epochs", str(self.epochs)] + (
            ["--folds", "2", "--fold", "0"] if self.folds else []
        )
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
    # A backup copy of A outside the save folder: resuming it must leave A's logs alone.
    "../../../backup/A", "../../../backup/A/checkpoint-epoch1.pth",
]  # fmt: skip
commands = st.builds(
    Command,
    source=st.sampled_from([None, *SOURCES]),
    config=st.booleans(),
    run_id=st.sampled_from([None, "A", "B", "C"]),
    elastic_id=st.sampled_from([None, "A", "B", "C", ".."]),  # "..": no folder name
    auto_resume=st.booleans(),
    epochs=st.sampled_from([2, 3]),
    folds=st.booleans(),
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
        backup = two_runs.parent / "backup" / "A"
        shutil.rmtree(backup, ignore_errors=True)
        shutil.copytree(pristine / "models" / RUN / "A", backup)
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


# --- issue: a run folder another process trains in, or that holds another kind of run ----------


def plain_demo(folder: Path, **trainer: object) -> Path:
    """The shrunk demo for a real train.py process (no StopAt), 1 epoch, no TensorBoard."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), folder / "saved")
    config["trainer"].update({"epochs": 1, "tensorboard": False, **trainer})
    path = folder / "plain.json"
    path.write_text(json.dumps(config))
    return path


def test_a_new_run_into_a_folder_another_process_trains_in_is_refused(tmp_path: Path, spawn):
    """While the first run is in epoch 1, its folder holds only config.json (what a run that
    stopped before its first checkpoint leaves); a second start with the same --run-id must
    not take it over: one line, exit 2, nothing of the first run changed, and the first run
    then finishes with its own config."""
    config = plain_demo(tmp_path, len_epoch=150)  # an epoch long enough to be caught inside
    run_dir = tmp_path / "saved" / "models" / RUN / "D"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    first = spawn(
        [sys.executable, "train.py", "-c", str(config), "--run-id", "D"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_for_file(first, run_dir / "config.json")
    os.kill(first.pid, signal.SIGSTOP)  # held in epoch 1: the folder cannot change meanwhile
    try:
        assert not (run_dir / "checkpoint-epoch1.pth").exists()
        before = fingerprints(tmp_path / "saved")
        code, output = train("-c", str(config), "--run-id", "D", "--lr", "0.01")
        assert code == 2, output[-2000:]
        assert "in use by another process" in output.splitlines()[-1] and str(run_dir) in output
        assert fingerprints(tmp_path / "saved") == before
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert first.wait(timeout=300) == 0, first.communicate()[0][-3000:]
    state = torch.load(run_dir / "checkpoint-epoch1.pth", weights_only=True)
    assert state["config"]["optimizer"]["args"]["lr"] == 0.003
    assert json.loads((run_dir / "config.json").read_text())["optimizer"]["args"]["lr"] == 0.003


def test_a_run_written_between_the_check_and_the_start_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Two starts at the same moment: both find no run; the one that comes second to the folder
    finds the other's there (here: a finished run, written in between) and is refused."""
    import utils.state.run_folder as run_folder

    config = plain_demo(tmp_path)
    assert train("-c", str(config), "--run-id", "other")[0] == 0
    models = tmp_path / "saved" / "models" / RUN
    real = run_folder.find_resume_point
    calls = []

    def other_run_meanwhile(parser, *args):  # the other process's run lands after this one's check
        point = real(parser, *args)
        if not calls:
            shutil.copytree(models / "other", models / "D")
        calls.append(parser)
        return point

    monkeypatch.setattr(run_folder, "find_resume_point", other_run_meanwhile)
    code, output = train("-c", str(config), "--run-id", "D", "--lr", "0.01")
    assert code == 2 and "this run already exists" in output.splitlines()[-1], output[-2000:]
    runs = fingerprints(tmp_path / "saved")  # D: the other run's files alone, untouched
    assert runs["D"] == {
        name: digest for name, digest in runs["other"].items() if "models/" in name
    }


def test_cross_validation_refuses_a_run_folder_that_holds_another_run(tmp_path: Path):
    """--folds into an ordinary run's id, an ordinary run (auto_resume) into a cross-validation's,
    another number of folds: one line, nothing changed. One fold at a time into one run id (a
    SLURM array) still fills one cross-validation and summarises it."""
    config = plain_demo(tmp_path)
    save_dir = tmp_path / "saved"
    assert train("-c", str(config), "--run-id", "A")[0] == 0
    assert train("-c", str(config), "--folds", "2", "--fold", "0", "--run-id", "cv")[0] == 0
    before = fingerprints(save_dir)
    for args in (
        ["--folds", "2", "--run-id", "A"],
        ["--folds", "2", "--fold", "1", "--run-id", "A"],
        ["--run-id", "cv", "--set", "trainer.auto_resume=true"],
        ["--folds", "3", "--fold", "1", "--run-id", "cv"],
    ):
        code, output = train("-c", str(config), *args)
        assert code == 2 and output.splitlines()[-1].startswith("error: "), (args, output[-2000:])
        assert "Traceback" not in output
        assert fingerprints(save_dir) == before, args
    code, output = train("-c", str(config), "--folds", "2", "--fold", "1", "--run-id", "cv")
    assert code == 0, output[-2000:]
    assert (save_dir / "models" / RUN / "cv" / "folds_summary.json").is_file()
    auto = ["--set", "trainer.auto_resume=true"]  # a requeued fold job: its fold is done
    assert train("-c", str(config), "--folds", "2", "--fold", "1", "--run-id", "cv", *auto)[0] == 0


def test_resuming_a_copy_of_a_run_leaves_the_original_runs_logs_alone(tmp_path: Path):
    """A backup copy outside saved/models/<name>/ keeps its resumed logs in its own log/; a copy
    in another save folder's layout, in that folder's log/<name>/<run>."""
    config = plain_demo(tmp_path, epochs=2, loggers=["csv"], tensorboard=True)
    save_dir = tmp_path / "saved"
    assert train("-c", str(config), "--run-id", "A")[0] == 0
    backup = tmp_path / "backup" / "A"
    elsewhere = tmp_path / "elsewhere" / "models" / RUN / "A"
    shutil.copytree(save_dir / "models" / RUN / "A", backup)
    shutil.copytree(save_dir / "models" / RUN / "A", elsewhere)
    before = fingerprints(save_dir)
    code, output = train("-r", str(backup / "checkpoint-epoch1.pth"), "--lr", "0.1")
    assert code == 0, output[-2000:]
    assert fingerprints(save_dir) == before
    rows = (backup / "log" / "A" / "metrics.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows] == ["epoch", "2"]  # what the copy trained
    code, output = train("-r", str(elsewhere), "--epochs", "3")
    assert code == 0, output[-2000:]
    assert fingerprints(save_dir) == before
    assert (tmp_path / "elsewhere" / "log" / RUN / "A" / "metrics.csv").is_file()


def test_a_file_system_that_cannot_lock_trains_unlocked_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """flock fails with ENOLCK on some cluster file systems (Lustre mounted without flock): the
    run goes on as before the lock existed, and says that a second start is not noticed."""
    import errno

    import utils.state.run_lock as run_lock

    def cannot_lock(file: object, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(run_lock.fcntl, "flock", cannot_lock)
    code, output = train("-c", str(plain_demo(tmp_path)), "--run-id", "D")
    assert code == 0, output[-2000:]
    assert "cannot lock" in output and "a second start in this run folder is not noticed" in output
    run_dir = tmp_path / "saved" / "models" / RUN / "D"
    assert (run_dir / "checkpoint-epoch1.pth").is_file()
    assert not (run_dir / ".lock").exists()  # no lock file that nothing held is left behind


@settings(max_examples=30, deadline=None)
@given(
    reason=st.sampled_from(["ENOLCK", "EOPNOTSUPP", "EINVAL", "EBADF"]),
    found=st.booleans(),
    shared=st.booleans(),
)
def test_a_lock_that_cannot_be_taken_leaves_the_folder_as_it_was(
    reason: str, found: bool, shared: bool
):
    """held() where flock fails (not because another process holds the lock): the folder
    afterwards holds what it held before; a .lock found there (another client's, on a file
    system that some mounts lock) is left as it was."""
    import errno
    import tempfile
    from unittest import mock

    import utils.state.run_lock as run_lock

    def cannot_lock(file: object, operation: int) -> None:
        code = getattr(errno, reason)
        raise OSError(code, os.strerror(code))

    with (
        tempfile.TemporaryDirectory() as name,
        mock.patch.object(run_lock.fcntl, "flock", cannot_lock),
    ):
        folder = Path(name)
        if found:
            (folder / ".lock").write_text("another client's\n")
        before = {path.name: path.read_bytes() for path in folder.iterdir()}
        with run_lock.held(folder, shared=shared):
            pass
        assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


# What a hand-edited `latest` may name: a checkpoint in a subfolder, one of another run (an
# absolute path), a file that is not there, text that names nothing.
EDITED_LATEST = {
    "a subfolder": "sub/checkpoint-epoch1.pth",
    "another run": "{other}/checkpoint-epoch1.pth",
    "a missing file": "checkpoint-epoch7.pth",
    "garbage": "\x00not a file",
}


def run_folder_with_others(folder: Path) -> tuple[Path, Path]:
    """A run folder holding (empty) checkpoints, model_best.pth, and a subfolder with a
    checkpoint; and another run's folder beside it with one: what `latest` may point into."""
    run_dir, other = folder / "run", folder / "other"
    for path in (
        run_dir / "checkpoint-epoch1.pth",
        run_dir / "checkpoint-epoch2-step5.pth",
        run_dir / "model_best.pth",
        run_dir / "sub" / "checkpoint-epoch1.pth",
        other / "checkpoint-epoch1.pth",
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return run_dir, other


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    head=st.one_of(
        st.sampled_from([*EDITED_LATEST.values(), "checkpoint-epoch1.pth", "model_best.pth"]),
        st.sampled_from(["checkpoint-epoch2-step5.pth", "/", "..", ".", "", "other"]),
        st.text(max_size=30),
    ),
    rest=st.sampled_from(["", "\n", "\ntimeline abc\n", "\r\ntimeline abc"]),
)
def test_latest_names_a_file_of_its_run_folder_or_is_one_line(tmp_path, head: str, rest: str):
    """read_latest either returns a checkpoint of the run folder itself (or none, for its
    model_best.pth) or refuses `latest` in one line naming it; it never leads outside the
    folder, and never raises anything else (a traceback)."""
    from utils.state.checkpoint import CheckpointError, read_latest

    run_dir, other = run_folder_with_others(tmp_path)
    text = head.replace("{other}", str(other)) + rest
    (run_dir / "latest").write_text(text, encoding="utf-8", newline="")
    try:
        path, _ = read_latest(run_dir)
    except CheckpointError as error:
        assert str(error).startswith(f"{run_dir / 'latest'}: ") and "\n" not in str(error)
        assert "or delete it" in str(error)
        return
    assert path is None or (path.parent == run_dir and path.is_file())
    name = (text.splitlines() or [""])[0].strip()
    if checkpoint_order(Path(name)) is not None and "/" not in name:
        assert path == run_dir / name  # a checkpoint it names is the head


@pytest.mark.parametrize("edit", EDITED_LATEST)
def test_an_edited_latest_is_one_line_and_the_run_is_untouched(
    tmp_path: Path, stop_at: None, edit: str
):
    config = demo(tmp_path)
    save_dir = tmp_path / "saved"
    assert train("-c", str(config), "--run-id", "A", "--set", "trainer.epochs=1")[0] == 0
    assert train("-c", str(config), "--run-id", "B", "--set", "trainer.epochs=1")[0] == 0
    run_dir, other = save_dir / "models" / RUN / "A", save_dir / "models" / RUN / "B"
    (run_dir / "sub").mkdir()
    shutil.copy(run_dir / "checkpoint-epoch1.pth", run_dir / "sub")
    (run_dir / "latest").write_text(
        EDITED_LATEST[edit].replace("{other}", str(other)) + "\ntimeline x\n"
    )
    before = fingerprints(save_dir)
    code, output = train("-r", str(run_dir))
    assert code == 2, output[-2000:]
    assert output.splitlines()[-1].startswith(f"error: {run_dir / 'latest'}: names ")
    assert fingerprints(save_dir) == before
