"""Models, abstract bases and the exact (sample-weighted) metric bookkeeping of the trainer."""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import model.model as model_module
import train
from base import BaseDataLoader, BaseModel, BaseTrainer
from model.loss import cross_entropy
from model.metric import accuracy, top_k_acc
from model.model import CifarCNN, TorchvisionModel
from parse_config import ConfigError, ConfigParser
from utils import ConfigValueError
from utils.evaluation.metric_sums import MetricSums, StepOutput

METRIC_FNS = {"accuracy": accuracy, "top_k_acc": top_k_acc}


# in_shape, widths, convs_per_block, the head's in_features worked out by hand
# (last width x (H // 2^blocks) x (W // 2^blocks)).
HEAD_CASES = [
    pytest.param((3, 32, 32), [8, 16], 1, 16 * 8 * 8, id="3x32x32-2blocks"),
    pytest.param((3, 32, 32), [8, 16, 32], 2, 32 * 4 * 4, id="3x32x32-3blocks-2convs"),
    pytest.param((3, 64, 48), [4, 8, 8, 16], 1, 16 * 4 * 3, id="3x64x48-4blocks"),
    # 28 -> 14 -> 7 -> 3: odd sizes round down.
    pytest.param((1, 28, 28), [4, 8, 16], 2, 16 * 3 * 3, id="1x28x28-3blocks-2convs"),
    pytest.param((1, 28, 28), [4, 4, 8, 8], 3, 8 * 1 * 1, id="1x28x28-4blocks-3convs"),
]


@pytest.mark.parametrize(("in_shape", "widths", "convs_per_block", "in_features"), HEAD_CASES)
def test_cifar_cnn_head_matches_the_feature_map(in_shape, widths, convs_per_block, in_features):
    model = CifarCNN(
        in_shape=in_shape, num_classes=7, widths=widths, convs_per_block=convs_per_block
    )
    assert model.head.in_features == in_features
    num_convs = sum(isinstance(layer, nn.Conv2d) for layer in model.features.modules())
    assert num_convs == len(widths) * convs_per_block
    # The forward pass is the real check: a wrong in_features fails in the Linear layer.
    output = model(torch.randn(3, *in_shape))
    assert output.shape == (3, 7)


@pytest.mark.parametrize(
    ("in_shape", "widths"),
    [
        ((3, 8, 8), [4, 4, 4, 4]),  # 8 / 16 = 0
        ((1, 28, 28), [4, 4, 4, 4, 4]),  # 28 / 32 = 0
        ((3, 64, 8), [4, 4, 4, 4]),  # only the width is too small
    ],
)
def test_cifar_cnn_rejects_an_input_too_small_for_its_blocks(in_shape, widths):
    with pytest.raises(ValueError, match="too small"):
        CifarCNN(in_shape=in_shape, widths=widths)


class _Linear(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 3)  # 15 parameters
        self.second = nn.Linear(3, 2)  # 8 parameters

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(inputs))


def test_base_model_is_abstract_without_forward():
    class NoForward(BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 2)

    with pytest.raises(TypeError, match="abstract"):
        NoForward()
    assert _Linear()(torch.zeros(1, 4)).shape == (1, 2)


def test_base_model_str_ends_with_trainable_parameter_count():
    model = _Linear()
    assert model.num_trainable_parameters() == 23
    assert str(model).endswith("Trainable parameters: 23")
    for parameter in model.first.parameters():
        parameter.requires_grad_(False)
    assert model.num_trainable_parameters() == 8
    assert str(model).endswith("Trainable parameters: 8")


def test_base_model_str_groups_thousands():
    model = CifarCNN(widths=[8, 16], convs_per_block=1)
    count = sum(parameter.numel() for parameter in model.parameters())
    assert count > 1000
    assert str(model).endswith(f"Trainable parameters: {count:,}")


def test_torchvision_model_by_name():
    model = TorchvisionModel("resnet18", num_classes=10).eval()
    with torch.no_grad():
        output = model(torch.randn(2, 3, 64, 64))
    assert output.shape == (2, 10)
    assert isinstance(model, BaseModel)


def test_torchvision_model_unknown_name():
    with pytest.raises(ValueError, match="no_such_net"):
        TorchvisionModel("no_such_net", num_classes=10)


def test_base_data_loader_and_trainer_are_abstract():
    with pytest.raises(TypeError, match="abstract"):
        BaseDataLoader(batch_size=8, seed=0)
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="abstract"):
        BaseTrainer(model, optimizer, config={}, device=torch.device("cpu"))


def test_metrics_count_hits_by_hand():
    output = torch.tensor(
        [
            [0.1, 0.5, 0.4, 0.0, -1.0],  # target 2 ranked 2nd
            [0.9, 0.0, 0.05, 0.05, -1.0],  # target 0 ranked 1st
            [0.2, 0.1, 0.3, 0.4, -1.0],  # target 0 ranked 3rd
            [0.4, 0.3, 0.2, 0.1, 0.0],  # target 3 ranked 4th
        ]
    )
    targets = torch.tensor([2, 0, 0, 3])
    assert accuracy(output, targets).item() == 1
    assert top_k_acc(output, targets, k=1).item() == 1
    assert top_k_acc(output, targets, k=2).item() == 2
    assert top_k_acc(output, targets).item() == 3  # k defaults to 3
    assert top_k_acc(output, targets, k=4).item() == 4
    assert top_k_acc(output, targets, k=10).item() == 4  # k above the class count means all


@pytest.fixture
def logits_and_targets() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(74, 10, generator=generator) * 2  # (N, C)
    targets = torch.randint(10, (74,), generator=generator)  # (N,)
    return logits, targets


def sums_over(batches, metric_fns) -> dict[str, float]:
    """The engine's bookkeeping over (output, target) batches: a StepOutput per batch."""
    sums = MetricSums(metric_fns, torch.device("cpu"))
    for output, target in batches:
        sums.add(StepOutput(loss=cross_entropy(output, target), output=output, target=target))
    return sums.result("val")


def test_metric_sums_give_whole_set_metrics_for_uneven_batches(logits_and_targets):
    logits, targets = logits_and_targets
    sizes = [7, 32, 32, 3]
    metrics = sums_over(zip(logits.split(sizes), targets.split(sizes), strict=True), METRIC_FNS)

    num_samples = len(targets)
    assert metrics["val/num_samples"] == num_samples
    # Counts divided by the count: exact, not approximately equal.
    assert metrics["val/accuracy"] == accuracy(logits, targets).item() / num_samples
    assert metrics["val/top_k_acc"] == top_k_acc(logits, targets).item() / num_samples
    full_loss = F.cross_entropy(logits, targets).item()
    assert metrics["val/loss"] == pytest.approx(full_loss, abs=1e-6)

    # The mean of per-batch means is what a naive loop reports; it is wrong here,
    # so the assertions above do tell the two apart.
    batch_accuracies = [
        accuracy(output, target).item() / len(target)
        for output, target in zip(logits.split(sizes), targets.split(sizes), strict=True)
    ]
    batch_losses = [
        F.cross_entropy(output, target).item()
        for output, target in zip(logits.split(sizes), targets.split(sizes), strict=True)
    ]
    assert abs(sum(batch_accuracies) / len(sizes) - metrics["val/accuracy"]) > 0.01
    assert abs(sum(batch_losses) / len(sizes) - metrics["val/loss"]) > 0.01


def test_metric_sums_over_a_loader_with_a_short_last_batch(logits_and_targets):
    logits, targets = logits_and_targets
    loader = DataLoader(TensorDataset(logits, targets), batch_size=32)  # 32, 32, 10
    metrics = sums_over(loader, METRIC_FNS)
    num_samples = len(targets)
    assert metrics["val/num_samples"] == num_samples
    assert metrics["val/accuracy"] == accuracy(logits, targets).item() / num_samples
    assert metrics["val/loss"] == pytest.approx(F.cross_entropy(logits, targets).item(), abs=1e-6)


def test_metric_sums_without_metrics_and_with_an_explicit_batch_size():
    sums = MetricSums({}, torch.device("cpu"))
    # A step whose target is not a tensor of samples says how many samples it had.
    sums.add(StepOutput(loss=torch.tensor(2.0), output=None, target=None, batch_size=4))
    sums.add(StepOutput(loss=torch.tensor(1.0), output=None, target=None, batch_size=12))
    assert sums.result("val") == {"val/loss": (2.0 * 4 + 1.0 * 12) / 16, "val/num_samples": 16}


# Every classifier of model/model.py, with the other arguments it needs (small, to build fast).
# Those of the task examples (GRUClassifier, TinyDetector, UNet) are checked in their own
# tests/test_task_*.py, which a lean copy leaves out with them.
CLASSIFIERS = [
    pytest.param("CifarCNN", {"widths": [4]}, id="CifarCNN"),
    pytest.param("FastCifarCNN", {"widths": [4, 4]}, id="FastCifarCNN"),
    pytest.param("TabularMLP", {"in_features": 3}, id="TabularMLP"),
    pytest.param("TorchvisionModel", {"name": "squeezenet1_1"}, id="TorchvisionModel"),
]


def assert_refuses_numbers_of_classes_that_are_no_count(arch: str, args: dict) -> None:
    """arch.args.num_classes 10.0, 10.5 or "10" is a one-line ConfigValueError naming the key
    (train.py reports it and exits 2), never a traceback from inside nn.Linear."""

    @settings(max_examples=10, deadline=None)
    @given(
        num_classes=st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),  # 10.0 from JSON too
            st.integers(-3, 0),
            st.sampled_from([True, "10", [10]]),
        )
    )
    def check(num_classes: object) -> None:
        with pytest.raises(ConfigValueError) as error:
            getattr(model_module, arch)(num_classes=num_classes, **args)
        assert "num_classes" in str(error.value) and "\n" not in str(error.value)

    check()


@pytest.mark.parametrize(("arch", "args"), CLASSIFIERS)
def test_every_classifier_refuses_a_number_of_classes_that_is_no_count(arch, args):
    assert_refuses_numbers_of_classes_that_are_no_count(arch, args)


def test_a_float_number_of_classes_in_the_config_is_refused_in_one_line(tmp_path):
    """The exact case: JSON's 10.0 for the CIFAR model stops train.py before anything is saved."""
    config = json.loads((ROOT / "configs" / "demo.json").read_text())
    config["arch"]["args"]["num_classes"] = 10.0
    config["trainer"]["save_dir"] = str(tmp_path / "saved")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(
        ConfigError, match=r"arch\.args: num_classes must be an integer >= 1, got 10\.0"
    ):
        ConfigParser.from_args(train.parse_args(["-c", str(path)])).init_obj("arch", model_module)


# Every model of model/model.py with an input it takes (the smallest the defaults allow); UNet's
# is checked in tests/test_task_segmentation.py.
MODELS_AND_INPUTS = [
    pytest.param("CifarCNN", {}, (3, 32, 32), id="CifarCNN"),
    pytest.param("CifarCNN", {"in_shape": [3, 8, 8]}, (3, 8, 8), id="CifarCNN-8px"),
    pytest.param("FastCifarCNN", {}, (3, 32, 32), id="FastCifarCNN"),
    pytest.param("DenoisingCNN", {}, (3, 16, 16), id="DenoisingCNN"),
    pytest.param("TabularMLP", {"in_features": 3, "num_classes": 2}, (3,), id="TabularMLP"),
]


def assert_a_batch_of_one_trains(arch: str, args: dict, shape: tuple[int, ...]) -> None:
    """A short last batch of one sample (the training split's size % batch_size == 1): the
    models' BatchNorm layers still see more than one value per channel, so the outputs and the
    gradients are finite (no nan, no torch error), and no layer changes the input in place."""

    @settings(max_examples=5, deadline=None)
    @given(seed=st.integers(0, 2**16))
    def check(seed: int) -> None:
        torch.manual_seed(seed)
        model = getattr(model_module, arch)(**args).train()
        images = torch.randn(1, *shape)
        original = images.clone()
        output = model(images)
        output.float().square().mean().backward()
        assert torch.equal(images, original)
        assert torch.isfinite(output).all()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)

    check()


@pytest.mark.parametrize(("arch", "args", "shape"), MODELS_AND_INPUTS)
def test_a_batch_of_one_trains_to_finite_outputs_and_leaves_its_input(arch, args, shape):
    assert_a_batch_of_one_trains(arch, args, shape)
