"""Parameter groups (utils/optim/optimizer.py) over random module trees: every trainable
parameter in exactly one group, each with the learning rate and weight decay the config says,
whatever the layers call their parameters, whatever is frozen or tied."""

import pytest
import torch
from conftest import NUM_EXAMPLES
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from utils.optim.optimizer import NORM_LAYERS, parameter_groups, split_norm_and_bias

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
