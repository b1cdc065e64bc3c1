"""scripts/slurm.sbatch run for real on one machine: fake `srun`, `scontrol` and `scancel` on
PATH stand in for SLURM, torchrun (2 gloo workers, --max-restarts) and train.py are real."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, shrink, signal_once_saved
from ports import free_port

JOB_ID = "4242"


def write_tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def fake_slurm(folder: Path, calls: Path) -> Path:
    """srun runs its command here; scontrol names this machine and logs requeues; scancel
    --signal=USR1 signals the job's processes (those whose command line holds $CONFIG)."""
    folder.mkdir()
    write_tool(folder, "srun", 'exec "$@"\n')
    write_tool(
        folder,
        "scontrol",
        f'echo "scontrol $*" >> {calls}\n'
        "if [[ $1 == show && $2 == hostnames ]]; then echo 127.0.0.1; fi\n",
    )
    write_tool(
        folder,
        "scancel",
        f'echo "scancel $*" >> {calls}\n'
        'if [[ $1 == --signal=USR1 ]]; then pkill -USR1 -f -- "$CONFIG" || true; fi\n',
    )
    return folder


def start_job(spawn, tmp_path: Path, config: Path, calls: Path) -> subprocess.Popen:
    """sbatch, as far as this machine can: the batch script with SLURM's variables set."""
    tools = tmp_path / "bin" if (tmp_path / "bin").is_dir() else fake_slurm(tmp_path / "bin", calls)
    env = {
        **os.environ,
        "PATH": f"{tools}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": "node001",
        "CONFIG": str(config),
        "NPROC_PER_NODE": "2",
        "RDZV_PORT": str(free_port()),
        "REQUEUE_FILE": str(tmp_path / "requeue"),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONUNBUFFERED": "1",
    }
    return spawn(
        ["bash", "scripts/slurm.sbatch"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_preemption_requeues_once_without_restarting_workers_then_resumes(spawn, tmp_path):
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["data_loader"]["args"].update(num_train=640)
    config["trainer"].update(epochs=3, len_epoch=60, tensorboard=False, log_step=5)
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    calls = tmp_path / "calls.log"
    run_dir = tmp_path / "saved" / "models" / "Demo_CifarCNN" / JOB_ID

    job = start_job(spawn, tmp_path, config_path, calls)
    # What SLURM sends the batch shell before the time limit, once epoch 1 is saved.
    output = signal_once_saved(job, run_dir / "checkpoint-epoch1.pth")

    assert job.returncode == 0, output[-4000:]
    assert calls.read_text().count(f"scontrol requeue {JOB_ID}") == 1, calls.read_text()
    assert "Resumed from" not in output, output[-4000:]  # no worker was restarted
    assert "stopped by SIGUSR1" in output
    saved = sorted(path.name for path in run_dir.glob("checkpoint-epoch2-step*.pth"))
    assert len(saved) == 1, sorted(path.name for path in run_dir.iterdir())
    assert not (tmp_path / "requeue").exists()

    # The requeued job runs the same script again: it resumes and finishes, and is not requeued.
    again = start_job(spawn, tmp_path, config_path, calls)
    output = again.communicate(timeout=300)[0]
    assert again.returncode == 0, output[-4000:]
    assert f"Resumed from {run_dir / saved[0]}" in output
    assert calls.read_text().count("scontrol requeue") == 1
    final = torch.load(run_dir / "checkpoint-epoch3.pth", weights_only=True)
    assert final["epoch"] == 3 and final["global_step"] == 3 * 60
