"""A checkpoint's model and input transform, rebuilt from the checkpoint alone (no data).

predict.py and export.py use these: the model comes from the checkpoint's own config and
weights, the evaluation transform from its data loader's preset, so neither reads the data.
"""

import copy
from collections.abc import Callable
from pathlib import Path

import torch

import data_loader.data_loaders as data_module
import model.model as arch_module
from data_loader.transforms import evaluation_transform
from parse_config import ConfigError, ConfigParser
from utils.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_model_state,
    use_averaged_weights,
)
from utils.util import ConfigValueError


def load_inference_model(
    path: Path, *, weights: str = "auto"
) -> tuple[torch.nn.Module, ConfigParser, dict]:
    """(model in evaluation mode on the CPU, its config, the checkpoint) of checkpoint `path`,
    holding the weights --weights chose (use_averaged_weights); state["ema_chosen"] says which."""
    state = load_checkpoint(path, map_location="cpu")
    if not isinstance(state["config"], dict):
        raise CheckpointError(
            f"{path}: its config is not a dict; not a checkpoint of this template"
        )
    config = copy.deepcopy(state["config"])
    arch_args = config.get("arch", {}).get("args", {})
    if arch_args.get("weights") is not None:
        # The pretrained weights the run started from: the checkpoint's own replace them, so
        # they are neither downloaded nor read.
        arch_args["weights"] = None
    parsed = ConfigParser(config, source=f"{path} (its config)")
    model = parsed.init_obj("arch", arch_module)
    state["ema_chosen"] = use_averaged_weights(state, weights)
    load_model_state(model, state, path, ema=state["ema_chosen"])
    return model.eval(), parsed, state


def weights_note(state: dict) -> str:
    """Which weights were loaded, and why, for the log."""
    if not state["ema_chosen"]:
        return "the trained weights"
    monitor = (state.get("config") or {}).get("trainer", {}).get("monitor", "")
    why = f" (trainer.monitor {monitor!r} judged them)" if state.get("weights") == "ema" else ""
    return f"the averaged weights{why}"


def input_transform(config: ConfigParser) -> Callable:
    """Image (PIL or HWC uint8 array) -> the model's input (C, H, W), as the run evaluated it."""
    section = config["data_loader"]
    loader_class = config.lookup(data_module, section["type"], "data_loader.type")
    try:
        return evaluation_transform(loader_class, section["args"])
    except ConfigValueError as error:
        raise ConfigError(f"{config.source}: data_loader: {error}") from None
