"""FSDP2 (distributed.strategy "fsdp") on CPU with gloo, 2 processes: the gradients and weights
of one process on the global batch and of DDP, sharded checkpoints that resume bit-exact inside
an epoch, on another world size, after a kill inside a save, and that test.py reads alone;
the same weights whether the run decoded its images or found them cached."""

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    ROOT,
    kill_job,
    noise_image_folder,
    run_main,
    set_flags,
    shrink,
    wait_for_file,
)
from ports import free_port

from base.base_model import model_summary
from model.model import CifarCNN, TorchvisionModel
from parse_config import ConfigError
from utils.config.load_config import validate
from utils.distributed.sharding import (
    GLOO_FSDP_MIN_TORCH,
    check_fsdp_backend,
    checkpoint_activations,
    default_blocks,
    torch_version,
)
from utils.state.checkpoint import load_checkpoint
from utils.state.model_state import load_model_state
from utils.state.sharded import SafeReader, ShardsError, collect_garbage
from utils.util import UserError

RUN = Path("models") / "Demo_CifarCNN"
needs_gloo_fsdp = pytest.mark.skipif(
    torch_version() < GLOO_FSDP_MIN_TORCH,
    reason="FSDP on gloo needs torch >= 2.9 (pytorch/pytorch#162338); the template refuses it",
)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}


def torchrun(*args: str, processes: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
        f"--nproc_per_node={processes}", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}", *args,
    ]  # fmt: skip


def run_torchrun(*args: str, processes: int = 2) -> subprocess.CompletedProcess:
    result = subprocess.run(
        torchrun(*args, processes=processes),
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def trained_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's weights, sharded or not, as one process without a process group sees
    them (test.py, predict.py, export.py)."""
    state = load_checkpoint(checkpoint)
    model = CifarCNN(**state["config"]["arch"]["args"])
    load_model_state(model, state, checkpoint)
    return model.state_dict()


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fsdp")
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), folder / "saved")
    config["data_loader"]["args"].update(num_train=640, validation_split=0.15)
    # Accumulation (no gradient sync but on a group's last batch) and clipping of the shards.
    config["trainer"].update(
        grad_accum_steps=2, grad_clip=0.5, deterministic=True, log_step=1, tensorboard=False
    )
    config["distributed"] = {"strategy": "fsdp"}
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def straight(config_path: Path) -> Path:
    """2 epochs of FSDP on 2 processes, uninterrupted: its run folder."""
    run_torchrun("train.py", "-c", str(config_path), "--run-id", "straight")
    return config_path.parent / "saved" / RUN / "straight"


# --- the model's blocks, activation checkpointing, what is refused --------------------------------


def test_the_default_blocks_of_resnet_vit_and_the_template_cnns() -> None:
    resnet = TorchvisionModel("resnet18", num_classes=10)
    assert default_blocks(resnet) == [getattr(resnet.network, f"layer{i}") for i in (1, 2, 3, 4)]
    vit = TorchvisionModel("vit_b_16", num_classes=10)
    assert default_blocks(vit) == list(vit.network.encoder.layers)
    cnn = CifarCNN(widths=[8, 16, 32])
    assert cnn.blocks() == list(cnn.features) and len(cnn.blocks()) == 3


def test_activation_checkpointing_keeps_the_names_and_the_gradients() -> None:
    images, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    gradients = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = CifarCNN(widths=[8, 16])
        names = [name for name, _ in model.named_parameters()]
        if recompute:
            assert checkpoint_activations(model) == 2
        assert [name for name, _ in model.named_parameters()] == names
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        gradients.append([p.grad for p in model.parameters()])
    for plain, recomputed in zip(*gradients, strict=True):
        assert torch.equal(plain, recomputed)


def test_activation_checkpointing_needs_blocks() -> None:
    with pytest.raises(UserError, match="has no blocks to recompute"):
        checkpoint_activations(torch.nn.Sequential(torch.nn.Linear(2, 2)))


@pytest.mark.parametrize(
    ("section", "key", "value", "why"),
    [
        ("distributed", "sync_bn", True, "SyncBatchNorm"),
        ("trainer", "ema_decay", 0.99, "whole copy of the model"),
        ("trainer", "lookahead_period", 5, "whole copy of the model"),
        ("trainer", "compile", True, "compiling a sharded model"),
        ("trainer", "amp", "fp16", "bf16"),
    ],
)
def test_what_fsdp_does_not_combine_with_is_refused_in_one_line(section, key, value, why) -> None:
    config = json.loads((ROOT / "configs/demo.json").read_text())
    config["distributed"] = {"strategy": "fsdp"}
    config[section][key] = value
    with pytest.raises(
        ConfigError, match=f'{section}.{key}: not with distributed.strategy "fsdp"'
    ) as raised:
        validate(config, "x.json")
    assert why in str(raised.value)


def test_fsdp_on_gloo_is_refused_before_torch_2_9(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.8.0")
    with pytest.raises(UserError, match=r"needs torch >= 2\.9.*pytorch/pytorch#162338"):
        check_fsdp_backend("gloo")
    check_fsdp_backend("nccl")  # NCCL's reduce-scatter averages right from the floor


# --- reading shards safely, and what no checkpoint names ------------------------------------------


class Payload:
    def __reduce__(self) -> tuple:
        return (os.system, ("echo owned",))


def test_shards_metadata_naming_any_other_python_object_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "shards-step1-0000.dcp"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ShardsError, match="refused to load: it references the Python object"):
        SafeReader(folder).read_metadata()
    (folder / ".metadata").unlink()
    with pytest.raises(ShardsError, match=r"no \.metadata: a save cut short"):
        SafeReader(folder).read_metadata()


def test_folders_no_checkpoint_names_are_collected(tmp_path: Path) -> None:
    named, orphan = tmp_path / "shards-step2-aaaa.dcp", tmp_path / "shards-step3-bbbb.dcp"
    for folder in (named, orphan):
        folder.mkdir()
        (folder / "__0_0.distcp").write_bytes(b"x")
    torch.save({"model": None, "config": {}, "epoch": 1, "sharded": named.name},
               tmp_path / "model_best.pth")  # fmt: skip
    assert collect_garbage(tmp_path) == [orphan.name]
    assert named.is_dir() and not orphan.exists()


# --- 2 processes on gloo --------------------------------------------------------------------------


@needs_gloo_fsdp
def test_one_fsdp_step_has_the_gradients_of_one_process_on_the_global_batch(tmp_path: Path):
    sys.path.insert(0, str(ROOT / "tests"))
    from fsdp_gradients import fixed_batch, new_model

    out = tmp_path / "fsdp.pt"
    run_torchrun("tests/fsdp_gradients.py", str(out))
    sharded = torch.load(out, weights_only=True)
    model = new_model()
    images, labels = fixed_batch()
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(sharded["grads"][name], parameter.grad, rtol=1e-5, atol=1e-7)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    torch.testing.assert_close(sharded["norm"], norm)
    # With bf16 parameters the layers computed in bf16 (8 bits of mantissa: each gradient is
    # noisy); the reduced gradients are fp32 and point where fp32's do.
    assert sharded["bf16_forward"] == "torch.bfloat16"
    for name, parameter in model.named_parameters():
        mixed = sharded["bf16_grads"][name]
        assert mixed.dtype == torch.float32
        similarity = torch.nn.functional.cosine_similarity(
            mixed.flatten(), parameter.grad.flatten(), dim=0
        )
        assert similarity > 0.98, name
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(sharded["weights"][name], parameter.detach())


@needs_gloo_fsdp
@pytest.mark.slow  # CI's main job; the floor job skips FSDP on gloo anyway
def test_fsdp_trains_to_ddps_weights_and_test_py_repeats_its_validation(
    straight: Path, config_path: Path, tmp_path: Path
) -> None:
    run_torchrun("train.py", "-c", str(config_path), "--run-id", "ddp",
                 "--set", "distributed.strategy=ddp")  # fmt: skip
    ddp = config_path.parent / "saved" / RUN / "ddp" / "checkpoint-epoch2.pth"
    fsdp = straight / "checkpoint-epoch2.pth"
    assert load_checkpoint(fsdp)["model"] is None and load_checkpoint(fsdp)["sharded"]
    reference, sharded = trained_weights(ddp), trained_weights(fsdp)
    # DDP all-reduces whole gradients, FSDP reduce-scatters shards: the sums run in another
    # order, and ten steps later single weights differ by up to ~1.4e-5 (seen in CI on a bias
    # near 3e-3). A wrong update (a missed shard, a doubled mean) moves them by 1e-3 or more.
    for name, value in reference.items():
        torch.testing.assert_close(sharded[name], value, rtol=1e-4, atol=1e-4)
    # One process, no process group: the distributed validation again, every sample once.
    output = tmp_path / "test.json"
    result = run_main("test.py", "-r", str(fsdp), "--split", "val", "--json", str(output))
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = load_checkpoint(fsdp)["metrics"]
    report = json.loads(output.read_text())
    assert report["num_samples"] == 96
    assert report["metrics"]["val/accuracy"] == recorded["val/accuracy"]
    assert report["metrics"]["val/loss"] == pytest.approx(recorded["val/loss"], rel=1e-6)
    # export.py: one consolidated file from the shards, checked against the checkpoint's model.
    exported = tmp_path / "model.pt"
    result = run_main(
        "export.py", "-r", str(fsdp), "--format", "torchscript", "--out", str(exported)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert exported.is_file()


@needs_gloo_fsdp
@pytest.mark.slow
def test_a_stop_inside_an_epoch_resumes_bit_exact_and_on_another_world_size(
    straight: Path, config_path: Path, spawn
) -> None:
    launcher = spawn(
        torchrun("train.py", "-c", str(config_path), "--run-id", "stopped"),
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    run_dir = config_path.parent / "saved" / RUN / "stopped"
    wait_for_file(launcher, run_dir / "checkpoint-epoch1.pth")
    launcher.send_signal(signal.SIGTERM)  # torchrun passes it to both workers
    output = launcher.communicate(timeout=120)[0]
    (inside,) = run_dir.glob("checkpoint-epoch2-step*.pth")  # the stop's checkpoint
    assert load_checkpoint(inside)["sharded"], output[-3000:]
    one_process = run_dir.parent / "one-process"
    shutil.copytree(run_dir, one_process)

    run_torchrun("train.py", "-r", str(run_dir))  # 2 ranks again: bit for bit
    reference = trained_weights(straight / "checkpoint-epoch2.pth")
    for name, value in trained_weights(run_dir / "checkpoint-epoch2.pth").items():
        assert torch.equal(value, reference[name]), name
    final, expected = (load_checkpoint(d / "checkpoint-epoch2.pth") for d in (run_dir, straight))
    assert final["metrics"]["val/loss"] == expected["metrics"]["val/loss"]

    # 2 ranks -> 1: the shards of both ranks resharded into one process, the epoch finished.
    result = run_main("train.py", "-r", str(one_process), "--epochs", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the number of processes 2 -> 1" in result.stdout
    assert load_checkpoint(one_process / "checkpoint-epoch3.pth")["epoch"] == 3
    # ... and 1 -> 2.
    back = run_torchrun("train.py", "-r", str(one_process), "--epochs", "4")
    assert "epoch 4/4" in back.stdout
    assert load_checkpoint(one_process / "checkpoint-epoch4.pth")["geometry"]["world_size"] == 2


@needs_gloo_fsdp
@pytest.mark.slow
def test_a_kill_inside_a_sharded_save_resumes_the_checkpoint_before(
    config_path: Path, spawn
) -> None:
    launcher = spawn(
        torchrun("tests/faulty_train.py", "-c", str(config_path), "--run-id", "killed"),
        cwd=ROOT, env={**ENV, "FAULT_SLOW_SAVE": "0.05"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    run_dir = config_path.parent / "saved" / RUN / "killed"
    deadline = time.monotonic() + 180
    # The second epoch's shards are being written (each tensor pauses half-way).
    while len(list(run_dir.glob("shards-*.dcp"))) < 2 or not (run_dir / "latest").exists():
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.01)
    kill_job(launcher)  # torchrun and its workers, as a lost node
    launcher.wait()
    (cut_short,) = [f for f in run_dir.glob("shards-*.dcp") if not (f / ".metadata").exists()]
    assert not (run_dir / "checkpoint-epoch2.pth").exists()

    result = run_main("train.py", "-r", str(run_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "Resumed from" in result.stdout and "checkpoint-epoch1.pth (epoch 1 done" in result.stdout
    )
    assert f"Removed 1 shards folder(s) no checkpoint names: {cut_short.name}" in result.stdout
    assert not cut_short.exists()
    assert load_checkpoint(run_dir / "checkpoint-epoch2.pth")["epoch"] == 2


@needs_gloo_fsdp
@pytest.mark.slow
def test_the_vit_recipe_trains_a_tiny_version_of_itself(tmp_path: Path) -> None:
    """configs/imagenet_vit.json as it ships (FSDP, bf16 parameters, activation checkpointing,
    its optimizer groups and augmentation) with a ViT-B/32 on 32x32 images in 2 processes."""
    noise_image_folder(tmp_path / "images")
    overrides = {
        "n_gpu": 0,
        "arch.args.name": "vit_b_32",
        "arch.args.num_classes": 3,
        "arch.args.builder_args": {"image_size": 32},
        "data_loader.args.data_dir": str(tmp_path / "images"),
        "data_loader.args.validation_split": 6,
        "data_loader.args.image_size": 32,
        "data_loader.args.eval_image_size": 32,
        "data_loader.args.eval_resize_size": 36,
        "data_loader.args.batch_size": 3,
        "data_loader.args.num_workers": 0,
        "trainer.epochs": 1,
        "trainer.len_epoch": 2,
        "lr_scheduler.warmup_epochs": 0,
        "trainer.save_dir": str(tmp_path / "saved"),
        "trainer.tensorboard": False,
    }
    result = run_torchrun(
        "train.py", "-c", "configs/imagenet_vit.json", "--run-id", "tiny", *set_flags(overrides)
    )
    assert "Activation checkpointing: 12 blocks" in result.stdout
    assert "FSDP: 12 blocks and the root sharded over 2 process(es)" in result.stdout
    # The summary of the sharded model is the plain one's: the config's class, every parameter.
    plain = TorchvisionModel("vit_b_32", num_classes=3, builder_args={"image_size": 32})
    assert model_summary(plain) in result.stdout
    state = load_checkpoint(
        tmp_path / "saved" / "models" / "ImageNet_ViT_L_16" / "tiny" / "checkpoint-epoch1.pth"
    )
    assert state["global_step"] == 2 and state["sharded"] and state["model"] is None


@needs_gloo_fsdp
@pytest.mark.slow
def test_background_saves_end_where_blocking_ones_do(straight: Path, config_path: Path) -> None:
    """trainer.async_checkpoint: epoch 1's shards written while epoch 2 trains, its checkpoint
    file written when epoch 2's save begins; the run ends bit for bit as the blocking one."""
    result = run_torchrun("train.py", "-c", str(config_path), "--run-id", "background",
                          "--set", "trainer.async_checkpoint=true")  # fmt: skip
    run_dir = config_path.parent / "saved" / RUN / "background"
    assert result.stdout.index("Saved") > result.stdout.index("epoch 2/2")  # epoch 1's, late
    first = load_checkpoint(run_dir / "checkpoint-epoch1.pth")
    assert (run_dir / first["sharded"] / ".metadata").is_file()
    reference = trained_weights(straight / "checkpoint-epoch2.pth")
    for name, value in trained_weights(run_dir / "checkpoint-epoch2.pth").items():
        assert torch.equal(value, reference[name]), name
    config = json.loads(config_path.read_text())
    config["trainer"]["async_checkpoint"] = True
    config["distributed"]["strategy"] = "ddp"
    with pytest.raises(ConfigError, match=r'async_checkpoint: needs distributed\.strategy "fsdp"'):
        validate(config, "x.json")


@needs_gloo_fsdp
@pytest.mark.slow
def test_a_run_that_decodes_the_image_cache_trains_as_one_that_reads_it(tmp_path: Path) -> None:
    """FSDP keeps each rank's own initial shard (DDP would broadcast rank 0's weights), and only
    one process per node decodes the images: that decoding must not move the weights any rank
    starts from, so a first run and the same run on the cache end bit for bit alike."""
    noise_image_folder(tmp_path / "images")
    config = shrink(json.loads((ROOT / "configs/cifar10_cnn.json").read_text()), tmp_path / "saved")
    config["arch"]["args"]["num_classes"] = 3
    config["metrics"] = ["accuracy"]
    config["data_loader"] = {
        "type": "ImageFolderDataLoader",
        "args": {"data_dir": str(tmp_path / "images"), "preset": "cifar", "pipeline": "device",
                 "batch_size": 3, "validation_split": 6},
    }  # fmt: skip
    config["trainer"].update(epochs=1, len_epoch=2, amp=None, tensorboard=False)
    config["distributed"] = {"strategy": "fsdp"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    weights = {}
    for run_id, cache in (
        ("decodes", "Decoded images: cached"),
        ("reads", "Decoded images: reusing"),
    ):
        result = run_torchrun("train.py", "-c", str(path), "--run-id", run_id)
        assert cache in result.stdout + result.stderr
        run_dir = tmp_path / "saved" / "models" / "Cifar10_CifarCNN" / run_id
        weights[run_id] = trained_weights(run_dir / "checkpoint-epoch1.pth")
    for name, value in weights["reads"].items():
        assert torch.equal(weights["decodes"][name], value), name
