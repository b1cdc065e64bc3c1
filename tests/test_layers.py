"""The house's contracts that lint-imports (pyproject.toml, run by CI) cannot see: what the
repository-root modules import, and the loader protocol the engine relies on, checked against
its three implementations."""

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT
from PIL import Image
from torch.utils.data import DataLoader

from data_loader.data_loaders import ImageFolderDataLoader, SyntheticDataLoader
from data_loader.device_decode import DeviceDecodedBatches
from data_loader.device_pipeline import DeviceBatches
from utils.data.batches import Loader
from utils.data.sampler import EpochSampler

# What parse_config.py and config_schema.py (the config layer, beside utils/config/) may import
# of the project: that layer and the helpers below it.
ALLOWED = ("utils", "utils.util", "config_schema")
PROJECT = ("utils", "base", "logger", "trainer", "model", "data_loader", "sweeps", "build")


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("name", ["parse_config.py", "config_schema.py"])
def test_the_config_modules_import_only_the_config_layer(name):
    ours = {module for module in imported_modules(ROOT / name) if module.split(".")[0] in PROJECT}
    above = {m for m in ours if m not in ALLOWED and not m.startswith("utils.config.")}
    assert ours and not above, above


def image_folder(root: Path) -> Path:
    for index in range(10):
        folder = root / "train" / ("a" if index % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.full((20, 20, 3), index * 20, dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{index}.jpg")
    return root


@pytest.fixture(params=["DataLoader", "DeviceBatches", "DeviceDecodedBatches"])
def loader(request, tmp_path):
    common = {"batch_size": 4, "seed": 0}
    if request.param == "DeviceDecodedBatches":
        data = ImageFolderDataLoader(
            str(image_folder(tmp_path)), preset="cifar", decode="device", **common
        )
    else:
        pipeline = "device" if request.param == "DeviceBatches" else "dataloader"
        data = SyntheticDataLoader(num_train=10, num_test=4, pipeline=pipeline, **common)
    built = data.train_loader()
    assert type(built).__name__ == request.param
    return built


def test_every_loader_implementation_has_what_the_engine_reads(loader):
    assert isinstance(loader, Loader)
    assert isinstance(loader, DataLoader | DeviceBatches | DeviceDecodedBatches)
    assert isinstance(loader.sampler, EpochSampler) and loader.batch_size == 4
    assert isinstance(loader.drop_last, bool) and len(loader.dataset) == 10
    loader.sampler.set_epoch(1)
    batches = list(loader)
    assert len(batches) == len(loader) == 3  # 10 samples in batches of 4
    images, labels = batches[0]
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (4,) and labels.dtype == torch.int64
    # What a resume sets: the rest of the pass after 4 samples.
    loader.sampler.set_epoch(1, skip=4)
    assert sum(len(labels) for _, labels in loader) == 6


def test_no_module_outside_the_tests_is_over_300_lines_nor_a_folder_over_12_modules():
    modules = [
        path
        for path in ROOT.rglob("*.py")
        if path.relative_to(ROOT).parts[0] not in ("tests", "saved", "data")
        and not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
    ]
    long = [f"{p.relative_to(ROOT)}: {len(p.read_text().splitlines())}" for p in modules]
    assert not [item for item in long if int(item.rsplit(": ", 1)[1]) > 300]
    folders: dict[Path, int] = {}
    for path in modules:
        if path.parent != ROOT and path.name != "__init__.py":
            folders[path.parent] = folders.get(path.parent, 0) + 1
    assert not {str(f.relative_to(ROOT)): n for f, n in folders.items() if n > 12}
