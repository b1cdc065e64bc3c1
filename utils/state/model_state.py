"""A checkpoint's tensors into this run's model and optimizer, whichever way each is laid out:
an ordinary checkpoint (whole tensors) or a sharded one (a DCP folder, utils/state/sharded.py),
into a model that FSDP sharded (its parameters DTensors, each rank holding a shard) or not."""

from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from utils.distributed.sharding import is_sharded
from utils.state.checkpoint import CheckpointError, ema_weights
from utils.state.sharded import check_shards, load_shards, shards_folder
from utils.util import unwrap_model


def load_model_state(model: nn.Module, state: dict, path: Path, *, ema: bool = False) -> None:
    """Load state["model"] (or with ema, the averaged weights; or from a sharded checkpoint's
    folder) into `model` (unwrapped from DDP; sharded by FSDP or not); a mismatch is a
    CheckpointError."""
    if shards_folder(state, path) is not None and not ema:
        load_model_shards(model, state, path)
        return
    model = unwrap_model(model)
    weights = ema_weights(state, path) if ema else state["model"]
    try:
        if is_sharded(model):
            # Whole tensors into DTensors: each rank keeps its shard of each (load_state_dict
            # would copy a whole tensor into a shard, and fail). It edits the dict it is given.
            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(model, dict(weights), options=options)
        else:
            model.load_state_dict(weights)
    except RuntimeError as error:
        detail = " ".join(str(error).split())[:300]
        arch = state["config"].get("arch", {}).get("type", "?")
        raise CheckpointError(
            f"{path}: its weights (arch {arch}) do not fit the configured model: {detail}"
        ) from None


def load_model_shards(model: nn.Module, state: dict, path: Path) -> None:
    """The model's weights from a sharded checkpoint, into `model` sharded or not (test.py,
    predict.py and export.py in one process without a process group)."""
    check_shards(state, path)
    model = unwrap_model(model)
    weights = get_model_state_dict(model)
    load_shards({"model": weights}, shards_folder(state, path))
    set_model_state_dict(model, weights)


def load_optimizer_shards(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, path: Path, *, whole: bool
) -> int:
    """The per-parameter optimizer state of a sharded checkpoint, by parameter name. whole: with
    its saved param_groups (the config is unchanged); else with the optimizer's own. Returns
    how many parameters got their state."""
    model = unwrap_model(model)
    _, current = get_state_dict(model, optimizer)  # a template: every parameter's state, zeros
    saved = state["optimizer"]
    names = [name for name in current["state"] if name in saved["extra"]]
    tensors = {
        name: {k: v for k, v in current["state"][name].items() if isinstance(v, torch.Tensor)}
        for name in names
    }
    load_shards({"optimizer": tensors}, shards_folder(state, path), partial=True)
    loaded = {name: {**tensors[name], **saved["extra"][name]} for name in names}
    groups = saved["param_groups"] if whole else current["param_groups"]
    set_optimizer_state_dict(
        model,
        optimizer,
        {"state": loaded, "param_groups": groups},
        options=StateDictOptions(strict=False),
    )
    return len(loaded)


def load_whole_optimizer_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    names: list[list[str]],
    *,
    whole: bool,
) -> int:
    """An ordinary checkpoint's per-parameter optimizer state (whole tensors, by index; `names`:
    the parameter names of its groups) into the optimizer of a sharded model, by parameter
    name, each rank keeping its shards. whole: with its saved param_groups (the config is
    unchanged); else with the optimizer's own. Returns how many parameters got their state."""
    model = unwrap_model(model)
    saved = state["optimizer"]
    flat = [name for group in names for name in group]
    _, current = get_state_dict(model, optimizer)  # its groups name the parameters
    mine = {name for group in current["param_groups"] for name in group["params"]}
    loaded = {flat[index]: values for index, values in saved["state"].items()}
    loaded = {name: values for name, values in loaded.items() if name in mine}
    groups = current["param_groups"]
    if whole:
        groups = [
            {**group, "params": group_names}
            for group, group_names in zip(saved["param_groups"], names, strict=True)
        ]
    set_optimizer_state_dict(
        model,
        optimizer,
        {"state": loaded, "param_groups": groups},
        options=StateDictOptions(full_state_dict=True, strict=False),
    )
    # Whole tensors are taken by first giving every parameter a state (get_state_dict's step
    # with zero gradients: Adam's count at 1), which they replace: a parameter the checkpoint
    # has none for (new to a changed config) starts afresh instead, as in one process.
    for name, parameter in model.named_parameters():
        if name not in loaded:
            optimizer.state.pop(parameter, None)
    return len(loaded)
