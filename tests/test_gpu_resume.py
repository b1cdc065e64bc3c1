"""Exact resume on a GPU (benchmarks/gpu_check.sh's step "resume"; skipped without CUDA): a run
stopped inside an epoch at a fixed optimizer step (the stop_at fixture, as SIGTERM stops it) and
resumed ends with the uninterrupted run's weights, optimizer state and loss, bit for bit, with
trainer.deterministic on (which refuses kernels that could make it differ)."""

import json
import signal
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_main, shrink

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# What differs on a GPU: batches from DataLoader worker processes copied from pinned memory, or
# the split held and augmented on the GPU under bf16 autocast in channels_last.
VARIANTS = {
    "dataloader-fp32": {"data_loader": {"num_workers": 2}, "trainer": {}},
    "device-pipeline-bf16-channels-last": {
        "data_loader": {"pipeline": "device"},
        "trainer": {"amp": "bf16", "channels_last": True},
    },
}


def tensors(state: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested checkpoint state, by its path."""
    found = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            found[f"{prefix}{key}"] = value
        elif isinstance(value, dict):
            found.update(tensors(value, f"{prefix}{key}."))
        elif isinstance(value, list):
            found.update(tensors(dict(enumerate(value)), f"{prefix}{key}."))
    return found


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_gpu_run_stopped_mid_epoch_resumes_bit_exact(tmp_path: Path, stop_at, variant: str):
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["n_gpu"] = 1  # 256 training samples in batches of 32: 8 steps per epoch
    config["arch"]["args"]["dropout"] = 0.2  # the RNG state must be restored as well
    config["data_loader"]["args"].update(VARIANTS[variant]["data_loader"])
    config["trainer"].update(
        deterministic=True, type="StopAt", tensorboard=False, **VARIANTS[variant]["trainer"]
    )
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    straight = run_main("train.py", "-c", str(config_path), "--run-id", "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    stop = ["--set", "trainer.args.stop_at_step=10"]  # step 2 of epoch 2
    stopped = run_main("train.py", "-c", str(config_path), "--run-id", "stopped", *stop)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    run_dir = tmp_path / "saved" / "models" / "Demo_CifarCNN"
    (saved,) = (run_dir / "stopped").glob("checkpoint-epoch2-step*.pth")
    resumed = run_main("train.py", "-r", str(saved), "--set", "trainer.args.stop_at_step=0")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    expected, actual = (
        torch.load(run_dir / run / "checkpoint-epoch2.pth", weights_only=True)
        for run in ("straight", "stopped")
    )
    assert actual["global_step"] == expected["global_step"] == 16
    wanted = tensors({"model": expected["model"], "optimizer": expected["optimizer"]})
    got = tensors({"model": actual["model"], "optimizer": actual["optimizer"]})
    assert wanted.keys() == got.keys()
    differing = [key for key in wanted if not torch.equal(wanted[key], got[key])]
    print(f"{variant}: {len(wanted)} tensors, {len(differing)} differ")
    assert not differing, differing
    assert actual["metrics"]["train/loss"] == expected["metrics"]["train/loss"]
