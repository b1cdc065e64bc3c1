"""Parameter groups stepped by another torch.optim algorithm (optimizer.param_groups[].optimizer),
Muon over convolution filters above all, each against its definition: torch.optim.Muon stepping
the filters as matrices (out, in * kh * kw), the rest stepped by optimizer.type as alone; one
state_dict that resumes exactly, with or without channels_last; one-line refusals."""

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT, assert_stopped_run_resumes_bit_exact, run_main
from hypothesis import given, settings
from hypothesis import strategies as st

from parse_config import ConfigParser
from utils.optim.combined import CombinedOptimizer
from utils.optim.optimizer import build_optimizer, parameter_groups
from utils.util import ConfigError

needs_muon = pytest.mark.skipif(
    not hasattr(torch.optim, "Muon"), reason=f"torch {torch.__version__} has no torch.optim.Muon"
)


class Net(torch.nn.Module):
    """conv - BatchNorm - conv - linear: filters, a norm layer, a matrix, biases."""

    def __init__(self, channels: int, width: int) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(channels, width, 3, padding=1),
            torch.nn.BatchNorm2d(width),
            torch.nn.Conv2d(width, width, 3, padding=1, bias=False),
        )
        self.head = torch.nn.Linear(width, 3)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).amax(dim=(2, 3)))


MUON = {"params": "features", "kind": "matrix", "optimizer": "Muon", "lr": 0.05}
MUON_OPTIONS = {"momentum": 0.6, "weight_decay": 0.01}


def config(**optimizer: object) -> ConfigParser:
    """configs/demo.json with this optimizer section (SGD, Nesterov momentum by default)."""
    section = {"type": "SGD", "args": {"lr": 0.1, "momentum": 0.9, "nesterov": True}}
    section.update(optimizer)
    demo = json.loads((ROOT / "configs/demo.json").read_text())
    return ConfigParser({**demo, "optimizer": section}, source="x.json")


def built(model: torch.nn.Module, groups: list[dict] | None = None) -> torch.optim.Optimizer:
    groups = groups if groups is not None else [{**MUON, **MUON_OPTIONS}]
    return build_optimizer(config(param_groups=groups), model, torch.device("cpu"))


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        images = torch.randn(4, 2, 6, 6, generator=generator)
        optimizer.zero_grad(set_to_none=True)
        model(images).square().mean().backward()
        optimizer.step()


@needs_muon
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), width=st.integers(2, 6), channels_last=st.booleans())
def test_filters_step_as_torch_muon_steps_their_matrices_and_the_rest_as_sgd(
    seed: int, width: int, channels_last: bool
) -> None:
    torch.manual_seed(seed)
    model = Net(2, width)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    reference = copy.deepcopy(model)
    optimizer = built(model)
    assert isinstance(optimizer, CombinedOptimizer)
    # The definition: torch's Muon over the filters as matrices (out, in * 3 * 3), SGD over the
    # rest, as two separate optimizers stepping one model.
    conv = [reference.features[0].weight, reference.features[2].weight]
    rest = [p for p in reference.parameters() if all(p is not c for c in conv)]
    matrices = [c.detach().reshape(len(c), -1).clone().requires_grad_() for c in conv]
    muon = torch.optim.Muon(matrices, lr=0.05, **MUON_OPTIONS)
    sgd = torch.optim.SGD(rest, lr=0.1, momentum=0.9, nesterov=True)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(3):
        images = torch.randn(4, 2, 6, 6, generator=generator)
        for net, step in ((model, optimizer.step), (reference, None)):
            net.zero_grad(set_to_none=True)
            net(images).square().mean().backward()
            if step is not None:
                step()
        for matrix, filters in zip(matrices, conv, strict=True):
            matrix.grad = filters.grad.reshape(matrix.shape)
        muon.step()
        sgd.step()
        with torch.no_grad():
            for matrix, filters in zip(matrices, conv, strict=True):
                filters.copy_(matrix.view(filters.shape))
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs), name


@needs_muon
def test_the_state_dict_resumes_exactly_with_or_without_channels_last() -> None:
    torch.manual_seed(0)
    model = Net(2, 4)
    optimizer = built(model)
    train(model, optimizer, 2, seed=1)
    saved_model, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    # Muon's momentum is a matrix per filter tensor, in the filters' logical order.
    first_filters = saved["param_groups"][1]["params"][0]  # features.0.weight (4, 2, 3, 3)
    assert saved["state"][first_filters]["momentum_buffer"].shape == (4, 2 * 9)
    train(model, optimizer, 3, seed=2)  # uninterrupted
    for layout in (torch.contiguous_format, torch.channels_last):
        resumed = Net(2, 4).to(memory_format=layout)
        resumed.load_state_dict(saved_model)
        again = built(resumed)
        again.load_state_dict(copy.deepcopy(saved))  # torch's load keeps the tensors given
        train(resumed, again, 3, seed=2)
        # channels_last convolutions round differently; momentum read in another order than
        # it was saved in would be off by far more.
        exact = layout == torch.contiguous_format
        for (name, mine), theirs in zip(
            resumed.named_parameters(), model.parameters(), strict=True
        ):
            torch.testing.assert_close(
                mine, theirs, rtol=0 if exact else 1e-4, atol=0 if exact else 1e-5, msg=name
            )


@needs_muon
def test_a_schedulers_learning_rate_reaches_every_algorithm() -> None:
    model = Net(2, 4)
    optimizer = built(model)
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.0)  # every group's rate: 0
    before = [p.detach().clone() for p in model.parameters()]
    train(model, optimizer, 2, seed=0)
    # lr 0 everywhere: only Muon's and SGD's weight decay could move them, and it is lr-scaled.
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_matrix_kind_takes_weights_of_two_or_more_dimensions_outside_norm_layers() -> None:
    model = Net(2, 4)
    _, matrices = parameter_groups(model, [{"kind": "matrix"}], "x.json")
    expected = [model.features[0].weight, model.features[2].weight, model.head.weight]
    assert [id(p) for p in matrices["params"]] == [id(p) for p in expected]


@needs_muon
def test_muon_over_a_vector_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match=r"param_groups\[0\].optimizer: Muon takes matrices"):
        built(Net(2, 4), [{"params": "features", "optimizer": "Muon"}])


def test_an_optimizer_torch_does_not_have_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    shipped = json.loads((ROOT / "configs/demo.json").read_text())
    shipped["optimizer"]["param_groups"] = [{"kind": "matrix", "optimizer": "Muonn"}]
    shipped["trainer"]["save_dir"] = str(tmp_path / "saved")
    path.write_text(json.dumps(shipped))
    result = run_main("train.py", "-c", str(path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert (
        "param_groups[0].optimizer: torch" in result.stderr and "torch.optim.Muonn" in result.stderr
    )
    assert not (tmp_path / "saved").exists()


@needs_muon
@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_config_jsons_recipe_with_muon_resumes_mid_epoch_bit_exact(
    tmp_path: Path, cifar_dir: Path, stop_at: None
) -> None:
    recipe = json.loads((ROOT / "config.json").read_text())
    recipe["arch"]["args"].update(widths=[8, 16, 16], whiten_samples=40)
    recipe["data_loader"]["args"].update(
        data_dir=str(cifar_dir), download=False, batch_size=16, validation_split=20
    )
    assert any(group.get("optimizer") == "Muon" for group in recipe["optimizer"]["param_groups"])
    recipe["trainer"].update(
        epochs=2, save_dir=str(tmp_path / "saved"), tensorboard=False, type="StopAt",
        deterministic=True, amp=None,
    )  # fmt: skip
    path = tmp_path / "fast.json"
    path.write_text(json.dumps(recipe))
    runs = tmp_path / "saved" / "models" / recipe["name"]
    assert_stopped_run_resumes_bit_exact(path, runs, stop_at_step=7)
