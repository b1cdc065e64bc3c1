"""FSDP (distributed.strategy "fsdp") beside the paths tests/test_fsdp.py takes (issue 31, items
8-11, 14 and 16): validation on ranks with unequal batches, DCP's errors, an ordinary checkpoint
resumed or fine-tuned under FSDP, channels_last, SGD's kernels on sharded parameters, and the
optimizer state of parameters new to a changed config.

Most run in this process as torchrun's only worker (one_rank): it joins a process group of one
and FSDP shards the model all the same (its parameters become DTensors), without starting
processes; those that need two ranks run under torchrun and are marked slow."""

import errno
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import NUM_EXAMPLES, ROOT, run_main, shrink
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from ports import free_port
from test_fsdp import needs_gloo_fsdp, run_torchrun, trained_weights
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.tensor import DTensor

import train as train_script
from build import build_trainer, input_transform
from data_loader.data_loaders import load_image
from model.model import CifarCNN
from parse_config import ConfigError, ConfigParser
from utils.distributed.process_group import process_group, process_info
from utils.distributed.sharding import shard_model
from utils.optim.optimizer import build_optimizer, kernel_args
from utils.state.checkpoint import load_checkpoint
from utils.state.run_folder import find_resume_point
from utils.state.sharded import ShardsError, check_shards, load_shards, write_shards

RUN = Path("models") / "Demo_CifarCNN"


def one_rank_env() -> dict[str, str]:
    """The environment torchrun gives its only worker: train.py's main() run in this process
    with it joins a process group of one (gloo) and shards the model."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's train.py runs in this process as torchrun's only worker (one_rank_env)."""
    for name, value in one_rank_env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def one_rank_group(one_rank: None) -> Iterator[None]:
    """Inside: a member of a process group of one, as train.py joins it under torchrun."""
    with process_group(process_info(), "gloo", torch.device("cpu")):
        yield


def write_config(tmp_path: Path, name: str = "config.json", **sections: dict) -> Path:
    """demo_config(tmp_path, **sections) written to tmp_path/name."""
    path = tmp_path / name
    path.write_text(json.dumps(demo_config(tmp_path, **sections)))
    return path


def train(*args: str, env: dict[str, str] | None = None) -> str:
    """train.py's main(args) in this process; its output. env: one_rank_env() for FSDP."""
    result = run_main("train.py", *args, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def demo_config(tmp_path: Path, **sections: dict) -> dict:
    """The shrunk demo (256 training samples, batch 32), FSDP, deterministic, with `sections`
    merged into the config's sections."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update(epochs=1, deterministic=True, tensorboard=False)
    config["distributed"] = {"strategy": "fsdp"}
    for section, values in sections.items():
        config[section].update(values)
    return config


# --- 16. SGD on sharded parameters ----------------------------------------------------------------


@pytest.mark.parametrize("optimizer_type", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("sharded", [False, True])
def test_the_kernels_chosen_on_cuda_are_those_the_parameters_take(
    optimizer_type: str, sharded: bool
) -> None:
    chosen = kernel_args(optimizer_type, {}, fused_available=True, sharded=sharded)
    # DTensor has a sharding rule for the fused Adam and AdamW, not for the fused SGD.
    if sharded and optimizer_type == "SGD":
        assert chosen == {"foreach": True}
    else:
        assert chosen == {"fused": True}
    assert kernel_args(optimizer_type, {}, fused_available=False, sharded=sharded) == {}
    # What optimizer.args chooses is kept (and never collides with what is added).
    assert (
        kernel_args(optimizer_type, {"fused": False}, fused_available=True, sharded=sharded) == {}
    )
    no_foreach = kernel_args(
        optimizer_type, {"foreach": False}, fused_available=True, sharded=sharded
    )
    assert no_foreach == ({} if sharded and optimizer_type == "SGD" else {"fused": True})
    assert (
        kernel_args(optimizer_type, {"foreach": True}, fused_available=True, sharded=sharded) == {}
    )


@needs_gloo_fsdp
@pytest.mark.parametrize("optimizer_type", ["SGD", "Adam", "AdamW"])
def test_the_optimizer_built_for_cuda_steps_sharded_parameters(
    one_rank_group: None, tmp_path: Path, optimizer_type: str
) -> None:
    """configs/imagenet_vit.json ships FSDP with SGD. The device decides the kernels (CUDA: fused
    ones); the parameters here are CPU DTensors, which the fused kernels exist for as well."""
    args = {"lr": 0.1, **({"momentum": 0.9} if optimizer_type == "SGD" else {})}
    config = demo_config(tmp_path, optimizer={"type": optimizer_type, "args": args})
    torch.manual_seed(0)
    model = CifarCNN(in_shape=[3, 16, 16], widths=[8, 16], convs_per_block=1)
    shard_model(model, amp_dtype=None, reshard_after_forward=True)
    assert all(isinstance(parameter, DTensor) for parameter in model.parameters())
    optimizer = build_optimizer(ConfigParser(config, source="x.json"), model, torch.device("cuda"))
    nn.functional.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.arange(4)).backward()
    optimizer.step()  # before: NotImplementedError, aten._fused_sgd_ has no sharding strategy
    assert bool(optimizer.defaults["fused"]) == (optimizer_type != "SGD")
    assert bool(optimizer.defaults["foreach"]) == (optimizer_type == "SGD")
    config["optimizer"]["args"]["fused"] = True
    if optimizer_type == "SGD":  # asked for in the config: refused in one line
        with pytest.raises(ConfigError, match=r"optimizer\.args\.fused: not with .*DTensor"):
            build_optimizer(ConfigParser(config, source="x.json"), model, torch.device("cuda"))


# --- 11. channels_last ----------------------------------------------------------------------------


@needs_gloo_fsdp
def test_channels_last_under_fsdp_trains_with_nhwc_convolutions(
    one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config.json, cifar10_cnn.json and imagenet.json set trainer.channels_last: fully_shard
    refuses a channels_last model (non-contiguous parameters) on every rank; the inputs alone
    in channels_last still make every convolution compute in NHWC."""
    formats = []
    real_forward = nn.Conv2d.forward

    def recording(self: nn.Conv2d, images: torch.Tensor) -> torch.Tensor:
        output = real_forward(self, images)
        formats.append(output.is_contiguous(memory_format=torch.channels_last))
        return output

    monkeypatch.setattr(nn.Conv2d, "forward", recording)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(demo_config(tmp_path, trainer={"channels_last": True})))
    result = run_main("train.py", "-c", str(config), "--run-id", "run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FSDP: 2 blocks and the root sharded over 1 process(es)" in result.stdout
    assert formats and all(formats)


# --- 10. an ordinary checkpoint under FSDP --------------------------------------------------------


@needs_gloo_fsdp
def test_an_ordinary_checkpoint_resumes_and_fine_tunes_under_fsdp(tmp_path: Path) -> None:
    """Its whole tensors go into FSDP's shards, the optimizer's by parameter name: the run then
    goes on as it does unsharded (before: "do not fit the configured model", though the shapes
    it named were equal)."""
    config = write_config(tmp_path, distributed={"strategy": "ddp"})
    train("-c", str(config), "--run-id", "plain")  # one process: an ordinary checkpoint
    runs = tmp_path / "saved" / RUN
    for name in ("unsharded", "sharded"):
        shutil.copytree(runs / "plain", runs / name)
    train("-r", str(runs / "unsharded"), "--epochs", "2")
    log = train("-r", str(runs / "sharded"), "--epochs", "2",
                "--set", "distributed.strategy=fsdp", env=one_rank_env())  # fmt: skip
    assert "FSDP: 2 blocks and the root sharded over 1 process(es)" in log
    assert "Resumed from" in log and "new optimizer" not in log
    continued = runs / "sharded" / "checkpoint-epoch2.pth"
    assert load_checkpoint(continued)["sharded"]
    expected = trained_weights(runs / "unsharded" / "checkpoint-epoch2.pth")
    for name, value in trained_weights(continued).items():
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6)

    # Fine-tuning (-r CKPT -c CONFIG) under FSDP takes its weights alone.
    fsdp_config = write_config(tmp_path, "fsdp.json")
    log = train("-r", str(runs / "plain" / "checkpoint-epoch1.pth"), "-c", str(fsdp_config),
                "--run-id", "tuned", env=one_rank_env())  # fmt: skip
    assert "Fine-tuning from" in log
    assert load_checkpoint(runs / "tuned" / "checkpoint-epoch1.pth")["epoch"] == 1


@needs_gloo_fsdp
@pytest.mark.slow
def test_a_ddp_checkpoint_continues_under_fsdp_on_two_ranks_as_ddp_does(tmp_path: Path) -> None:
    """Each rank takes its own shard of the whole tensors (Shard(0) of every parameter and of
    its Adam moments): epoch 2 under FSDP ends where DDP's own epoch 2 ended."""
    config = write_config(tmp_path, trainer={"epochs": 2}, distributed={"strategy": "ddp"})
    run_torchrun("train.py", "-c", str(config), "--run-id", "ddp")
    runs = tmp_path / "saved" / RUN
    shutil.copytree(runs / "ddp", runs / "fsdp")
    result = run_torchrun("train.py", "-r", str(runs / "fsdp" / "checkpoint-epoch1.pth"),
                          "--set", "distributed.strategy=fsdp")  # fmt: skip
    assert "FSDP: 2 blocks and the root sharded over 2 process(es)" in result.stdout
    continued = runs / "fsdp" / "checkpoint-epoch2.pth"
    assert load_checkpoint(continued)["sharded"]
    expected = trained_weights(runs / "ddp" / "checkpoint-epoch2.pth")
    for name, value in trained_weights(continued).items():
        torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=1e-5)


# --- 8. validation on ranks with unequal batches --------------------------------------------------


@needs_gloo_fsdp
@pytest.mark.slow
@pytest.mark.parametrize("num_val", [33, 1])
def test_fsdp_validates_ranks_with_unequal_batches_as_one_process_does(
    tmp_path: Path, num_val: int
) -> None:
    """33 validation samples in batches of 8 on 2 ranks: 3 batches on rank 0, 2 on rank 1; 1
    sample: 1 batch and none. Rank 0 waited for rank 1's forward pass until distributed.timeout
    (here 1 minute, 30 by default on gloo); now every sample is counted once, as test.py in
    one process counts them."""
    config = write_config(
        tmp_path,
        data_loader={"args": {"num_train": 64 + num_val, "validation_split": num_val,
                              "batch_size": 8, "num_workers": 0}},
        trainer={"len_epoch": 2},
        distributed={"strategy": "fsdp", "timeout": 1},
    )  # fmt: skip
    run_torchrun("train.py", "-c", str(config), "--run-id", "run")
    checkpoint = tmp_path / "saved" / RUN / "run" / "checkpoint-epoch1.pth"
    output = tmp_path / "test.json"
    result = run_main("test.py", "-r", str(checkpoint), "--split", "val", "--json", str(output))
    assert result.returncode == 0, result.stderr[-3000:]
    report, recorded = json.loads(output.read_text()), load_checkpoint(checkpoint)["metrics"]
    assert report["num_samples"] == num_val
    for key in ("val/accuracy", "val/top_k_acc"):
        assert report["metrics"][key] == recorded[key]
    assert report["metrics"]["val/loss"] == pytest.approx(recorded["val/loss"], rel=1e-6)
    # test.py under torchrun on 3 ranks (33: 2, 1 and 1 batches; 1: a batch and two ranks with
    # none), the model sharded: the same report, printed once (before: once per rank, each
    # rank evaluating every sample alone).
    sharded = tmp_path / "sharded.json"
    result = run_torchrun("test.py", "-r", str(checkpoint), "--split", "val", "--json",
                          str(sharded), processes=3)  # fmt: skip
    assert "FSDP: 2 blocks and the root sharded over 3 process(es)" in result.stdout
    assert result.stdout.count(f"val: {num_val} samples") == 1, result.stdout
    again = json.loads(sharded.read_text())
    assert again["num_samples"] == num_val and again["per_class"] == report["per_class"]
    for key in ("val/accuracy", "val/top_k_acc"):
        assert again["metrics"][key] == report["metrics"][key]
    assert again["metrics"]["val/loss"] == pytest.approx(report["metrics"]["val/loss"], rel=1e-6)


# --- 9. DCP's errors ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A DCP folder of a few tensors, written in one process as a checkpoint's are; and them."""
    folder = tmp_path_factory.mktemp("shards")
    generator = torch.Generator().manual_seed(0)
    tensors = {"model": {"weight": torch.randn(8, 3, generator=generator),
                         "bias": torch.randn(8, generator=generator)},
               "optimizer": {"weight": {"exp_avg": torch.randn(8, 3, generator=generator)}}}  # fmt: skip
    name, _ = write_shards(folder, tensors, global_step=1)
    return folder / name, tensors


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_any_truncated_file_of_a_shards_folder_is_refused_before_loading(
    shards: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory, num_examples: int
) -> None:
    """What check_shards passes loads: a copy cut short anywhere (a full disk, a transfer) is
    refused by the check that lets a resume fall back to the checkpoint before, not by DCP's
    load once the run has chosen it."""
    folder, tensors = shards
    files = sorted(path.name for path in folder.iterdir())
    assert ".metadata" in files and any(name.endswith(".distcp") for name in files)

    @settings(max_examples=num_examples)
    @given(name=st.sampled_from(files), share=st.floats(0, 1, exclude_max=True))
    def check(name: str, share: float) -> None:
        copy = tmp_path_factory.mktemp("cut") / folder.name
        shutil.copytree(folder, copy)
        size = (copy / name).stat().st_size
        with (copy / name).open("r+b") as file:
            file.truncate(int(share * size))
        with pytest.raises(ShardsError):
            check_shards({"sharded": copy.name}, copy.parent / "checkpoint-epoch1.pth")

    check()
    check_shards({"sharded": folder.name}, folder.parent / "checkpoint-epoch1.pth")
    loaded = {"model": {key: torch.zeros_like(value) for key, value in tensors["model"].items()}}
    load_shards(loaded, folder, partial=True)
    assert all(torch.equal(loaded["model"][key], tensors["model"][key]) for key in loaded["model"])


def test_a_truncated_shard_of_the_newest_checkpoint_falls_back_to_the_one_before(
    tmp_path: Path,
) -> None:
    """Before: DCP's CheckpointException (a BaseException) passed every `except Exception` and
    ended the resume in a traceback. The fallback retrains the lost epoch to the same weights."""
    config = write_config(tmp_path, trainer={"epochs": 2})  # one process: the sharded format
    train("-c", str(config), "--run-id", "run")
    run_dir = tmp_path / "saved" / RUN / "run"
    newest = run_dir / "checkpoint-epoch2.pth"
    expected = trained_weights(newest)
    folder = run_dir / load_checkpoint(newest)["sharded"]
    (shard,) = folder.glob("*.distcp")
    with shard.open("r+b") as file:
        file.truncate(shard.stat().st_size // 2)
    log = train("-r", str(run_dir))
    assert f"{shard.name} is truncated" in log and "resuming from the checkpoint before it" in log
    assert "checkpoint-epoch1.pth (epoch 1 done" in log
    for name, value in trained_weights(newest).items():
        assert torch.equal(value, expected[name]), name

    # Damaged inside, its size intact: the check passes it, DCP's load fails, in one line.
    (shard,) = (run_dir / load_checkpoint(newest)["sharded"]).glob("*.distcp")
    with shard.open("r+b") as file:
        file.seek(-64, 2)
        file.write(bytes(64))
    result = run_main("train.py", "-r", str(newest), "--epochs", "3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cannot load its shards: RuntimeError: PytorchStreamReader" in result.stderr


@pytest.mark.parametrize("background", [False, True])
def test_a_full_disk_inside_dcp_is_one_line_and_keeps_what_was_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, background: bool
) -> None:
    """Every shard write after epoch 1's checkpoint fails with ENOSPC (epoch 2's save; with
    trainer.async_checkpoint its background write, found when epoch 3's save begins). Before:
    DCP's CheckpointException ended the run in a traceback."""
    import torch.distributed.checkpoint.filesystem as dcp_files

    config = write_config(tmp_path, trainer={"epochs": 3, "async_checkpoint": background})
    run_dir = tmp_path / "saved" / RUN / "run"
    real_write_item = dcp_files._write_item

    def full_disk(*args: object, **kwargs: object) -> object:
        if (run_dir / "checkpoint-epoch1.pth").exists():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_item(*args, **kwargs)

    monkeypatch.setattr(dcp_files, "_write_item", full_disk)
    result = run_main("train.py", "-c", str(config), "--run-id", "run")
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == (
        f"error: {run_dir}: cannot save the shards (OSError: [Errno 28] No space left on "
        f"device); the checkpoints saved before are intact: make room, then resume with -r "
        f"{run_dir}"
    )
    assert "Traceback" not in result.stderr
    monkeypatch.undo()  # room made
    log = train("-r", str(run_dir))
    assert "checkpoint-epoch1.pth (epoch 1 done" in log
    assert "Removed 1 shards folder(s) no checkpoint names" in log
    assert load_checkpoint(run_dir / "checkpoint-epoch3.pth")["epoch"] == 3


# --- 14. the optimizer state of parameters new to a changed config --------------------------------


def resumed_optimizer_state(args: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """Each parameter's optimizer state, as whole tensors by parameter name, once train.py's
    `args` have resumed (built and resumed as train.py does, in this process)."""
    config = ConfigParser.from_args(train_script.parse_args(args))
    device = torch.device("cpu")
    with process_group(process_info(), "gloo", device):  # under one_rank_env: FSDP
        trainer = build_trainer(config, process_info(), device, logging.getLogger("test"))
        trainer.resume(find_resume_point(config))
        states = {
            name: {
                key: value.full_tensor() if isinstance(value, DTensor) else value
                for key, value in trainer.optimizer.state.get(parameter, {}).items()
            }
            for name, parameter in trainer.model.named_parameters()
        }
        del trainer  # its sharded model holds the group: gone before it
    return states


@needs_gloo_fsdp
@pytest.mark.parametrize("saved_by", ["ddp", "fsdp"])
def test_parameters_new_to_a_changed_config_start_afresh_under_fsdp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, saved_by: str
) -> None:
    """Suspected: under FSDP their Adam state starts at step 1 (the state-dict helper gives every
    parameter a state with a step on zero gradients). Refuted for a sharded checkpoint; true of
    an ordinary one's whole tensors taken into FSDP's shards, until they dropped that state.
    The state under FSDP is the state of the same resume in one process, parameter by
    parameter: the saved one by name, none for those the checkpoint has none of."""
    frozen = {"freeze": ["features.0"]}  # trained without the first block's parameters
    config = write_config(tmp_path, arch=frozen, distributed={"strategy": saved_by})
    train("-c", str(config), "--run-id", "run")
    run_dir = tmp_path / "saved" / RUN / "run"
    args = ["-r", str(run_dir), "--set", "arch.freeze=[]", "--epochs", "2",
            "--set", "distributed.strategy=fsdp"]  # fmt: skip
    reference = resumed_optimizer_state(args)  # one process: the model is not sharded
    for name, value in one_rank_env().items():
        monkeypatch.setenv(name, value)
    sharded = resumed_optimizer_state(args)
    new = [name for name in reference if name.startswith("features.0.")]
    assert new and all(reference[name] == {} == sharded[name] for name in new)
    assert reference.keys() == sharded.keys()
    for name, state in reference.items():
        assert state.keys() == sharded[name].keys(), name
        for key, value in state.items():
            assert torch.equal(sharded[name][key], value), (name, key)
    assert all(state["step"] == 8 for name, state in reference.items() if name not in new)


# --- 17. predict.py on a sharded checkpoint -------------------------------------------------------


@needs_gloo_fsdp
def test_predict_py_reads_a_sharded_checkpoint_as_torchs_own_converter_does(
    tmp_path: Path,
) -> None:
    """predict.py gathers the shards (no process group) into the model: its probabilities are
    those of the weights torch's dcp_to_torch_save reads from the checkpoint's DCP folder."""
    config = write_config(tmp_path)
    train("-c", str(config), "--run-id", "run", env=one_rank_env())
    checkpoint = tmp_path / "saved" / RUN / "run" / "checkpoint-epoch1.pth"
    state = load_checkpoint(checkpoint)
    assert state["model"] is None and state["sharded"]
    whole = tmp_path / "whole.pt"
    dcp_to_torch_save(checkpoint.parent / state["sharded"], whole)
    model = CifarCNN(**state["config"]["arch"]["args"])
    model.load_state_dict(torch.load(whole, weights_only=True)["model"])
    image = tmp_path / "image.png"
    pixels = torch.randint(0, 256, (32, 32, 3), generator=torch.Generator().manual_seed(0))
    Image.fromarray(pixels.to(torch.uint8).numpy()).save(image)
    out = tmp_path / "rows.json"
    result = run_main("predict.py", "-r", str(checkpoint), str(image), "--top-k", "10",
                      "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    transform = input_transform(ConfigParser(state["config"], source=str(checkpoint)))
    with torch.no_grad():
        probabilities = model.eval()(transform(load_image(str(image)))[None]).softmax(dim=1)[0]
    expected = dict(zip(state["class_names"], probabilities.tolist(), strict=True))
    predicted = dict(zip(row["labels"], row["probabilities"], strict=True))
    assert predicted == pytest.approx(expected, rel=1e-5, abs=1e-7)


# --- 18. two ranks' shards resumed in one process -------------------------------------------------


@needs_gloo_fsdp
@pytest.mark.slow  # a torchrun run
def test_two_ranks_shards_resume_in_one_process_as_torchs_converter_reads_them(
    tmp_path: Path,
) -> None:
    """2 -> 1: each parameter's weights and Adam state, resharded from two ranks into one
    unsharded process, are bit for bit what dcp_to_torch_save reads from the folder: the next
    step then is the one the uninterrupted state takes."""
    config = write_config(tmp_path)
    run_torchrun("train.py", "-c", str(config), "--run-id", "run")
    run_dir = tmp_path / "saved" / RUN / "run"
    checkpoint = run_dir / "checkpoint-epoch1.pth"
    whole = tmp_path / "whole.pt"
    dcp_to_torch_save(run_dir / load_checkpoint(checkpoint)["sharded"], whole)
    reference = torch.load(whole, weights_only=True)
    for name, value in trained_weights(checkpoint).items():
        assert torch.equal(value, reference["model"][name]), name
    resumed = resumed_optimizer_state(["-r", str(run_dir), "--epochs", "2"])
    assert resumed.keys() == reference["optimizer"].keys()
    for name, state in resumed.items():
        assert state.keys() == reference["optimizer"][name].keys(), name
        for key, value in state.items():
            assert torch.equal(value, reference["optimizer"][name][key]), (name, key)
