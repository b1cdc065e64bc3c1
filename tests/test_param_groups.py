"""Parameter groups (utils/optim/optimizer.py) over random module trees: every trainable
parameter in exactly one group, each with the learning rate and weight decay the config says,
whatever the layers call their parameters, whatever is frozen or tied."""

import functools
import json
import re

import pytest
import torch
from conftest import NUM_EXAMPLES, ROOT, shrink
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from base.base_model import BaseModel
from parse_config import ConfigError, ConfigParser
from utils import ConfigValueError
from utils.optim.optimizer import (
    NORM_LAYERS,
    build_optimizer,
    parameter_groups,
    split_norm_and_bias,
)

# Layers with parameters torch names in different ways: "bias", "in_proj_bias", "bias_k",
# "bias_ih_l0"; normalisation layers' weights and biases.
LAYERS = {
    "linear": lambda: nn.Linear(4, 4),
    "conv": lambda: nn.Conv2d(4, 4, 3),
    "batchnorm": lambda: nn.BatchNorm2d(4),
    "layernorm": lambda: nn.LayerNorm(4),
    "attention": lambda: nn.MultiheadAttention(4, 2, add_bias_kv=True),
    "lstm": lambda: nn.LSTM(4, 4),
    "gru": lambda: nn.GRU(4, 4, num_layers=2),
    "embedding": lambda: nn.Embedding(5, 4),
}
# A tree: a layer's name, or a list of subtrees (an nn.Sequential of them).
TREES = st.recursive(
    st.sampled_from(sorted(LAYERS)), lambda children: st.lists(children, min_size=1, max_size=3)
)


def build(tree: str | list) -> nn.Module:
    if isinstance(tree, str):
        return LAYERS[tree]()
    return nn.Sequential(*(build(child) for child in tree))


def is_norm_or_bias(model: nn.Module) -> set[int]:
    """What the docs exempt: every parameter of a normalisation layer, and every bias, by what
    torch's layers call them (the reference, written apart from the code under test)."""
    return {
        id(param)
        for module in model.modules()
        for name, param in module.named_parameters(recurse=False)
        if isinstance(module, NORM_LAYERS) or "bias" in name
    }


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_norm_and_bias_decay_holds_every_bias_of_any_module_tree(num_examples):
    """norm_bias_weight_decay: each trainable parameter in exactly one group; the weight decay
    of normalisation layers and of every bias, the group's for the rest."""

    @settings(max_examples=num_examples, deadline=None)
    @given(TREES, st.data())
    def check(tree: str | list, data: st.DataObject) -> None:
        model = build(tree)
        params = list(model.parameters())
        for param in params:  # some frozen (not all: the optimizer needs one)
            param.requires_grad_(data.draw(st.booleans(), label="trainable"))
        params[0].requires_grad_(True)
        groups = split_norm_and_bias(model, parameter_groups(model, [], "t.json"), 0.0)
        optimizer = torch.optim.SGD(groups, lr=0.1, weight_decay=0.5)
        placed = [id(param) for group in optimizer.param_groups for param in group["params"]]
        trainable = [id(param) for param in params if param.requires_grad]
        assert sorted(placed) == sorted(trainable)  # each exactly once, no frozen one
        exempt = is_norm_or_bias(model)
        for group in optimizer.param_groups:
            for param in group["params"]:
                assert group["weight_decay"] == (0.0 if id(param) in exempt else 0.5)

    check()


def test_attention_and_lstm_biases_take_the_norm_and_bias_decay():
    """MultiheadAttention's in_proj_bias, bias_k, bias_v and an LSTM's bias_ih_l0, bias_hh_l0
    are biases: not decayed, not matrices."""
    model = nn.Sequential(nn.MultiheadAttention(4, 2, add_bias_kv=True), nn.LSTM(4, 4))
    groups = split_norm_and_bias(model, parameter_groups(model, [], "t.json"), 0.0)
    decayed, exempt = ({name for name, param in model.named_parameters() if any(
        param is mine for mine in group["params"])} for group in groups)  # fmt: skip
    assert exempt == {
        "0.in_proj_bias", "0.bias_k", "0.bias_v", "0.out_proj.bias",
        "1.bias_ih_l0", "1.bias_hh_l0",
    }  # fmt: skip
    assert decayed == {"0.in_proj_weight", "0.out_proj.weight", "1.weight_ih_l0", "1.weight_hh_l0"}
    matrices = parameter_groups(model, [{"kind": "matrix", "lr": 1.0}], "t.json")[1]["params"]
    assert all(any(param is mine for mine in matrices) is (name in decayed)
               for name, param in model.named_parameters())  # fmt: skip


class TiedHead(nn.Module):
    """An embedding and an output layer that share one weight, as language models tie them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(5, 4), nn.Linear(4, 5)
        self.head.weight = self.embed.weight


def matched_by(model: nn.Module, prefix: str) -> set[int]:
    """The trainable parameters any of whose names is `prefix` or lies under it (reference)."""
    return {
        id(param)
        for name, param in model.named_parameters(remove_duplicate=False)
        if param.requires_grad and (name == prefix or name.startswith(prefix + "."))
    }


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_prefix_groups_hold_each_trainable_parameter_once(num_examples):
    """optimizer.param_groups by prefix, over module trees with tied weights and frozen
    parameters: either every trainable parameter lies in exactly one group, each group holding
    what its prefixes name (by any name of a tied weight) with its own lr, or a ConfigError
    names the prefix that matches nothing or the parameter two groups claim."""
    layers = {"linear": LAYERS["linear"], "layernorm": LAYERS["layernorm"], "tied": TiedHead}

    @settings(max_examples=num_examples, deadline=None)
    @given(st.lists(st.sampled_from(sorted(layers)), min_size=1, max_size=3), st.data())
    def check(names: list[str], data: st.DataObject) -> None:
        model = nn.Sequential(*(layers[name]() for name in names))
        for param in model.parameters():
            param.requires_grad_(data.draw(st.integers(0, 3), label="trainable") > 0)
        every_name = [name for name, _ in model.named_parameters(remove_duplicate=False)]
        entries = []
        for index in range(data.draw(st.integers(1, 3), label="num_groups")):
            parts = data.draw(st.sampled_from(every_name), label="name").split(".")
            depths = data.draw(st.lists(st.integers(1, len(parts)), min_size=1, max_size=2,
                                        unique=True), label="prefix depths")  # fmt: skip
            prefixes = [".".join(parts[:depth]) for depth in depths]  # may overlap
            entries.append({"params": prefixes, "lr": float(index + 1)})
        wanted = [set().union(*(matched_by(model, p) for p in e["params"])) for e in entries]
        empty = any(not matched_by(model, p) for e in entries for p in e["params"])
        claimed = [key for group in wanted for key in group]
        if empty or len(claimed) != len(set(claimed)):
            with pytest.raises(ConfigError, match=r"^t\.json: optimizer\.param_groups\[\d\]"):
                parameter_groups(model, entries, "t.json")
            return
        groups = parameter_groups(model, entries, "t.json")
        trainable = {id(param) for param in model.parameters() if param.requires_grad}
        placed = [id(param) for group in groups for param in group["params"]]
        assert sorted(placed) == sorted(trainable)  # each exactly once
        rest = trainable - set(claimed)
        assert [set(map(id, group["params"])) for group in groups] == [rest] * bool(rest) + wanted
        assert [group["lr"] for group in groups[bool(rest) :]] == [e["lr"] for e in entries]

    check()


def test_a_tied_weight_is_in_the_group_of_either_name_and_prefixes_may_overlap():
    """A prefix under the second name of a tied weight takes it; two prefixes of one group that
    both cover a parameter put it in that group once."""
    model = nn.Sequential(TiedHead())
    head, overlapping = {"params": "0.head", "lr": 0.5}, {"params": ["0", "0.embed"], "lr": 0.5}
    expected = {id(model[0].embed.weight), id(model[0].head.bias)}
    for entry in (head, overlapping):
        (group,) = parameter_groups(model, [entry], "t.json")  # no parameter left for a rest
        assert sorted(map(id, group["params"])) == sorted(expected)


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_build_optimizer_gives_each_parameter_the_rate_and_decay_the_config_says(
    num_examples, tmp_path
):
    """build_optimizer over random module trees: optimizer.type for the rest, a group stepped by
    another algorithm (Muon for the matrices where torch has it, else Adam), norm_bias_weight_decay
    and reference_batch_size: each trainable parameter in exactly one group, at lr x global
    batch / reference_batch_size, with the weight decay its group, its algorithm's default or
    norm_bias_weight_decay gives it."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path)  # batch 32
    other = "Muon" if hasattr(torch.optim, "Muon") else "Adam"

    @settings(max_examples=num_examples, deadline=None)
    @given(
        tree=st.lists(st.sampled_from(["linear", "conv", "layernorm", "attention"]), min_size=1,
                      max_size=4),
        norm_bias=st.sampled_from([None, 0.0, 0.25]),
        group_decay=st.sampled_from([None, 0.125]),
        reference=st.sampled_from([None, 16, 32]),
    )  # fmt: skip
    def check(tree: list[str], norm_bias: float | None, group_decay: float | None,
              reference: int | None) -> None:  # fmt: skip
        model = nn.Sequential(*(LAYERS[name]() for name in ["linear", *tree]))  # a matrix
        entry = {"kind": "matrix", "optimizer": other, "lr": 0.02}
        if group_decay is not None:
            entry["weight_decay"] = group_decay
        config["optimizer"] = {
            "type": "SGD", "args": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.5},
            "param_groups": [entry], "norm_bias_weight_decay": norm_bias,
            "reference_batch_size": reference,
        }  # fmt: skip
        optimizer = build_optimizer(
            ConfigParser(config, source="t.json"), model, torch.device("cpu")
        )
        scale = 32 / reference if reference else 1.0
        exempt, matrices = is_norm_or_bias(model), set()
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                if param.dim() >= 2 and not isinstance(module, NORM_LAYERS) and "bias" not in name:
                    matrices.add(id(param))
        default = getattr(torch.optim, other)([torch.zeros(2, 2)]).defaults["weight_decay"]
        placed = []
        for group in optimizer.param_groups:
            for param in group["params"]:
                placed.append(id(param))
                ours = id(param) in matrices
                assert group["lr"] == pytest.approx((0.02 if ours else 0.1) * scale)
                if norm_bias is not None and id(param) in exempt:
                    decay = norm_bias
                elif ours:
                    decay = default if group_decay is None else group_decay
                else:
                    decay = 0.5
                assert group["weight_decay"] == decay
        assert sorted(placed) == sorted(id(param) for param in model.parameters())

    check()


class Tree(BaseModel):
    """A BaseModel around a module tree, to call arch.freeze on."""

    def __init__(self, layers: nn.Module) -> None:
        super().__init__()
        self.layers = layers

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # never called: only the parameters matter here


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_freeze_stops_exactly_what_any_name_of_a_parameter_lies_under(num_examples):
    """arch.freeze over module trees with tied weights: a prefix of any name of a parameter (the
    second name of a tied weight too) freezes it, the one tensor under every name, and nothing
    else."""
    layers = {"linear": LAYERS["linear"], "layernorm": LAYERS["layernorm"], "tied": TiedHead}

    @settings(max_examples=num_examples, deadline=None)
    @given(st.lists(st.sampled_from(sorted(layers)), min_size=1, max_size=3), st.data())
    def check(names: list[str], data: st.DataObject) -> None:
        model = Tree(nn.Sequential(*(layers[name]() for name in names)))
        every_name = [name for name, _ in model.named_parameters(remove_duplicate=False)]
        prefixes = []
        for _ in range(data.draw(st.integers(1, 2), label="num_prefixes")):
            parts = data.draw(st.sampled_from(every_name), label="name").split(".")
            prefixes.append(".".join(parts[: data.draw(st.integers(1, len(parts)))]))
        frozen = set().union(*(matched_by(model, prefix) for prefix in set(prefixes)))
        model.freeze(sorted(set(prefixes)))
        for name, param in model.named_parameters(remove_duplicate=False):
            assert param.requires_grad is (id(param) not in frozen), name

    check()


def test_freezing_the_second_name_of_a_tied_weight_freezes_the_tensor():
    """The decoder tied to an embedding, frozen by the decoder's name: was "matches no
    parameter", as named_parameters() lists a tied weight under its first name only."""
    model = Tree(TiedHead())
    model.freeze(["layers.head.weight"])
    assert not model.layers.embed.weight.requires_grad  # one tensor: frozen under both names
    assert model.layers.head.bias.requires_grad


def test_the_hint_of_a_prefix_that_matches_nothing_names_every_name_of_a_tied_weight():
    """A decoder without a bias, its weight tied to an embedding: the hint of arch.freeze and of
    param_groups listed layers.embed only (named_parameters() gives a tied weight's first name),
    while either name is what a user may write."""

    class TiedDecoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.decoder = nn.Embedding(5, 4), nn.Linear(4, 5, bias=False)
            self.decoder.weight = self.embed.weight

    model = Tree(TiedDecoder())
    hint = "names start with: layers.decoder, layers.embed)"
    with pytest.raises(ConfigValueError, match=re.escape(hint)):
        model.freeze(["layers.head"])
    with pytest.raises(ConfigError, match=re.escape(hint)):
        parameter_groups(model, [{"params": "layers.head", "lr": 0.1}], "t.json")


@functools.cache
def real_model(name: str) -> nn.Module:
    """One of the project's models or a torchvision classifier, small (built once: the tests
    only change requires_grad)."""
    from torchvision import models

    from model.fast_cifar import FastCifarCNN
    from model.model import CifarCNN, DenoisingCNN, TabularMLP

    return {
        "CifarCNN": lambda: CifarCNN(widths=[4, 8]),
        "DenoisingCNN": lambda: DenoisingCNN(width=4, depth=2),
        "TabularMLP": lambda: TabularMLP(in_features=5, hidden=[4], num_classes=3),
        "FastCifarCNN": lambda: FastCifarCNN(widths=[4, 8, 8]),
        "resnet18": lambda: models.resnet18(num_classes=3),
        "mobilenet_v3_small": lambda: models.mobilenet_v3_small(num_classes=3),
        "convnext_tiny": lambda: models.convnext_tiny(num_classes=3),  # LayerNorm2d
        "VisionTransformer": lambda: models.VisionTransformer(
            image_size=16,
            patch_size=8,
            num_layers=1,
            num_heads=2,
            hidden_dim=8,
            mlp_dim=8,
            num_classes=3,
        ),  # class token and position embedding: parameters of no layer
    }[name]()


REAL_MODELS = [
    "CifarCNN", "DenoisingCNN", "TabularMLP", "FastCifarCNN", "resnet18", "mobilenet_v3_small",
    "convnext_tiny", "VisionTransformer",
]  # fmt: skip


@pytest.mark.parametrize("name", REAL_MODELS)
@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_split_of_real_models_follows_the_documented_rule(num_examples, name, tmp_path):
    """The project's models and torchvision classifiers, some parameters frozen, a "matrix"
    group on another algorithm and norm_bias_weight_decay: every trainable parameter in exactly
    one group, a frozen one in none; the matrices (two or more dimensions outside normalisation
    layers, not biases) at the group's rate, the rest at args'; normalisation layers and biases
    at norm_bias_weight_decay; the same order of parameters at each build (what a resume's
    optimizer state is indexed by)."""
    pytest.importorskip("torchvision")
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path)
    other = "Muon" if hasattr(torch.optim, "Muon") else "Adam"
    config["optimizer"] = {
        "type": "SGD", "args": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.5},
        "param_groups": [{"kind": "matrix", "optimizer": other, "lr": 0.02, "weight_decay": 0.25}],
        "norm_bias_weight_decay": 0.0,
    }  # fmt: skip
    parsed = ConfigParser(config, source="t.json")

    @settings(max_examples=max(num_examples // 5, 1), deadline=None)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        model = real_model(name)
        exempt, matrices = is_norm_or_bias(model), set()
        for module in model.modules():
            for part, param in module.named_parameters(recurse=False):
                if param.dim() >= 2 and not isinstance(module, NORM_LAYERS) and "bias" not in part:
                    matrices.add(id(param))
        params = list(model.parameters())
        frozen = data.draw(st.sets(st.integers(0, len(params) - 1), max_size=5), label="frozen")
        for index, param in enumerate(params):
            param.requires_grad_(index not in frozen)
        next(p for p in params if id(p) in matrices).requires_grad_(True)  # the group's one
        optimizer = build_optimizer(parsed, model, torch.device("cpu"))
        placed = []
        for group in optimizer.param_groups:
            for param in group["params"]:
                placed.append(id(param))
                ours = id(param) in matrices
                assert group["lr"] == (0.02 if ours else 0.1)
                decay = 0.0 if id(param) in exempt else 0.25 if ours else 0.5
                assert group["weight_decay"] == decay
        assert sorted(placed) == sorted(id(param) for param in params if param.requires_grad)
        again = build_optimizer(parsed, model, torch.device("cpu"))
        assert [list(map(id, group["params"])) for group in again.param_groups] == [
            list(map(id, group["params"])) for group in optimizer.param_groups
        ]

    check()
