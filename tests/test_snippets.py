"""What the docs tell a user to paste works as pasted: docs/extending.md's blocks (a loader, a
model, a metric, a loss, a trainer), each appended to the file its marker names in a copy made
by new_project.py, with the config shown beside them, train through train.py and test.py; and
the copy's own tests of what a config may name still pass with them added."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT

PASTE = re.compile(r"<!-- paste: (\S+) (\w+) -->\n```python\n(.*?)```", re.DOTALL)
CONFIG = re.compile(r"<!-- config: (\S+) -->\n```json\n(.*?)```", re.DOTALL)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def marked(pattern: re.Pattern) -> list[tuple[str, ...]]:
    return [match.groups() for page in PAGES for match in pattern.finditer(page.read_text())]


def run(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_the_pasted_blocks_train_in_a_new_project(tmp_path):
    if not (ROOT / "new_project.py").is_file():
        pytest.skip("a copy made by new_project.py, which leaves itself out")
    blocks = marked(PASTE)
    assert {target for target, _, _ in blocks} == {
        "data_loader/data_loaders.py", "model/model.py", "model/metric.py", "model/loss.py",
        "trainer/__init__.py",
    }  # fmt: skip
    copy = tmp_path / "MyProject"
    assert run(ROOT, "new_project.py", str(copy)).returncode == 0
    for target, name, code in blocks:
        path = copy / target
        # Pasted at the end of the file as it is, then the name added to its __all__.
        path.write_text(f"{path.read_text()}\n\n{code}\n__all__ += [{name!r}]\n")
    ((config_name, config_text),) = marked(CONFIG)
    (copy / config_name).write_text(config_text)
    trained = run(copy, "train.py", "-c", config_name, "--run-id", "pasted")
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_dir = copy / "saved" / "models" / json.loads(config_text)["name"] / "pasted"
    best = torch.load(run_dir / "model_best.pth", weights_only=True)
    # The sign of a sum of 16 numbers: a network learns it well within two epochs.
    assert best["metrics"]["val/accuracy"] > 0.75 and "val/positive_rate" in best["metrics"]
    tested = run(copy, "test.py", "-r", str(run_dir / "model_best.pth"))
    assert tested.returncode == 0, tested.stderr[-3000:]
    assert "test: 512 samples" in tested.stdout
    # The copy's own tests of what a config may name (they derive it from each __all__), of
    # its layers and of its docs, with the five additions in place.
    # One pytest run (each start imports torch): test_bad_input.py's "unknown" tests and the
    # other three files whole (-k also matches a test's file name).
    files = ["tests/test_bad_input.py", "tests/test_layers.py", "tests/test_docs.py"]
    files += ["tests/test_readme.py"]
    chosen = "unknown or test_layers or test_docs or test_readme"
    quiet = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", "-k", chosen]
    own = run(copy, *quiet, *files)
    assert own.returncode == 0 and " passed" in own.stdout, own.stdout[-3000:]
    assert "deselected" in own.stdout  # test_bad_input.py's other tests
