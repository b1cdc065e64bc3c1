"""The engine takes any sampler and any dataset: a plain torch DistributedSampler and an
IterableDataset (no length) train, and a run stopped inside an epoch resumes bit-exact."""

import json
import signal
from pathlib import Path

import pytest
import torch
from conftest import ROOT, shrink
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Subset

import data_loader.data_loaders as data_module
import train
from data_loader.data_loaders import SyntheticDataLoader


class PlainSamplerData(SyntheticDataLoader):
    """The demo data through torch's own DistributedSampler, as many codebases have it."""

    def train_loader(self, *, drop_last: bool = False) -> DataLoader:
        train_indices, _ = self.split_indices()
        dataset = Subset(self.view("train", augment=True), train_indices.tolist())
        sampler = DistributedSampler(
            dataset, num_replicas=self.num_replicas, rank=self.rank, shuffle=True, seed=self.seed
        )
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler)


class Stream(IterableDataset):
    """(image, label) pairs of a dataset in an order drawn from torch's global RNG, which the
    engine seeds by (seed, epoch): a stream with no length."""

    def __init__(self, dataset: torch.utils.data.Dataset) -> None:
        self.dataset = dataset

    def __iter__(self):
        for index in torch.randperm(len(self.dataset)).tolist():
            yield self.dataset[index]


class StreamData(SyntheticDataLoader):
    def train_loader(self, *, drop_last: bool = False) -> DataLoader:
        return DataLoader(Stream(self.view("train", augment=True)), batch_size=self.batch_size)


@pytest.fixture
def registered(monkeypatch, stop_at):
    """The data classes above and StopAt (conftest.py), as a config can name them."""
    names = ["PlainSamplerData", "StreamData"]
    for name in names:
        monkeypatch.setattr(data_module, name, globals()[name], raising=False)
    monkeypatch.setattr(data_module, "__all__", [*data_module.__all__, *names])


def write_config(tmp_path: Path, loader: str, **trainer_options) -> Path:
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["data_loader"]["type"] = loader
    config["arch"]["args"]["dropout"] = 0.2
    config["trainer"].update(
        deterministic=True, tensorboard=False, type="StopAt", **trainer_options
    )
    path = tmp_path / f"{loader}.json"
    path.write_text(json.dumps(config))
    return path


def final_state(tmp_path: Path, run_id: str) -> dict:
    path = tmp_path / "saved" / "models" / "Demo_CifarCNN" / run_id / "checkpoint-epoch2.pth"
    return torch.load(path, weights_only=True)


def assert_stopped_run_resumes_exactly(tmp_path: Path, config: Path, stop_at: int) -> None:
    assert train.main(["-c", str(config), "--run-id", "straight"]) == 0
    stopped = [
        "-c",
        str(config),
        "--run-id",
        "stopped",
        "--set",
        f"trainer.args.stop_at_step={stop_at}",
    ]
    assert train.main(stopped) == 128 + signal.SIGTERM
    run_dir = tmp_path / "saved" / "models" / "Demo_CifarCNN" / "stopped"
    (saved,) = run_dir.glob("checkpoint-epoch2-step*.pth")
    assert train.main(["-r", str(saved), "--set", "trainer.args.stop_at_step=0"]) == 0
    straight, resumed = final_state(tmp_path, "straight"), final_state(tmp_path, "stopped")
    for key, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][key]), key
    assert resumed["metrics"]["train/loss"] == straight["metrics"]["train/loss"]


def test_a_plain_distributed_sampler_trains_and_resumes_exactly(registered, tmp_path, capsys):
    config = write_config(tmp_path, "PlainSamplerData")
    # 256 training samples in batches of 32: 8 steps per epoch; stop inside epoch 2.
    assert_stopped_run_resumes_exactly(tmp_path, config, stop_at=8 + 3)
    # The data summary names the sampler that was used, not the template's own.
    assert (
        "Sampler: DistributedSampler, from PlainSamplerData.train_loader" in capsys.readouterr().out
    )


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_an_iterable_dataset_needs_len_epoch_and_resumes_exactly(registered, tmp_path, capsys):
    assert train.main(["-c", str(write_config(tmp_path, "StreamData"))]) == 2
    assert "the training data has no length: set trainer.len_epoch" in capsys.readouterr().err
    config = write_config(tmp_path, "StreamData", len_epoch=6)
    assert_stopped_run_resumes_exactly(tmp_path, config, stop_at=6 + 2)
