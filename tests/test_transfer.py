"""Transfer learning offline: pretrained torchvision weights from a local file or a (faked)
download, a new classification head, frozen layers and per-group learning rates; the teacher a
distillation loads from a checkpoint."""

import contextlib
import copy
import json
import logging
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchvision
from conftest import NO_SAMPLE, NUM_EXAMPLES, ROOT, SAMPLE_DIR, run_main, set_flags, shrink
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import model.model as arch_module
import train
from build import build_trainer, freeze, load_inference_model
from data_loader.synthetic import SyntheticShapes
from model.model import TorchvisionModel
from model.torchvision_model import AUX_HEADS, check_classifier, without_pretrained
from parse_config import ConfigParser
from trainer.distillation import load_teacher
from utils import ConfigValueError, UserError
from utils.data.sampler import EpochSampler
from utils.distributed.process_group import ProcessInfo
from utils.optim.optimizer import build_optimizer

FROZEN = ["network.conv1", "network.bn1", "network.layer1", "network.layer2"]


@pytest.fixture(scope="module")
def resnet18_file(tmp_path_factory) -> Path:
    """A torchvision resnet18 state dict (1000 classes) saved to a file: the "pretrained
    weights" a user pre-downloads for an offline cluster."""
    path = tmp_path_factory.mktemp("weights") / "resnet18.pth"
    torch.manual_seed(1)
    network = torchvision.models.resnet18()
    with torch.no_grad():  # BatchNorm statistics unlike a fresh layer's, to see them kept
        for module in network.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)
    torch.save(network.state_dict(), path)
    return path


def test_weights_file_loads_the_backbone_and_a_new_head_takes_the_classes(resnet18_file):
    pretrained = torch.load(resnet18_file, weights_only=True)
    model = TorchvisionModel("resnet18", num_classes=10, weights=str(resnet18_file))
    state = model.network.state_dict()
    for key, value in pretrained.items():
        if not key.startswith("fc."):
            assert torch.equal(state[key], value), key
    assert model.network.fc.out_features == 10 and model.network.fc.in_features == 512
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_weights_file_with_another_number_of_classes(resnet18_file, tmp_path):
    """A file fine-tuned on 10 classes loads (its head too, when the classes agree)."""
    ten = TorchvisionModel("resnet18", num_classes=10, weights=str(resnet18_file))
    path = tmp_path / "ten.pth"
    torch.save(ten.network.state_dict(), path)
    same = TorchvisionModel("resnet18", num_classes=10, weights=str(path))
    assert torch.equal(same.network.fc.weight, ten.network.fc.weight)
    five = TorchvisionModel("resnet18", num_classes=5, weights=str(path))
    assert five.network.fc.out_features == 5
    # One of this template's checkpoints of a TorchvisionModel serves as weights too.
    checkpoint = tmp_path / "checkpoint-epoch3.pth"
    torch.save({"epoch": 3, "config": {}, "model": ten.state_dict()}, checkpoint)
    from_checkpoint = TorchvisionModel("resnet18", num_classes=5, weights=str(checkpoint))
    assert torch.equal(
        from_checkpoint.network.layer3[0].conv1.weight, ten.network.layer3[0].conv1.weight
    )


@settings(max_examples=8, deadline=None)
@given(st.booleans(), st.integers(0, 2**16))
def test_a_checkpoint_as_weights_gives_the_weights_its_run_judged(
    tmp_path_factory, ema_judged, seed
):
    """arch.args.weights=CKPT starts from what test.py evaluates of CKPT: its averaged weights
    when its monitor watched val/ema_, else its trained ones; the head is new either way."""
    torch.manual_seed(seed)
    trained = TorchvisionModel("resnet18", num_classes=10)
    averaged = TorchvisionModel("resnet18", num_classes=10)
    monitor = "max val/ema_accuracy" if ema_judged else "max val/accuracy"
    ema = {**{f"module.{k}": v for k, v in averaged.state_dict().items()}, "n_averaged": 3}
    path = tmp_path_factory.mktemp("weights") / "model_best.pth"
    state = {"epoch": 3, "config": {"trainer": {"monitor": monitor}}, "model": trained.state_dict()}
    torch.save({**state, "ema": ema, "weights": "ema" if ema_judged else "model"}, path)
    started = TorchvisionModel("resnet18", num_classes=5, weights=str(path)).state_dict()
    judged = (averaged if ema_judged else trained).state_dict()
    for key, value in judged.items():
        if not key.startswith("network.fc."):
            assert torch.equal(started[key], value), key
    assert started["network.fc.weight"].shape == (5, 512)


def test_named_weights_are_downloaded_by_torchvision(resnet18_file, monkeypatch):
    pretrained = torch.load(resnet18_file, weights_only=True)
    urls = []

    def fake_download(url, *args, **kwargs):
        urls.append(url)
        return pretrained

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", fake_download)
    model = TorchvisionModel("resnet18", num_classes=7, weights="IMAGENET1K_V1")
    assert urls == [torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url]
    assert torch.equal(model.network.layer4[1].conv2.weight, pretrained["layer4.1.conv2.weight"])
    assert model.network.fc.out_features == 7


def test_a_failed_download_says_what_to_do(monkeypatch):
    def offline(url, *args, **kwargs):
        raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline)
    with pytest.raises(
        UserError, match=r"could not download .* set arch\.args\.weights to its path"
    ):
        TorchvisionModel("resnet18", num_classes=7, weights="DEFAULT")


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (
            "IMAGENET22K",
            "unknown weights 'IMAGENET22K' for resnet18 (available: DEFAULT, IMAGENET1K_V1",
        ),
        ("missing/resnet18.pth", "weights file missing/resnet18.pth not found"),
    ],
)
def test_bad_weights_are_config_errors(weights, message):
    with pytest.raises(ConfigValueError, match=re.escape(message)):
        TorchvisionModel("resnet18", num_classes=10, weights=weights)


@settings(max_examples=20, deadline=None)
@given(
    st.one_of(
        st.fixed_dictionaries(
            {
                "num_classes": st.one_of(
                    st.integers(-5, 0), st.sampled_from(["10", 10.0, True, None])
                )
            }
        ),
        st.fixed_dictionaries({"weights": st.sampled_from([5, ["a.pth"], {"file": "a.pth"}])}),
        st.fixed_dictionaries({"builder_args": st.sampled_from([[1], "dropout=0.2", 3])}),
    ),
    st.booleans(),
)
def test_arguments_of_the_wrong_type_are_config_errors(resnet18_file, bad, with_weights):
    """Whatever JSON value a key holds, a wrong one is a one-line ConfigValueError naming it,
    with or without pretrained weights, never a traceback from inside torchvision."""
    args = {"num_classes": 10, "weights": str(resnet18_file) if with_weights else None, **bad}
    with pytest.raises(ConfigValueError) as error:
        TorchvisionModel("resnet18", **args)
    assert next(iter(bad)) in str(error.value) and "\n" not in str(error.value)


def test_a_negative_number_of_classes_is_a_config_error():
    with pytest.raises(ConfigValueError, match=r"num_classes must be a whole number >= 1, got -3"):
        TorchvisionModel("resnet18", num_classes=-3)


@pytest.fixture(scope="module")
def vits() -> dict[int, TorchvisionModel]:
    """Tiny-input ViTs (builder_args image_size), by that size, in evaluation mode."""
    return {
        size: TorchvisionModel("vit_b_32", num_classes=3, builder_args={"image_size": size}).eval()
        for size in (32, 64)
    }


@settings(max_examples=20, deadline=None)
@given(size=st.sampled_from([32, 64]), height=st.integers(16, 96), width=st.integers(16, 96))
def test_a_vit_refuses_images_of_another_size_with_a_value_error(vits, size, height, width):
    """A ViT's position embeddings fix its input size. torchvision asserted it (an
    AssertionError: the first-batch check took it for a bug in the user's code, a traceback);
    now a ValueError naming the key, which that check reports in one line."""
    images = torch.zeros(1, 3, height, width)
    with torch.no_grad():
        if (height, width) == (size, size):
            assert vits[size](images).shape == (1, 3)
        else:
            with pytest.raises(ValueError, match=rf"takes {size}x{size} images, got {height}x"):
                vits[size](images)


def test_a_vit_for_224_pixels_on_32_pixel_data_stops_train_py_in_one_line(tmp_path, capsys):
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["arch"] = {"type": "TorchvisionModel", "args": {"name": "vit_b_32", "num_classes": 10}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    capsys.readouterr()
    assert train.main(["-c", str(path)]) != 0
    error = capsys.readouterr().err
    assert "VisionTransformer takes 224x224 images, got 32x32" in error
    assert error.count("\n") == 1 and "Traceback" not in error


def test_a_builder_value_it_refuses_is_a_one_line_config_error():
    """torchvision's builders refuse some values with a ValueError (a MaxViT whose partitions
    do not divide its input_size; several lines): a one-line ConfigValueError naming the key."""
    with pytest.raises(ConfigValueError, match=r"^builder_args: maxvit_t: Input size") as error:
        TorchvisionModel("maxvit_t", num_classes=3, builder_args={"input_size": (64, 64)})
    assert "\n" not in str(error.value)


def test_weights_of_another_network_are_refused_in_one_line(resnet18_file):
    with pytest.raises(UserError, match="its weights do not fit torchvision's ResNet"):
        TorchvisionModel("resnet34", num_classes=10, weights=str(resnet18_file))


# --- freezing and parameter groups ----------------------------------------------------------


def finetune_parser(tmp_path: Path, weights: Path, **sections) -> ConfigParser:
    config = json.loads((ROOT / "configs/finetune.json").read_text())
    config["arch"]["args"]["weights"] = str(weights)
    config["trainer"]["save_dir"] = str(tmp_path / "saved")
    for key, value in sections.items():
        config[key] = {**config[key], **value}
    return ConfigParser(config, source="finetune.json")


def test_freeze_and_param_groups_take_effect(resnet18_file, tmp_path):
    parser = finetune_parser(tmp_path, resnet18_file)
    model = TorchvisionModel(**parser["arch"]["args"])
    freeze(parser, model)
    optimizer = build_optimizer(parser, model, torch.device("cpu"))
    frozen = {name for name, param in model.named_parameters() if not param.requires_grad}
    assert frozen == {
        name for name, _ in model.named_parameters() if name.startswith(tuple(FROZEN))
    }
    # The rest at optimizer.args' rate, the head at its group's.
    base, head = optimizer.param_groups
    assert base["lr"] == 0.001 and head["lr"] == 0.01
    assert {id(param) for param in head["params"]} == {
        id(model.network.fc.weight),
        id(model.network.fc.bias),
    }
    assert len(base["params"]) + len(head["params"]) == len(
        [param for param in model.parameters() if param.requires_grad]
    )
    # Frozen modules stay in evaluation mode while the rest trains.
    model.train()
    assert not model.network.layer1.training and not model.network.bn1.training
    assert model.network.layer3.training and model.network.fc.training


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        (
            {"arch": {"freeze": ["network.layer9"]}},
            "finetune.json: arch.freeze: 'network.layer9' matches no parameter of "
            "TorchvisionModel (names start with: network.bn1, network.conv1, network.fc,",
        ),
        (
            {"arch": {"freeze": ["network.layer"]}},  # whole name parts only
            "arch.freeze: 'network.layer' matches no parameter",
        ),
        (
            {"optimizer": {"param_groups": [{"params": "network.head", "lr": 0.1}]}},
            "finetune.json: optimizer.param_groups[0].params: 'network.head' matches no trainable "
            "parameter",
        ),
        (
            {"optimizer": {"param_groups": [{"params": "network.layer1", "lr": 0.1}]}},
            "'network.layer1' matches no trainable parameter (frozen ones are left out",
        ),
        (
            {
                "optimizer": {
                    "param_groups": [
                        {"params": "network.fc", "lr": 0.1},
                        {"params": ["network.fc.bias"], "lr": 0.2},
                    ]
                }
            },
            "optimizer.param_groups[1].params: network.fc.bias is already in "
            "optimizer.param_groups[0]",
        ),
    ],
)
def test_unknown_or_overlapping_prefixes_are_named(resnet18_file, tmp_path, sections, expected):
    parser = finetune_parser(tmp_path, resnet18_file, **sections)
    model = TorchvisionModel(**parser["arch"]["args"])
    with pytest.raises(UserError) as error:
        freeze(parser, model)
        build_optimizer(parser, model, torch.device("cpu"))
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_an_unknown_freeze_prefix_stops_train_py_in_one_line(resnet18_file, tmp_path, capsys):
    config = json.loads((ROOT / "configs/finetune.json").read_text())
    config["arch"]["args"]["weights"] = str(resnet18_file)
    config["arch"]["freeze"] = ["network.layer9"]
    config["data_loader"]["args"]["data_dir"] = str(tmp_path / "nowhere")
    config["trainer"]["save_dir"] = str(tmp_path / "saved")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    # The data folder does not exist either; the data is built first and says so.
    assert train.main(["-c", str(path), "--set", "n_gpu=0"]) == 2
    assert "nowhere/train: folder not found" in capsys.readouterr().err
    config["data_loader"] = {"type": "SyntheticDataLoader", "args": {"batch_size": 8}}
    path.write_text(json.dumps(config))
    assert train.main(["-c", str(path), "--set", "n_gpu=0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: arch.freeze: 'network.layer9' matches no parameter")
    assert not (tmp_path / "saved").exists()


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
@pytest.mark.skipif(not SAMPLE_DIR.is_dir(), reason=NO_SAMPLE)
def test_finetune_config_on_real_images(resnet18_file, tmp_path):
    overrides = {
        "n_gpu": 0,
        "arch.args.weights": str(resnet18_file),
        "data_loader.args.data_dir": str(SAMPLE_DIR),
        "data_loader.args.image_size": 32,  # CPU-sized; the config's 224 is for a GPU
        "data_loader.args.batch_size": 32,
        "data_loader.args.num_workers": 0,
        "trainer.epochs": 1,
        "trainer.save_dir": str(tmp_path / "saved"),
        "trainer.tensorboard": False,
    }
    sets = set_flags(overrides)
    # In-process (run_main): what is checked is the checkpoint, not the process.
    result = run_main("train.py", "-c", "configs/finetune.json", "--run-id", "ft", *sets)
    assert result.returncode == 0, result.stderr[-3000:]
    state = torch.load(
        tmp_path / "saved" / "models" / "Finetune_ResNet18" / "ft" / "checkpoint-epoch1.pth",
        weights_only=True,
    )
    pretrained = torch.load(resnet18_file, weights_only=True)
    for key, value in pretrained.items():
        trained = state["model"][f"network.{key}"]
        if f"network.{key}".startswith(tuple(FROZEN)):  # weights and BatchNorm statistics
            assert torch.equal(trained, value), key
        elif key == "layer4.1.conv2.weight":
            assert not torch.equal(trained, value)  # the rest did train
    assert state["model"]["network.fc.weight"].shape == (10, 512)
    # Chance is 0.10; on 500 validation images, 0.15 is four standard deviations above it.
    assert state["metrics"]["val/accuracy"] > 0.15, state["metrics"]


# --- the teacher of a distillation -----------------------------------------------------------


def save_teacher(
    path: Path,
    config: dict,
    weights: dict,
    *,
    averaged: dict | None = None,
    monitor: str = "max val/accuracy",
    class_names: list[str] | None = None,
) -> Path:
    """A checkpoint as train.py writes it (the keys load_teacher reads): `weights` trained,
    `averaged` (trainer.ema_decay) as AveragedModel's state dict, judged by `monitor`."""
    ema_decay = None if averaged is None else 0.9
    config = {
        **config,
        "trainer": {**config["trainer"], "monitor": monitor, "ema_decay": ema_decay},
    }
    state = {"model": weights, "config": config, "epoch": 1, "class_names": class_names or []}
    if averaged is not None:
        state["ema"] = {**{f"module.{k}": v for k, v in averaged.items()}, "n_averaged": 3}
    state["weights"] = "ema" if monitor.startswith("max val/ema_") else "model"
    torch.save(state, path)
    return path


def demo_network(config: dict, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return ConfigParser(copy.deepcopy(config), source="t").init_obj("arch", arch_module).eval()


@settings(max_examples=20, deadline=None)
@given(st.booleans(), st.integers(0, 2**16))
def test_the_teacher_is_the_network_test_py_evaluates(tmp_path_factory, ema_judged, seed):
    """Whichever weights the teacher's run judged (its monitor on val/ema_: the averaged ones),
    the teacher computes what test.py evaluates of that checkpoint."""
    tmp_path = tmp_path_factory.mktemp("teacher")
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    trained, averaged = demo_network(config, seed), demo_network(config, seed + 1)
    monitor = "max val/ema_accuracy" if ema_judged else "max val/accuracy"
    path = save_teacher(
        tmp_path / "teacher.pth",
        config,
        trained.state_dict(),
        averaged=averaged.state_dict(),
        monitor=monitor,
    )
    teacher, evaluated = load_teacher(path)[0], load_inference_model(path)[0]
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(teacher(images), evaluated(images))
        assert torch.equal(teacher(images), (averaged if ema_judged else trained)(images))
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())


def test_a_teacher_judged_on_its_average_is_the_average(tmp_path):
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    trained, averaged = demo_network(config, 0), demo_network(config, 1)
    path = save_teacher(
        tmp_path / "teacher.pth",
        config,
        trained.state_dict(),
        averaged=averaged.state_dict(),
        monitor="max val/ema_accuracy",
    )
    teacher, images = load_teacher(path)[0], torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(teacher(images), averaged(images))


def test_a_fine_tuned_teacher_downloads_nothing(tmp_path, monkeypatch):
    """A TorchvisionModel teacher trained from named pretrained weights: its checkpoint holds
    every weight, so an offline machine loads it (nothing downloaded, nothing read)."""

    def offline(url, *args, **kwargs):
        raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline)
    args = {"name": "resnet18", "num_classes": 10, "weights": "IMAGENET1K_V1"}
    config = json.loads((ROOT / "configs/finetune.json").read_text())
    torch.manual_seed(0)
    trained = TorchvisionModel("resnet18", num_classes=10).eval()
    config["arch"]["args"] = args
    path = save_teacher(tmp_path / "teacher.pth", config, trained.state_dict())
    teacher, images = load_teacher(path)[0], torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(teacher(images), trained(images))


def distill_config(tmp_path: Path, teacher: Path) -> Path:
    config = shrink(json.loads((ROOT / "configs/distill.json").read_text()), tmp_path / "saved")
    config["trainer"]["args"]["teacher"] = str(teacher)
    config["trainer"]["tensorboard"] = False
    path = tmp_path / "distill.json"
    path.write_text(json.dumps(config))
    return path


def teacher_of(tmp_path: Path, num_classes: int, class_names: list[str] | None = None) -> Path:
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["arch"]["args"]["num_classes"] = num_classes
    weights = demo_network(config, 0).state_dict()
    path = tmp_path / f"teacher{num_classes}.pth"
    return save_teacher(path, config, weights, class_names=class_names)


@settings(max_examples=10, deadline=None)
@given(st.integers(2, 14), st.integers(10, 14))  # the student scores the data's 10 classes at least
def test_a_teacher_of_other_classes_is_refused_in_one_line(tmp_path_factory, teacher, student):
    if teacher == student:
        return
    tmp_path = tmp_path_factory.mktemp("distill")
    config = distill_config(tmp_path, teacher_of(tmp_path, teacher))
    result = run_main("train.py", "-c", str(config), "--set", f"arch.args.num_classes={student}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: {config}: trainer.args: teacher: ")
    assert f"scores {teacher} classes, the student (arch.args.num_classes) {student};" in (
        result.stderr
    )
    assert result.stderr.count("\n") == 1 and not (tmp_path / "saved" / "models").exists()


def test_a_five_class_teacher_for_ten_classes_is_refused(tmp_path):
    config = distill_config(tmp_path, teacher_of(tmp_path, 5))
    result = run_main("train.py", "-c", str(config))
    assert result.returncode == 2
    assert "scores 5 classes, the student (arch.args.num_classes) 10;" in result.stderr


def teacher_for_images(tmp_path: Path, side: int) -> Path:
    """A demo teacher built for side x side images (the demo data's are 32 x 32)."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["arch"]["args"]["in_shape"] = [3, side, side]
    path = tmp_path / f"teacher-{side}px.pth"
    return save_teacher(path, config, demo_network(config, 0).state_dict())


# Sides whose head does not fit 32 x 32 images: the shrunk CNN's 2 blocks quarter the side.
OTHER_SIDES = st.integers(8, 64).filter(lambda side: side // 4 != 32 // 4)


@settings(max_examples=6, deadline=None)
@given(OTHER_SIDES)
def test_a_teacher_for_other_inputs_is_refused_in_one_line_naming_it(tmp_path_factory, side):
    """Its forward fails on the data's images: refused before anything is written, naming
    trainer.args.teacher, not as a batch that does not fit the student (or mid-epoch)."""
    tmp_path = tmp_path_factory.mktemp("distill")
    teacher = teacher_for_images(tmp_path, side)
    config = distill_config(tmp_path, teacher)
    result = run_main("train.py", "-c", str(config))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(
        f"error: {config}: trainer.args: teacher: {teacher} does not take the inputs "
        "(1, 3, 32, 32) float32: RuntimeError: "
    ), result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "saved" / "models").exists()


def test_a_teacher_for_16_pixel_images_is_refused(tmp_path):
    config = distill_config(tmp_path, teacher_for_images(tmp_path, 16))
    result = run_main("train.py", "-c", str(config))
    assert result.returncode == 2
    assert "teacher-16px.pth does not take the inputs (1, 3, 32, 32) float32" in result.stderr


def rows(scores: torch.Tensor) -> torch.Tensor:
    """Dense scores (B, K, H, W) as one row of K per pixel: (B * H * W, K)."""
    return scores.movedim(1, -1).reshape(-1, scores.shape[1])


def test_a_dense_distillation_loss_is_that_of_its_pixels(tmp_path):
    """For a dense output (a segmenter's (B, K, H, W)), the loss is the one of its pixels taken
    as a batch of rows: the soft loss averages over pixels as the criterion does, whatever the
    image size, so alpha weighs the two terms as it says."""
    config = ConfigParser(
        json.loads(distill_config(tmp_path, teacher_of(tmp_path, 10)).read_text()), source="t"
    )
    trainer = build_trainer(config, ProcessInfo(), torch.device("cpu"), logging.getLogger("t"))
    torch.manual_seed(0)
    trainer.model, trainer.teacher = nn.Conv2d(3, 10, 1), nn.Conv2d(3, 10, 1).requires_grad_(False)

    @settings(max_examples=20, deadline=None)
    @given(
        st.integers(1, 4), st.integers(1, 9), st.integers(1, 9),
        st.floats(0.5, 8.0), st.floats(0.0, 1.0), st.integers(0, 2**16),
    )  # fmt: skip
    def check(batch: int, height: int, width: int, temperature: float, alpha: float, seed: int):
        trainer.temperature, trainer.alpha = temperature, alpha
        generator = torch.Generator().manual_seed(seed)
        images = torch.randn(batch, 3, height, width, generator=generator)
        labels = torch.randint(0, 10, (batch, height, width), generator=generator)
        loss = trainer.training_step((images, labels)).loss
        student, teacher = rows(trainer.model(images)), rows(trainer.teacher(images))
        soft = F.kl_div(
            F.log_softmax(student / temperature, 1), F.softmax(teacher / temperature, 1),
            reduction="batchmean",
        ) * temperature**2  # fmt: skip
        expected = alpha * soft + (1 - alpha) * F.cross_entropy(student, labels.reshape(-1))
        torch.testing.assert_close(loss, expected)

    check()


def test_test_py_evaluates_a_student_without_its_teacher(tmp_path):
    """test.py runs the student alone: a teacher moved or deleted since training is not needed,
    and the report is the student's own validation."""
    teacher = teacher_of(tmp_path, 10)
    config = distill_config(tmp_path, teacher)
    result = run_main("train.py", "-c", str(config), "--run-id", "student", "--epochs", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    teacher.unlink()
    best = tmp_path / "saved" / "models" / "Distill_CifarCNN" / "student" / "model_best.pth"
    report = tmp_path / "val.json"
    result = run_main("test.py", "-r", str(best), "--split", "val", "--json", str(report))
    assert result.returncode == 0, result.stderr[-2000:]
    recorded = torch.load(best, weights_only=True)["metrics"]
    assert json.loads(report.read_text())["metrics"]["val/accuracy"] == recorded["val/accuracy"]


BAD_ARGUMENTS = st.one_of(
    st.fixed_dictionaries(
        # (NaN and Infinity are refused as the config is read: tests/test_config.py)
        {"temperature": st.sampled_from(["4", None, [4.0], True, 0, -1.0])}
    ),
    st.fixed_dictionaries({"alpha": st.sampled_from(["0.5", None, False, -0.1, 1.5])}),
    st.fixed_dictionaries({"teacher": st.sampled_from([5, None, ["a.pth"], {"path": "a.pth"}])}),
)


@settings(max_examples=15, deadline=None)
@given(BAD_ARGUMENTS)
def test_bad_distillation_arguments_stop_train_py_in_one_line(tmp_path_factory, bad):
    tmp_path = tmp_path_factory.mktemp("distill")
    config = distill_config(tmp_path, teacher_of(tmp_path, 10))
    args = {**json.loads(config.read_text())["trainer"]["args"], **bad}
    result = run_main("train.py", "-c", str(config), *set_flags({"trainer.args": args}))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: {config}: trainer.args: "), result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "saved" / "models").exists()


def test_a_temperature_given_as_a_string_is_a_config_error(tmp_path):
    config = distill_config(tmp_path, teacher_of(tmp_path, 10))
    result = run_main("train.py", "-c", str(config), "--set", 'trainer.args.temperature="4"')
    assert result.returncode == 2
    assert "trainer.args: temperature must be a number > 0" in result.stderr


@settings(max_examples=10, deadline=None)
@given(st.permutations(SyntheticShapes.classes), st.integers(0, 9), st.booleans())
def test_a_teacher_of_other_class_names_or_order_is_refused(
    tmp_path_factory, names, index, renamed
):
    """The teacher scores class i as the i-th of its checkpoint's class names: another order, or
    another name, would distil wrong targets silently. Refused, naming the first that differs;
    the data's own names, in its order, are taken."""
    names = list(names)
    if renamed:
        names[index] = "zebra"
    tmp_path = tmp_path_factory.mktemp("distill")
    config = distill_config(tmp_path, teacher_of(tmp_path, 10, names))
    result = run_main("train.py", "-c", str(config), "--epochs", "1")
    if names == list(SyntheticShapes.classes):
        assert result.returncode == 0, result.stderr[-2000:]
        return
    first = next(i for i, name in enumerate(names) if name != SyntheticShapes.classes[i])
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"trainer.args: teacher: {tmp_path}" in result.stderr
    assert f"class {first} is {names[first]!r} there, {SyntheticShapes.classes[first]!r} here;" in (
        result.stderr
    )
    assert result.stderr.count("\n") == 1 and not (tmp_path / "saved" / "models").exists()


def test_a_teacher_of_two_swapped_classes_is_refused(tmp_path):
    names = list(SyntheticShapes.classes)
    names[0], names[1] = names[1], names[0]
    result = run_main(
        "train.py", "-c", str(distill_config(tmp_path, teacher_of(tmp_path, 10, names)))
    )
    assert result.returncode == 2
    assert f"class 0 is {names[0]!r} there, {names[1]!r} here;" in result.stderr


@pytest.mark.parametrize("kind", ["folder", "damaged"])
def test_a_teacher_that_is_no_checkpoint_file_is_named_for_what_it_is(tmp_path, kind):
    """A run folder, or a damaged file, given as the teacher: one line saying what it is (and for
    a folder which file to pass), not that nothing is there."""
    teacher = teacher_of(tmp_path, 10)
    if kind == "folder":
        expected = f"{tmp_path}: a folder, not a checkpoint file; pass a checkpoint in it"
        teacher = tmp_path
    else:
        teacher.write_bytes(teacher.read_bytes()[:100])
        expected = f"{teacher}: not a readable checkpoint"
    result = run_main("train.py", "-c", str(distill_config(tmp_path, teacher)))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: {tmp_path / 'distill.json'}: trainer.args: teacher: ")
    assert expected in result.stderr and result.stderr.count("\n") == 1


# --- networks with auxiliary classifiers --------------------------------------------------


@pytest.mark.parametrize("name", ["googlenet", "inception_v3"])
@settings(max_examples=3, deadline=None)
@given(num_classes=st.integers(2, 12), batch_size=st.integers(2, 3))
def test_aux_networks_train_on_one_output(name, num_classes, batch_size):
    """GoogLeNet and Inception v3 return a namedtuple with their auxiliary logits in training,
    which the loss and metrics cannot take (a traceback mid-epoch): built without those heads,
    the training forward is (B, num_classes) logits, and every parameter gets a gradient
    (none is left unused, which DDP would refuse)."""
    model = TorchvisionModel(name, num_classes=num_classes).train()
    output = model(torch.randn(batch_size, 3, 75, 75))  # the smallest Inception v3 takes
    assert isinstance(output, torch.Tensor) and output.shape == (batch_size, num_classes)
    F.cross_entropy(output, torch.zeros(batch_size, dtype=torch.long)).backward()
    assert all(parameter.grad is not None for parameter in model.parameters())


@pytest.mark.parametrize(("name", "aux"), [("googlenet", "aux1"), ("inception_v3", "AuxLogits")])
def test_pretrained_weights_of_an_aux_network_load_without_its_aux_heads(
    name, aux, tmp_path, monkeypatch
):
    """torchvision's weights file holds the auxiliary heads too (its builder loads them, then
    drops them): downloaded by name or given as a file, the rest loads and the training output
    is one tensor."""
    builder = getattr(torchvision.models, name)
    pretrained = builder(aux_logits=True, init_weights=False).state_dict()
    assert any(key.startswith(f"{aux}.") for key in pretrained)
    path = tmp_path / f"{name}.pth"
    torch.save(pretrained, path)
    monkeypatch.setattr(
        torchvision.models._api, "load_state_dict_from_url", lambda *args, **kwargs: pretrained
    )
    for weights, builder_args in ((str(path), {"transform_input": True}), ("IMAGENET1K_V1", None)):
        model = TorchvisionModel(
            name, num_classes=5, weights=weights, builder_args=builder_args
        ).train()
        state = model.network.state_dict()
        assert not any(key.startswith(f"{aux}.") for key in state)
        for key, value in state.items():
            if not key.startswith("fc."):
                assert torch.equal(value, pretrained[key]), key
        assert model(torch.randn(2, 3, 75, 75)).shape == (2, 5)


def test_aux_logits_are_refused_in_one_line():
    with pytest.raises(ConfigValueError, match=r"aux_logits: inception_v3's auxiliary outputs"):
        TorchvisionModel("inception_v3", num_classes=5, builder_args={"aux_logits": True})


def torchvision_aux_file(name: str, tmp_path: Path) -> tuple[Path, dict]:
    """(file, state dict) of torchvision's `name` as its ImageNet weights are saved: with the
    auxiliary heads, for a network built with transform_input (which no state dict records)."""
    builder = getattr(torchvision.models, name)
    torch.manual_seed(0)
    pretrained = builder(weights=None, transform_input=True, aux_logits=True, init_weights=False)
    path = tmp_path / f"{name}.pth"
    torch.save(pretrained.state_dict(), path)
    return path, pretrained.state_dict()


@pytest.mark.parametrize("name", sorted(AUX_HEADS))
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**16), batch_size=st.integers(1, 3))
def test_torchvisions_weights_from_a_file_give_the_logits_of_the_named_weights(
    tmp_path_factory, name, seed, batch_size
):
    """The offline route (torchvision's ImageNet state dict saved to a file) computes what the
    weights= route does: transform_input as builder_args says. Before, the file's network was
    built without it, its inputs not rescaled as the weights expect: other logits, silently."""
    path, pretrained = torchvision_aux_file(name, tmp_path_factory.mktemp(name))
    with pytest.MonkeyPatch.context() as patch:  # hypothesis: no function-scoped fixture
        patch.setattr(
            torchvision.models._api, "load_state_dict_from_url", lambda *args, **kw: pretrained
        )
        named = TorchvisionModel(name, weights="IMAGENET1K_V1").eval()
    from_file = TorchvisionModel(
        name, weights=str(path), builder_args={"transform_input": True}
    ).eval()
    images = torch.randn(batch_size, 3, 75, 75, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert torch.equal(from_file(images), named(images))


@pytest.mark.parametrize("name", sorted(AUX_HEADS))
def test_an_aux_network_from_a_file_must_say_transform_input(name, tmp_path):
    """No state dict says whether the network rescaled its input: left out, a one-line error
    names the key rather than a guess that is wrong for one of the two kinds of file."""
    path, _ = torchvision_aux_file(name, tmp_path)
    for builder_args in (None, {"dropout": 0.2}, {"transform_input": "yes"}):
        with pytest.raises(ConfigValueError, match=r"^builder_args: transform_input: true or"):
            TorchvisionModel(name, weights=str(path), builder_args=builder_args)
    for transform_input in (False, True):
        model = TorchvisionModel(
            name, weights=str(path), builder_args={"transform_input": transform_input}
        )
        assert model.network.transform_input is transform_input


def test_a_googlenet_from_a_file_is_tested_and_exported_as_it_was_trained(tmp_path):
    """Trained from torchvision's weights in a file with transform_input, the network test.py,
    predict.py, export.py and a resume rebuild from the checkpoint (load_inference_model, the
    pretrained file unread) computes exactly what the trained one does."""
    path, _ = torchvision_aux_file("googlenet", tmp_path)
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    arch_args = {"name": "googlenet", "num_classes": 10, "weights": str(path)}
    config["arch"] = {
        "type": "TorchvisionModel",
        "args": {**arch_args, "builder_args": {"transform_input": True}},
    }
    config["data_loader"]["args"].update(num_train=40, num_test=8, batch_size=16)
    config["trainer"].update(epochs=1, tensorboard=False, len_epoch=1)
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    assert train.main(["-c", str(config_path), "--run-id", "run"]) == 0
    checkpoint = tmp_path / "saved" / "models" / config["name"] / "run" / "checkpoint-epoch1.pth"
    trained = TorchvisionModel(**config["arch"]["args"]).eval()  # as train.py built it
    path.unlink()  # what the checkpoint's network is built from must not read it
    rebuilt, _, state = load_inference_model(checkpoint)
    trained.load_state_dict(state["model"])
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(rebuilt(images), trained(images))
    assert rebuilt.network.transform_input is True


# --- the classification head of every family ------------------------------------------------

# One architecture of each torchvision classification family (heads differ: resnet's fc,
# vit's heads.head, efficientnet's and convnext's classifier[-1], mobilenet's, densenet's
# classifier, squeezenet's 1x1 convolution, ...), the name of its head.
HEADS = {
    "resnet18": "fc",
    "vit_b_16": "heads.head",
    "efficientnet_b0": "classifier.1",
    "convnext_tiny": "classifier.2",
    "mobilenet_v2": "classifier.1",
    "mobilenet_v3_small": "classifier.3",
    "densenet121": "classifier",
    "squeezenet1_1": "classifier.1",
    "shufflenet_v2_x0_5": "fc",
    "mnasnet0_5": "classifier.1",
    "regnet_y_400mf": "fc",
    "swin_t": "head",
    "maxvit_t": "classifier.5",
    "googlenet": "fc",
    "inception_v3": "fc",
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_pretrained_weights_keep_all_but_a_resized_head(name, tmp_path):
    """With pretrained weights and num_classes != 1000, the head alone is new, with num_classes
    outputs; every other tensor (BatchNorm statistics included) is the file's. With 1000, the
    file's own head is kept too."""
    torch.manual_seed(0)
    pretrained = TorchvisionModel(name).network.state_dict()  # stands in for ImageNet weights
    path = tmp_path / f"{name}.pth"
    torch.save(pretrained, path)
    num_classes = 2 + sorted(HEADS).index(name)  # a different count per family
    # GoogLeNet's and Inception's file says nothing of transform_input: the config does.
    builder_args = {"transform_input": False} if name in AUX_HEADS else None
    model = TorchvisionModel(
        name, num_classes=num_classes, weights=str(path), builder_args=builder_args
    ).eval()
    state = model.network.state_dict()
    head = f"{HEADS[name]}."
    assert state.keys() == pretrained.keys()
    for key, value in state.items():
        if key.startswith(head):
            assert value.shape[0] == num_classes and value.shape[1:] == pretrained[key].shape[1:]
        else:
            assert torch.equal(value, pretrained[key]), key
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, num_classes)
    same = TorchvisionModel(
        name, num_classes=1000, weights=str(path), builder_args=builder_args
    ).network.state_dict()
    assert all(torch.equal(value, pretrained[key]) for key, value in same.items())


# --- a checkpoint's model does not read its pretrained weights again ---------------------------


@pytest.mark.parametrize(
    ("name", "weights"),
    [
        ("resnet18", "IMAGENET1K_V1"),
        ("squeezenet1_1", "DEFAULT"),
        ("googlenet", "IMAGENET1K_V1"),  # transform_input: set from the weights, in no state
        ("inception_v3", "IMAGENET1K_V1"),
        ("vit_b_16", "IMAGENET1K_SWAG_LINEAR_V1"),  # 224 px
        ("vit_b_16", "IMAGENET1K_SWAG_E2E_V1"),  # 384 px: its position embedding's size
    ],
)
def test_the_network_rebuilt_without_pretrained_weights_computes_the_same(
    name, weights, monkeypatch
):
    """A resume, test.py and predict.py build the run's network without its pretrained weights
    (without_pretrained), then load the checkpoint's: that network must be the one trained,
    the same outputs for the same weights, and nothing is downloaded."""
    torch.manual_seed(0)
    builder = getattr(torchvision.models, name)
    kwargs = {"aux_logits": True, "init_weights": False} if name in AUX_HEADS else {}
    size = max(torchvision.models.get_model_weights(name).verify(weights).meta["min_size"][0], 75)
    pretrained = builder(image_size=size) if name.startswith("vit_") else builder(**kwargs)
    monkeypatch.setattr(
        torchvision.models._api,
        "load_state_dict_from_url",
        lambda *args, **kwargs: pretrained.state_dict(),
    )
    arch = {
        "type": "TorchvisionModel",
        "args": {"name": name, "num_classes": 7, "weights": weights},
    }
    trained = TorchvisionModel(**arch["args"]).eval()

    def offline(*args, **kwargs):
        raise AssertionError("the pretrained weights were read")

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline)
    rebuilt = TorchvisionModel(**{**arch["args"], **without_pretrained(arch)}).eval()
    rebuilt.load_state_dict(trained.state_dict())  # strict: the same tensors, the same shapes
    images = torch.randn(1, 3, size, size)
    with torch.no_grad():
        assert torch.equal(rebuilt(images), trained(images))


def test_a_resume_and_test_py_need_no_pretrained_weights_file(resnet18_file, tmp_path):
    """The checkpoint holds every weight: with the pretrained file gone (an offline machine
    whose cache was cleared), a resume and test.py still run, and read nothing of it."""
    weights = tmp_path / "resnet18.pth"
    weights.write_bytes(resnet18_file.read_bytes())
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["arch"] = {
        "type": "TorchvisionModel",
        "args": {"name": "resnet18", "num_classes": 10, "weights": str(weights)},
    }
    config["data_loader"]["args"].update(num_train=64, num_test=32)
    config["trainer"].update(epochs=1, tensorboard=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_main("train.py", "-c", str(path), "--run-id", "run")
    assert result.returncode == 0, result.stderr[-3000:]
    weights.unlink()
    run_dir = tmp_path / "saved" / "models" / config["name"] / "run"
    result = run_main("train.py", "-r", str(run_dir), "--epochs", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / "checkpoint-epoch2.pth").is_file()
    result = run_main("test.py", "-r", str(run_dir / "checkpoint-epoch2.pth"))
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_weights_name_this_torchvision_lacks_still_rebuilds_its_checkpoint():
    """A run's config may name weights of a newer torchvision: predict.py, export.py and test.py
    rebuild the network with the default arguments (the checkpoint's shapes then tell), rather
    than refusing the weights they would not read anyway."""
    arch = {"type": "TorchvisionModel", "args": {"name": "resnet18", "weights": "IMAGENET1K_V9"}}
    assert without_pretrained(arch) == {"weights": None}


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_a_one_sample_batch_is_refused_exactly_when_batch_norm_cannot_train_on_it(num_examples):
    """Over split sizes, batch sizes, numbers of processes (a rank's padded share), drop_last,
    trainer.len_epoch (an epoch shorter than a pass never reaches its last batch: it was refused
    all the same), BatchNorms over (N, C) and over (N, C, H, W) of 1 or more values per channel,
    trained or frozen (evaluation mode): the check around the first batch's forward (in
    evaluation mode, as check_first_batch runs it) refuses exactly the runs whose epoch of
    training fails with torch's "Expected more than 1 value per channel"."""
    from types import SimpleNamespace

    from base.checks import one_sample_batch_check
    from utils.data.batches import epoch_batches

    @settings(max_examples=num_examples, deadline=None)
    @given(
        num_samples=st.integers(2, 40),
        batch_size=st.integers(2, 8),
        side=st.sampled_from([None, 1, 2]),  # None: BatchNorm1d over (N, C)
        frozen=st.booleans(),
        num_processes=st.integers(1, 3),
        drop_last=st.booleans(),
        len_epoch=st.one_of(st.none(), st.integers(1, 30)),
        data=st.data(),
    )
    def check(num_samples: int, batch_size: int, side: int | None, frozen: bool,
              num_processes: int, drop_last: bool, len_epoch: int | None,
              data: st.DataObject) -> None:  # fmt: skip
        shape = (3,) if side is None else (3, side, side)
        norm = nn.BatchNorm1d(3) if side is None else nn.BatchNorm2d(3)
        model = nn.Sequential(nn.Identity(), norm)
        norm.train(not frozen)
        dataset = torch.utils.data.TensorDataset(torch.randn(num_samples, *shape))
        # Under torchrun a rank's share, padded as the training sampler pads it (equal shares).
        rank = data.draw(st.integers(0, num_processes - 1), label="rank")
        sampler = EpochSampler(range(num_samples), shuffle=False, seed=0, rank=rank,
                               num_replicas=num_processes, pad=num_processes > 1)  # fmt: skip
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last
        )
        if len(loader) == 0:
            return  # check_loaders refuses it first
        len_epoch = len_epoch or len(loader)  # as BaseTrainer sets it
        try:  # an epoch as the trainer runs it: passes restart until len_epoch batches
            for (inputs,) in epoch_batches(loader, 1, 0, len_epoch, lambda: None):
                model(inputs)
            fails = False
        except ValueError as error:
            assert "Expected more than 1 value per channel" in str(error)
            fails = True
        trainer = SimpleNamespace(
            train_loader=loader,
            model=model,
            config=SimpleNamespace(source="t.json"),
            len_epoch=len_epoch,
        )
        checked = one_sample_batch_check(trainer)
        refused = pytest.raises(UserError, match=r"^t\.json: data_loader\.args\.batch_size: ")
        with refused if fails else contextlib.nullcontext(), checked:
            model.eval()
            model(next(iter(loader))[0])

    check()


def test_resnet18_with_a_last_batch_of_one_sample_stops_train_py_at_the_start(tmp_path, capsys):
    """resnet18 at 32 px, 4 x 2 + 1 training samples in batches of 4: its last blocks see one
    value per channel in the last batch. Was torch's ValueError with a traceback at the end of
    the first pass; now one line naming batch_size and the split, before anything is written."""
    config = json.loads((ROOT / "configs/finetune.json").read_text())
    config["arch"]["args"]["weights"] = None
    config["data_loader"] = {
        "type": "SyntheticDataLoader",
        "args": {"batch_size": 4, "num_train": 13, "num_test": 4, "validation_split": 4},
    }
    config["trainer"].update(save_dir=str(tmp_path / "saved"), epochs=1, tensorboard=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert train.main(["-c", str(path), "--set", "n_gpu=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(f"error: {path}: data_loader.args.batch_size: 4 leaves") and "\n" not in err
    )
    assert "(9 training samples per process)" in err
    assert not (tmp_path / "saved").exists()
    # Epochs of 2 batches of the pass's 3 never reach the one-sample batch: trained, not refused.
    assert train.main(["-c", str(path), "--set", "n_gpu=0", "--set", "trainer.len_epoch=2"]) == 0


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(torchvision.models.list_models()))
def test_a_torchvision_model_of_another_task_is_refused_in_one_line(name):
    """Every model torchvision lists is either an image classifier, which TorchvisionModel
    builds, or refused by name: a detector, a segmenter or a video network was built and then
    failed on the first batch (a list of dicts, or a dict, where logits were expected) or
    trained a clip network on images."""
    classifiers = torchvision.models.list_models(module=torchvision.models)
    if name in classifiers:
        check_classifier(name)
    else:
        with pytest.raises(ConfigValueError, match=rf"^'{name}' is torchvision's [a-z ]+ model \("):
            check_classifier(name)


def test_train_py_refuses_a_detector_as_a_torchvision_model(tmp_path, capsys):
    config = json.loads((ROOT / "configs/finetune.json").read_text())
    config["arch"] = {"type": "TorchvisionModel", "args": {"name": "fasterrcnn_resnet50_fpn"}}
    config["data_loader"] = {
        "type": "SyntheticDataLoader",
        "args": {"batch_size": 4, "num_train": 8, "num_test": 4, "validation_split": 4},
    }
    config["trainer"].update(save_dir=str(tmp_path / "saved"), epochs=1, tensorboard=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert train.main(["-c", str(path), "--set", "n_gpu=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'fasterrcnn_resnet50_fpn' is torchvision's detection model" in err, err
    assert "\n" not in err
    assert not (tmp_path / "saved").exists()
