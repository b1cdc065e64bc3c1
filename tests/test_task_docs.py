"""The worked examples of other task shapes work from their docs alone, in a new project: each
"## Worked example: <task>" section of docs/extending.md has one bash block, which runs as
written in a copy made by new_project.py, with two changes a reader makes: <run_id> is the id
of the run the block's train.py made, and one epoch rather than the shipped number."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SECTION = re.compile(r"^## Worked example: (\w+)\n(.*?)(?=^## |\Z)", re.DOTALL | re.MULTILINE)
BASH = re.compile(r"```bash\n(.*?)```", re.DOTALL)
RUN_ID = "docs"


def worked_examples() -> dict[str, str]:
    """{task: its section's bash block} of docs/extending.md."""
    text = (ROOT / "docs" / "extending.md").read_text()
    blocks = {}
    for task, body in SECTION.findall(text):
        found = BASH.findall(body)
        if found:
            (blocks[task],) = found
    return blocks


def as_a_reader_runs_it(block: str) -> str:
    """The block with this interpreter for `python`, the run id filled in, one epoch, and an
    input of the reader's own (`new.jsonl`) taken from the written test split."""
    block = block.replace("<run_id>", RUN_ID).replace("new.jsonl", "data/sequences/test.jsonl")
    block = re.sub(
        r"^python train\.py (.*)$", rf"python train.py \1 --run-id {RUN_ID} --epochs 1", block,
        flags=re.MULTILINE,
    )  # fmt: skip
    return re.sub(r"^python ", f"{sys.executable} ", block, flags=re.MULTILINE)


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ROOT / "new_project.py").is_file():
        pytest.skip("a copy made by new_project.py, which leaves itself out")
    folder = tmp_path_factory.mktemp("copy") / "MyTasks"
    made = subprocess.run(
        [sys.executable, "new_project.py", str(folder)], cwd=ROOT, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr[-3000:]
    return folder


def test_each_task_shape_has_its_worked_example_with_commands():
    assert set(worked_examples()) >= {"sequences", "segmentation", "detection"}


@pytest.mark.slow
@pytest.mark.parametrize("task", ["sequences", "segmentation", "detection"])
def test_the_worked_example_runs_as_its_docs_say_in_a_new_project(copy, task):
    if task == "detection" and importlib.util.find_spec("torchmetrics") is None:
        pytest.skip("the detection extra is not installed (pip install -e '.[detection]')")
    script = "set -euo pipefail\n" + as_a_reader_runs_it(worked_examples()[task])
    env = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        ["bash", "-c", script], cwd=copy, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, script + result.stdout[-2000:] + result.stderr[-3000:]
    # Each block ends with a command that writes something of the task's: check it is there.
    outputs = {"sequences": "model.pt2", "segmentation": "shares.csv", "detection": None}
    if outputs[task] is not None:
        assert (copy / outputs[task]).is_file()
    if task == "segmentation":
        assert len(list((copy / "predicted_masks").glob("*.png"))) == 64  # one per test image
