"""benchmarks/whole_run.py: its phases account for each whole process, on both sides."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from PIL import Image


def image_folder(root: Path) -> Path:
    """root/{train,val}/class<k>/<n>.jpg: 32x32 noise JPEGs, 48 to train and 16 to validate."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 48), ("val", 16)):
        for index in range(count):
            folder = root / split / f"class{index % 4}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{index}.jpg")
    return root


@pytest.mark.slow
def test_the_phases_add_up_to_each_whole_process(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/whole_run.py", "--data", str(image_folder(tmp_path / "images")),
               "--pairs", "1", "--epochs", "2", "--workers", "0", "--work", str(tmp_path / "work")]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    table = {
        line[:30].strip(): [float(value) for value in line[30:].split()]
        for line in lines[
            lines.index(next(line for line in lines if line.startswith("phase"))) + 1 :
        ]
        if not line.startswith("train.py / hand loop")
    }
    total = table.pop("total")
    first_step = table.pop("first step")
    for side in range(2):  # train.py, then the hand loop
        # Every phase is time spent, and none is counted twice: what is left is not negative.
        assert all(values[side] >= 0 for values in table.values()), table
        assert sum(values[side] for values in table.values()) == pytest.approx(
            total[side], abs=0.05
        )
        assert 0 < first_step[side] < total[side]
        assert table["steps"][side] > 0 and table["validation"][side] > 0
    assert "train.py / hand loop, whole process" in result.stdout
    # Each side trained and saved both epochs.
    assert (
        len(list((tmp_path / "work").glob("template0/models/*/bench/checkpoint-epoch2.pth"))) == 1
    )
    assert (tmp_path / "work" / "hand0" / "checkpoint-epoch2.pth").is_file()
