"""torchrun on CPU with gloo: 2 processes, 2 "nodes" on loopback, elastic restart, and
checkpoints moving between world sizes."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    NO_SAMPLE,
    ROOT,
    SAMPLE_DIR,
    noise_image_folder,
    run_main,
    set_flags,
    shrink,
    wait_for_file,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from ports import free_port

import model.metric as metric_module
import train as train_script
from build import build_trainer
from parse_config import ConfigParser
from utils.data.sampler import EpochSampler
from utils.distributed.process_group import ProcessInfo
from utils.distributed.sharding import torch_version
from utils.evaluation.metric_sums import MetricSums, StepOutput
from utils.state.run_folder import find_resume_point

RUN = Path("models") / "Demo_CifarCNN"
EPOCH_LINE = re.compile(r"(\[rank (\d)\] )?epoch (\d+)/\d+  (.*?)  \(")


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def run_torchrun(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """torchrun `args` from the repository, on the CPU, one thread per process; `env` adds to
    the environment."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    return subprocess.run(
        torchrun(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("ddp")
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["data_loader"]["args"].update(num_train=640, validation_split=0.15)  # 96 val samples
    config["trainer"].update(verbosity=2)  # every rank logs its epoch line, tagged with its rank
    config["trainer"]["loggers"] = ["tensorboard", "csv"]  # rank 0 alone writes either
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def two_process_run(config_path: Path) -> dict:
    result = run_torchrun(
        "--standalone", "--nproc_per_node=2", "train.py", "-c", str(config_path), "--run-id", "ddp"
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"run_dir": config_path.parent / "saved" / RUN / "ddp", "stdout": result.stdout}


def epoch_lines(stdout: str) -> dict[int, dict[int, str]]:
    """{rank: {epoch: "train/loss ... val/top_k_acc ..."}} from the console log."""
    found: dict[int, dict[int, str]] = {}
    for match in EPOCH_LINE.finditer(stdout):
        rank = int(match.group(2) or 0)
        found.setdefault(rank, {})[int(match.group(3))] = match.group(4)
    return found


def test_two_processes_agree_and_write_one_set_of_outputs(two_process_run: dict) -> None:
    run_dir = two_process_run["run_dir"]
    lines = epoch_lines(two_process_run["stdout"])
    assert set(lines) == {0, 1} and set(lines[0]) == {1, 2}
    assert lines[0] == lines[1]  # identical all-reduced metrics on both ranks
    assert (
        "Global batch 64 = 32 per process x 2 process(es) x 1 accumulated"
        in two_process_run["stdout"]
    )

    save_dir = run_dir.parents[2]
    assert [path.name for path in (save_dir / "models" / "Demo_CifarCNN").iterdir()] == ["ddp"]
    assert sorted(path.name for path in run_dir.iterdir()) == [
        "checkpoint-epoch1.pth", "checkpoint-epoch2.pth", "config.json", "latest", "model_best.pth"
    ]  # fmt: skip
    log_dir = save_dir / "log" / "Demo_CifarCNN" / "ddp"
    info_log = (log_dir / "info.log").read_text()
    assert "epoch 2/2" in info_log and "[rank 1]" not in info_log
    # One writer of each log: one event file, each epoch and log_step row once.
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1
    epochs = [line.split(",")[0] for line in (log_dir / "metrics.csv").read_text().splitlines()]
    assert epochs == ["epoch", "1", "2"]
    steps = (log_dir / "steps.csv").read_text().splitlines()[1:]
    rows = [tuple(line.split(",")[:2]) for line in steps]
    assert len(rows) == len(set(rows)) and rows == sorted(
        rows, key=lambda row: tuple(map(int, row))
    )
    state = torch.load(run_dir / "checkpoint-epoch2.pth", weights_only=True)
    assert not any(key.startswith("module.") for key in state["model"])
    assert state["global_step"] == 2 * 9  # 544 samples / (32 x 2 ranks), rounded up


def test_single_process_test_py_reproduces_the_distributed_validation(
    two_process_run: dict, tmp_path: Path
) -> None:
    checkpoint = two_process_run["run_dir"] / "checkpoint-epoch2.pth"
    output = tmp_path / "val.json"
    result = run_main("test.py", "-r", str(checkpoint), "--split", "val", "--json", str(output))
    assert result.returncode == 0, result.stderr
    report = json.loads(output.read_text())
    recorded = torch.load(checkpoint, weights_only=True)["metrics"]
    assert report["num_samples"] == 96
    assert report["metrics"]["val/accuracy"] == recorded["val/accuracy"]
    assert report["metrics"]["val/top_k_acc"] == recorded["val/top_k_acc"]
    assert report["metrics"]["val/loss"] == pytest.approx(recorded["val/loss"], rel=1e-6)


@pytest.mark.slow
def test_two_processes_with_the_split_on_the_device(config_path: Path, tmp_path: Path) -> None:
    """pipeline "device": each rank gathers its own shard on the device, and validation over
    both ranks counts every sample once, as test.py in one process does."""
    result = run_torchrun(
        "--standalone", "--nproc_per_node=2", "train.py", "-c", str(config_path), "--epochs", "1",
        "--run-id", "on-device", "--set", "data_loader.args.pipeline=device",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = epoch_lines(result.stdout)
    assert set(lines) == {0, 1} and lines[0] == lines[1]
    checkpoint = config_path.parent / "saved" / RUN / "on-device" / "checkpoint-epoch1.pth"
    recorded = torch.load(checkpoint, weights_only=True)
    assert recorded["global_step"] == 9  # 544 samples / (32 x 2 ranks), rounded up
    output = tmp_path / "val.json"
    result = run_main("test.py", "-r", str(checkpoint), "--split", "val", "--json", str(output))
    assert result.returncode == 0, result.stderr
    report = json.loads(output.read_text())
    assert report["num_samples"] == 96
    assert report["metrics"]["val/accuracy"] == recorded["metrics"]["val/accuracy"]
    assert report["metrics"]["val/loss"] == pytest.approx(recorded["metrics"]["val/loss"], rel=1e-6)


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_a_two_process_checkpoint_resumes_in_one_process_and_back(
    two_process_run: dict, config_path: Path
) -> None:
    run_dir = two_process_run["run_dir"]
    single = run_main("train.py", "-r", str(run_dir / "checkpoint-epoch2.pth"), "--epochs", "3")
    assert single.returncode == 0, single.stderr
    assert "epoch 3/3" in single.stdout
    back = run_torchrun(
        "--standalone", "--nproc_per_node=2",
        "train.py", "-r", str(run_dir / "checkpoint-epoch3.pth"), "--epochs", "4",
    )  # fmt: skip
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    assert set(epoch_lines(back.stdout)[1]) == {4}
    assert torch.load(run_dir / "checkpoint-epoch4.pth", weights_only=True)["epoch"] == 4


def test_two_nodes_on_loopback_with_fewer_validation_samples_than_ranks(
    spawn, config_path: Path
) -> None:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    node_args = [
        "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-nodes",
        "train.py", "-c", str(config_path), "--epochs", "1",
        "--set", "data_loader.args.validation_split=1",
    ]  # fmt: skip
    nodes = [
        spawn(torchrun(*node_args), cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    # The default run id under torchrun is the rendezvous id, the same on both nodes.
    run_dir = config_path.parent / "saved" / RUN / "two-nodes"
    state = torch.load(run_dir / "checkpoint-epoch1.pth", weights_only=True)
    lines = epoch_lines("".join(outputs))
    assert lines[0] == lines[1]
    # One validation sample for two ranks: the padded sampler's copy is not counted twice.
    assert state["metrics"]["val/accuracy"] in (0.0, 1.0)


CLOSE_WHILE_A_COLLECTIVE_RUNS = """
import gc, sys, time
sys.path.insert(0, {root!r})
import torch
import torch.distributed as dist
from utils.distributed.process_group import process_group, process_info

info, ending = process_info(), sys.argv[1]


class Trainer:  # holds the group, as a trainer's DDP model does
    def __init__(self) -> None:
        self.group = dist.group.WORLD
        self.me = self if ending == "cycle" else None  # freed by the garbage collector only


def train() -> None:
    trainer = Trainer()
    if info.rank == 1:
        time.sleep(1)  # rank 0 leaves while its all-reduce still waits for rank 1
    dist.all_reduce(torch.ones(1), async_op=True)  # its tensor's last reference: the worker's
    if ending == "fail":
        raise RuntimeError("stopped")  # its traceback's frames keep `trainer` alive


try:
    with process_group(info, "gloo", torch.device("cpu")):
        train()
except RuntimeError:
    pass
gc.collect()  # as it may run at any time after
print(f"rank {{info.rank}} closed")
"""


@pytest.mark.skipif(
    torch_version() >= (2, 8),
    reason="pytorch/pytorch#154976 is fixed from torch 2.8 on; CI's floor job (torch 2.6) runs it",
)
@pytest.mark.parametrize("ending", ["return", "fail", "cycle"])
def test_leaving_while_a_gloo_worker_still_holds_a_tensor_does_not_hang(
    tmp_path: Path, ending: str
) -> None:
    """Before torch 2.8, destroying a gloo group while its worker thread frees a finished
    collective's tensor deadlocked on the GIL: train.py under torchrun hung at exit now and then
    on torch 2.6, after a run and after a stop signal. Here the worker is made to be exactly
    there when the run returns, raises (the group held in the frames of the error), or leaves
    the group to the garbage collector (held in a reference cycle)."""
    script = tmp_path / "close.py"
    script.write_text(CLOSE_WHILE_A_COLLECTIVE_RUNS.format(root=str(ROOT)))
    try:
        result = run_torchrun("--standalone", "--nproc_per_node=2", str(script), ending, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("leaving the process group hung with a gloo collective in flight")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(result.stdout.split("\n")[:-1]) == ["rank 0 closed", "rank 1 closed"]


def worker_pids(parent: int) -> list[int]:
    """Processes whose parent is `parent` and that run train.py."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == parent and b"train.py" in cmdline:
            pids.append(int(stat.parent.name))
    return pids


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_a_killed_worker_is_restarted_and_the_run_resumes(spawn, config_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = torchrun(
        "--nnodes=1", "--nproc_per_node=2", "--max-restarts=1", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic",
        "train.py", "-c", str(config_path), "--epochs", "3", "--set", "trainer.len_epoch=60",
    )  # fmt: skip
    launcher = spawn(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    run_dir = config_path.parent / "saved" / RUN / "elastic"
    wait_for_file(launcher, run_dir / "checkpoint-epoch1.pth")
    workers = worker_pids(launcher.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)  # mid epoch 2
    output = launcher.communicate(timeout=300)[0]
    assert launcher.returncode == 0, output[-4000:]
    assert "Resumed from" in output
    final = torch.load(run_dir / "checkpoint-epoch3.pth", weights_only=True)
    assert final["epoch"] == 3 and final["global_step"] == 3 * 60
    assert not (run_dir / "checkpoint-epoch4.pth").exists()


@pytest.mark.slow
@pytest.mark.skipif(not SAMPLE_DIR.is_dir(), reason=NO_SAMPLE)
def test_imagenet_config_smoke_under_torchrun(tmp_path: Path) -> None:
    overrides = {
        "n_gpu": 0,
        "data_loader.args.data_dir": str(SAMPLE_DIR),
        "data_loader.args.image_size": 32,
        "data_loader.args.eval_image_size": 32,
        "data_loader.args.eval_resize_size": 36,
        "data_loader.args.batch_size": 16,
        "data_loader.args.num_workers": 0,
        "arch.args.name": "resnet18",
        "arch.args.num_classes": 10,
        "trainer.epochs": 1,
        "lr_scheduler.warmup_epochs": 0,  # the recipe's 5 would leave nothing of 1 epoch
        "trainer.len_epoch": 3,
        "trainer.save_dir": str(tmp_path / "saved"),
        "trainer.tensorboard": False,
    }
    sets = set_flags(overrides)
    result = run_torchrun(
        "--standalone", "--nproc_per_node=2", "train.py", "-c", "configs/imagenet.json",
        "--run-id", "smoke", *sets,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "saved" / "models" / "ImageNet_ResNet50" / "smoke"
    state = torch.load(run_dir / "checkpoint-epoch1.pth", weights_only=True)
    assert state["global_step"] == 3 and 0 <= state["metrics"]["val/accuracy"] <= 1


# --- what a first multi-GPU run meets, on gloo ---------------------------------------------------

DOWNLOAD_WRAPPER = """
import os, sys, time
from pathlib import Path

sys.path[:0] = [{root!r}, {tests!r}]
from torchvision.datasets import cifar

from cifar_archive import archive_files, md5_attributes

files = archive_files()
for name, value in md5_attributes(files, cifar.CIFAR10.meta).items():
    setattr(cifar.CIFAR10, name, value)


def fake_download(url, download_root, filename=None, md5=None, **kwargs):
    with open({log!r}, "a") as log:
        log.write(os.environ["RANK"] + "\\n")
    time.sleep(1)  # a slow network: a rank that does not wait starts its own download
    folder = Path(download_root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_bytes(content)


cifar.download_and_extract_archive = fake_download
import train

sys.exit(train.main())
"""


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_cifar10_is_downloaded_once_and_every_rank_trains(config_path: Path, tmp_path: Path):
    log = tmp_path / "downloads.log"
    wrapper = tmp_path / "train_offline.py"
    wrapper.write_text(
        DOWNLOAD_WRAPPER.format(root=str(ROOT), tests=str(ROOT / "tests"), log=str(log))
    )
    config = json.loads(config_path.read_text())
    config["data_loader"] = {
        "type": "Cifar10DataLoader",
        "args": {"data_dir": str(tmp_path / "cifar"), "batch_size": 16, "validation_split": 20},
    }
    config["trainer"]["save_dir"] = str(tmp_path / "saved")
    path = tmp_path / "cifar.json"
    path.write_text(json.dumps(config))
    result = run_torchrun(
        "--standalone", "--nproc_per_node=2", str(wrapper), "-c", str(path), "--epochs", "1",
        "--run-id", "cifar",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert log.read_text() == "0\n"  # rank 0 alone downloaded
    lines = epoch_lines(result.stdout)
    assert set(lines) == {0, 1} and lines[0] == lines[1]  # and both ranks trained
    state = torch.load(
        tmp_path / "saved" / "models" / "Demo_CifarCNN" / "cifar" / "checkpoint-epoch1.pth",
        weights_only=True,
    )
    assert state["global_step"] == 3  # 80 training images / (16 x 2 ranks), rounded up


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_a_mid_epoch_resume_restores_each_ranks_own_rng(spawn, config_path: Path) -> None:
    """With dropout and augmentation drawn per rank, a 2-process run stopped mid-epoch and
    resumed ends bit-for-bit where the uninterrupted run does."""
    args = [
        "--set", "trainer.len_epoch=60", "--set", "trainer.deterministic=true",
        "--set", "trainer.log_step=5", "--set", "arch.args.dropout=0.3", "--epochs", "2",
    ]  # fmt: skip
    straight = run_torchrun(
        "--standalone", "--nproc_per_node=2", "train.py", "-c", str(config_path),
        "--run-id", "straight", *args,
    )  # fmt: skip
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]

    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    launcher = spawn(
        torchrun(
            "--standalone", "--nproc_per_node=2", "train.py", "-c", str(config_path),
            "--run-id", "stopped", *args,
        ),
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    run_dir = config_path.parent / "saved" / RUN / "stopped"
    wait_for_file(launcher, run_dir / "checkpoint-epoch1.pth")
    for pid in worker_pids(launcher.pid):  # as SLURM signals every process of the job
        os.kill(pid, signal.SIGUSR1)
    output = launcher.communicate(timeout=120)[0]
    saved = list(run_dir.glob("checkpoint-epoch2-step*.pth"))
    assert len(saved) == 1, output[-3000:]
    rng = torch.load(saved[0], weights_only=True)["rng"]
    assert len(rng) == 2 and not torch.equal(rng[0]["torch"], rng[1]["torch"])

    resumed = run_torchrun("--standalone", "--nproc_per_node=2", "train.py", "-r", str(saved[0]))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    reference = torch.load(
        config_path.parent / "saved" / RUN / "straight" / "checkpoint-epoch2.pth",
        weights_only=True,
    )
    final = torch.load(run_dir / "checkpoint-epoch2.pth", weights_only=True)
    for key, value in reference["model"].items():
        assert torch.equal(value, final["model"][key]), key
    assert final["metrics"]["val/loss"] == reference["metrics"]["val/loss"]


def test_ddp_wraps_without_a_buffer_broadcast_nor_a_deprecation_warning() -> None:
    """One gloo process, in this process: the flag's spelling changed in torch 2.13, and the
    deprecated one warns on every rank of every run."""
    import warnings

    import torch.distributed as dist

    from utils.distributed.process_group import data_parallel

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            wrapped = data_parallel(torch.nn.BatchNorm1d(3), None)
        assert wrapped.broadcast_buffers is False  # both versions answer to the old name
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def odd_checkpoint(config_path: Path) -> Path:
    """One epoch in one process with 33 validation samples: no world size of 2 or 3 divides
    them, nor their batches of 8."""
    result = run_main(
        "train.py", "-c", str(config_path), "--run-id", "odd", "--epochs", "1",
        "--set", "data_loader.args.validation_split=33", "--set", "data_loader.args.batch_size=8",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return config_path.parent / "saved" / RUN / "odd" / "checkpoint-epoch1.pth"


@pytest.mark.slow  # three torchrun launches
def test_test_py_under_torchrun_reports_once_what_one_process_does(
    odd_checkpoint: Path, tmp_path: Path
) -> None:
    """Before, every rank evaluated the whole split on its own, and each printed the report and
    added the confusion matrix to TensorBoard: once per rank. Now the ranks share the split, each
    sample counted once, and rank 0 alone reports."""
    log_dir = config_path_log_dir(odd_checkpoint)
    reference = tmp_path / "one.json"
    args = ["-r", str(odd_checkpoint), "--split", "val", "--confusion-png"]
    result = run_main("test.py", *args, str(tmp_path / "one.png"), "--json", str(reference))
    assert result.returncode == 0, result.stderr[-3000:]
    expected = json.loads(reference.read_text())
    for processes in (1, 2, 3):
        events = len(list(log_dir.glob("events.out.tfevents.*")))
        output, image = tmp_path / f"{processes}.json", tmp_path / f"{processes}.png"
        result = run_torchrun(
            "--standalone", f"--nproc_per_node={processes}", "test.py", *args, str(image),
            "--json", str(output),
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert result.stdout.count("val: 33 samples") == 1, result.stdout
        assert len(list(log_dir.glob("events.out.tfevents.*"))) == events + 1
        report = json.loads(output.read_text())
        assert report["num_samples"] == 33
        assert report["confusion_matrix"] == expected["confusion_matrix"]
        assert report["per_class"] == expected["per_class"]
        # Counts exactly; the loss to float32's rounding of other batches' means.
        assert report["metrics"]["val/accuracy"] == expected["metrics"]["val/accuracy"]
        assert report["metrics"]["val/top_k_acc"] == expected["metrics"]["val/top_k_acc"]
        assert report["metrics"]["val/loss"] == pytest.approx(
            expected["metrics"]["val/loss"], rel=1e-6
        )
    # A warning every rank would give alike (other data, allowed) is printed once.
    result = run_torchrun(
        "--standalone", "--nproc_per_node=2", "test.py", "-r", str(odd_checkpoint), "--split",
        "val", "--set", "data_loader.args.data_seed=1", "--allow-data-change",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("the data changed since this checkpoint") == 1, output


def config_path_log_dir(checkpoint: Path) -> Path:
    """The log folder of the run whose checkpoint this is (saved/log/<name>/<run id>)."""
    return checkpoint.parents[3] / "log" / checkpoint.parents[1].name / checkpoint.parent.name


def test_a_resume_warns_on_rank_0_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every rank reads the same checkpoint with the same config: under torchrun each printed
    the same resume warnings (the number of processes 2 -> 3, the schedule rebuilt), tagged
    [rank N]. Now rank 0 says them once; verbosity 2 still shows every rank's."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update(epochs=1, tensorboard=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert run_main("train.py", "-c", str(path), "--run-id", "run").returncode == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    for rank, verbosity, expected in ((0, 1, 1), (1, 1, 0), (1, 2, 1)):
        args = ["-r", str(run_dir), "--epochs", "2", "--set", "data_loader.args.batch_size=16",
                "--set", f"trainer.verbosity={verbosity}"]  # fmt: skip
        parsed = ConfigParser.from_args(train_script.parse_args(args))
        info = ProcessInfo(rank=rank, world_size=2)
        trainer = build_trainer(parsed, info, torch.device("cpu"), logging.getLogger("train"))
        caplog.clear()
        with caplog.at_level(logging.INFO):
            trainer.resume(find_resume_point(parsed))
        warned = [
            record.getMessage()
            for record in caplog.records
            if record.levelno == logging.WARNING
            and "data_loader.args.batch_size" in record.getMessage()
        ]
        assert len(warned) == expected, (rank, verbosity, warned)


def test_a_config_warning_is_printed_once_under_torchrun(config_path: Path) -> None:
    """Every rank builds the run from one config; a warning about it (here a schedule that ends
    before the run) was printed once per rank."""
    result = run_torchrun(
        "--standalone", "--nproc_per_node=2", "train.py", "-c", str(config_path),
        "--run-id", "warned", "--epochs", "2", "--set", "lr_scheduler.args.T_max=1",
        "--set", "trainer.verbosity=1",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("lr_scheduler: CosineAnnealingLR ends after") == 1, output


@pytest.mark.slow
def test_a_data_warning_is_printed_once_under_torchrun(tmp_path: Path) -> None:
    """Every rank reads the one image folder; its warning of files of a format not read (a
    .heic photo) was printed once per rank."""
    images = noise_image_folder(tmp_path / "images", count=18)
    (images / "train" / "class0" / "photo.heic").write_bytes(b"not read")
    overrides = {
        "n_gpu": 0,
        "arch.args.weights": None,
        "arch.args.num_classes": 3,
        "data_loader.args.data_dir": str(images),
        "data_loader.args.image_size": 32,
        "data_loader.args.validation_split": 6,
        "data_loader.args.batch_size": 3,
        "data_loader.args.num_workers": 0,
        "trainer.epochs": 1,
        "trainer.len_epoch": 1,
        "trainer.save_dir": str(tmp_path / "saved"),
        "trainer.tensorboard": False,
    }
    result = run_torchrun(
        "--standalone", "--nproc_per_node=2", "train.py", "-c", "configs/finetune.json",
        "--run-id", "warned", *set_flags(overrides),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("left out 1 image files of a format not read (1 .heic)") == 1, output


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("predict.py", ["--out", "rows.csv"]),
        ("export.py", ["--format", "torchscript", "--out", "model.pt"]),
    ],
)
def test_predict_and_export_refuse_several_processes_in_one_line(
    odd_checkpoint: Path, tmp_path: Path, script: str, args: list[str]
) -> None:
    """Under torchrun every rank did all of the work: predict.py printed every row once per rank
    (twice in a file its stdout went to) and the ranks of export.py wrote --out at the same
    time. They work in one process: more are refused before anything is read or written."""
    image = tmp_path / "image.png"
    Image.new("RGB", (32, 32), (200, 30, 30)).save(image)
    inputs = [str(image)] if script == "predict.py" else []
    out = tmp_path / args[-1]
    args = [*args[:-1], str(out)]
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}  # what torchrun sets, rank 1 of 2
    result = run_main(script, "-r", str(odd_checkpoint), *inputs, *args, env=env)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        f"error: {script} runs in one process: start it with python, not torchrun (its 2 "
        f"processes would each {'print every row and write --out' if inputs else 'write --out'})"
    ]
    assert not out.exists() and result.stdout == ""


@settings(max_examples=30, deadline=None)
@given(
    num_samples=st.integers(0, 70),
    world_size=st.integers(1, 5),
    batch_size=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_evaluation_shares_sum_to_one_process_for_any_world_size(
    num_samples: int, world_size: int, batch_size: int, seed: int
) -> None:
    """What the distributed validation and test.py under torchrun rest on: the evaluation
    sampler's shares (no padding) hold every sample exactly once, and the metric sums of the
    ranks' batches, added, are those of one process (accuracy equal to scikit-learn's, however
    the samples are cut into ranks and batches)."""
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    generator = torch.Generator().manual_seed(seed)
    outputs = torch.randn(num_samples, 4, generator=generator)  # logits (N, C)
    targets = torch.randint(0, 4, (num_samples,), generator=generator)
    metric_fns = {"accuracy": metric_module.accuracy}
    shares = [
        EpochSampler(range(num_samples), shuffle=False, seed=0, num_replicas=world_size, rank=rank)
        for rank in range(world_size)
    ]
    seen = sorted(index for sampler in shares for index in sampler)
    assert seen == list(range(num_samples))  # none twice, none missed

    def sums_of(indices: list[int], size: int) -> torch.Tensor:
        sums = MetricSums(metric_fns, torch.device("cpu"))
        for start in range(0, len(indices), size):
            batch = torch.tensor(indices[start : start + size], dtype=torch.long)
            loss = torch.nn.functional.cross_entropy(outputs[batch], targets[batch])
            sums.add(StepOutput(loss=loss, output=outputs[batch], target=targets[batch]))
        return sums.all_ranks()  # one process: its own sums

    ranks = sum(sums_of(list(sampler), batch_size) for sampler in shares)
    alone = sums_of(list(range(num_samples)), num_samples or 1)
    assert ranks[-1] == alone[-1] == num_samples
    assert ranks[1] == alone[1]  # right answers: counts, exact
    torch.testing.assert_close(ranks[0], alone[0], rtol=1e-6, atol=1e-6)  # loss x batch size
    if num_samples:
        expected = sklearn_metrics.accuracy_score(targets.numpy(), outputs.argmax(dim=1).numpy())
        assert float(ranks[1] / ranks[-1]) == pytest.approx(expected, abs=1e-12)


# train.py on a CPU that torch says computes bf16 only by emulation, as every rank sees it.
EMULATED_BF16 = """
import sys
sys.path.insert(0, {root!r})
import utils.distributed.device as device
device.cpu_computes_bf16 = lambda: False  # this process is the test's own: no monkeypatch here
import train
sys.exit(train.main(sys.argv[1:]))
"""


def test_the_device_warnings_are_said_once_under_torchrun(tmp_path: Path) -> None:
    """Every rank picks its device from one config: a warning about it (bf16 emulated on this
    CPU) is rank 0's to say. Each rank printed it, tagged with its rank."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["data_loader"]["args"].update(num_train=64, num_test=8, validation_split=16)
    config["trainer"].update(amp="bf16", epochs=1, tensorboard=False)
    (tmp_path / "config.json").write_text(json.dumps(config))
    script = tmp_path / "emulated_bf16.py"
    script.write_text(EMULATED_BF16.format(root=str(ROOT)))
    command = [
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        "-c",
        str(tmp_path / "config.json"),
    ]
    result = run_torchrun(*command, "--run-id", "bf16", timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("on a CPU without bf16 instructions") == 1, output[-3000:]
