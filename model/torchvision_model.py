"""TorchvisionModel: any torchvision.models architecture by name, from scratch or from pretrained
weights (downloaded, or a local file for offline machines), its head resized to the classes."""

from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import nn

from base import BaseModel
from utils import ConfigValueError, UserError, describe_error
from utils.state.checkpoint import ema_weights, use_averaged_weights

# The auxiliary classifiers of the networks that have them (their attribute names).
AUX_HEADS = {"googlenet": ("aux1", "aux2"), "inception_v3": ("AuxLogits",)}


class TorchvisionModel(BaseModel):
    """Any torchvision.models architecture by name, e.g. {"name": "resnet50", "num_classes": 1000}.

    weights: pretrained weights, either a torchvision weights name ("DEFAULT", "IMAGENET1K_V1",
    or "ResNet50_Weights.IMAGENET1K_V2"; downloaded once into torch's hub cache) or the path of
    a local file holding the network's state dict (for offline machines). The classification
    head (the last layer: a Linear, SqueezeNet's a Conv2d) is then replaced by a new one when
    num_classes differs from the number of classes the weights were trained on.

    builder_args: other keyword arguments of the torchvision builder, e.g. {"image_size": 32}
    for a ViT on 32x32 images, or {"dropout": 0.2}.
    """

    def __init__(
        self,
        name: str,
        *,
        num_classes: int = 1000,
        weights: str | None = None,
        builder_args: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        # JSON gives any type: a wrong one would fail deep inside torchvision, with a traceback.
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ConfigValueError(f"num_classes must be a whole number >= 1, got {num_classes!r}")
        if not isinstance(weights, str | None) or not isinstance(builder_args, dict | None):
            raise ConfigValueError(
                "weights must be a name or a file's path (or null), builder_args a dict of "
                f"arguments (or null), got {weights!r} and {builder_args!r}"
            )
        self.num_classes = num_classes  # the trainer checks the data's labels against it
        if name not in torchvision.models.list_models():
            raise ConfigValueError(
                f"unknown torchvision model {name!r}; see torchvision.models.list_models()"
            )
        check_classifier(name)
        if (builder_args or {}).get("aux_logits") and name in AUX_HEADS:
            raise ConfigValueError(
                f"builder_args: aux_logits: {name}'s auxiliary outputs are not supported (the "
                "loss and metrics take one output); leave aux_logits out"
            )
        # In training, GoogLeNet and Inception v3 with auxiliary heads return a namedtuple of
        # logits, which no loss or metric here takes: built without them, as torchvision's
        # pretrained ones are by default (init_weights: torchvision's, without its warning).
        aux_off = {"aux_logits": False, "init_weights": True} if name in AUX_HEADS else {}
        if weights is None:
            self.network = build_network(
                name, {"num_classes": num_classes, **aux_off}, builder_args
            )
            return
        if is_weights_file(weights):
            check_transform_input(name, builder_args)
            self.network = build_network(name, aux_off, builder_args)
            load_weights_file(self.network, Path(weights), skipped=AUX_HEADS.get(name, ()))
        elif builder_args:
            raise ConfigValueError(
                "builder_args: only without weights or with a weights file (torchvision's "
                "weights fix the network)"
            )
        else:
            self.network = download_pretrained(name, verify_weights(name, weights))
            if name in AUX_HEADS:  # as the builder does with aux_logits False (it refuses it)
                self.network.aux_logits = False
                for aux_name in AUX_HEADS[name]:
                    setattr(self.network, aux_name, None)
        head_name, head = classification_head(self.network)
        if head.weight.shape[0] != num_classes:
            self.network.set_submodule(head_name, resized_head(head, num_classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # A ViT's position embeddings fix its input size, which torchvision checks with an
        # assert (a traceback, as for a bug); a ValueError is what the first-batch check, and
        # the tools, report in one line.
        size = getattr(self.network, "image_size", None)
        if isinstance(size, int) and tuple(images.shape[-2:]) != (size, size):
            height, width = images.shape[-2:]
            raise ValueError(
                f"{type(self.network).__name__} takes {size}x{size} images, got "
                f"{height}x{width}: set arch.args.builder_args image_size (with no weights or "
                "a weights file) or resize the images"
            )
        return self.network(images)


def build_network(name: str, defaults: dict[str, Any], builder_args: dict | None) -> nn.Module:
    """torchvision's `name` built with `defaults` and the config's builder_args over them."""
    try:
        return torchvision.models.get_model(name, **{**defaults, **(builder_args or {})})
    except (TypeError, ValueError) as error:  # an argument the builder does not take, or a
        # value it refuses (a MaxViT input_size its partitions do not divide), in one line
        raise ConfigValueError(f"builder_args: {name}: {' '.join(str(error).split())}") from None


def check_transform_input(name: str, builder_args: dict | None) -> None:
    """Refuse GoogLeNet or Inception v3 from a weights file unless builder_args says whether
    the network rescales its input (transform_input): no state dict records it. torchvision's
    ImageNet weights expect it (its builder sets it from them), one trained here from scratch
    does not (the builder's default): a guess would give other logits than those trained."""
    if name in AUX_HEADS and not isinstance((builder_args or {}).get("transform_input"), bool):
        raise ConfigValueError(
            f"builder_args: transform_input: true or false must be given for {name} from a "
            "weights file: true for torchvision's ImageNet weights, false for a network "
            "trained here from scratch (as its file's network was trained)"
        )


# torchvision's models of other tasks, what they return and which model here does the task.
OTHER_TASKS = {
    "detection": "a list of boxes per image; the detection task's model is TinyDetector",
    "segmentation": "a dict of masks; the segmentation task's model is UNet",
    "video": "classes of clips (B, C, T, H, W), not of images",
    "optical_flow": "flow fields of image pairs",
    "quantization": "a quantized network, for CPU inference after training",
}


def check_classifier(name: str) -> None:
    """Refuse, in one line, a torchvision model of another task than classifying images (a
    detector, a segmenter, a video or quantized network): built here, it failed obscurely on
    the first batch or trained as a classifier what is not one."""
    for task, what in OTHER_TASKS.items():
        if name in torchvision.models.list_models(module=getattr(torchvision.models, task)):
            raise ConfigValueError(
                f"{name!r} is torchvision's {task.replace('_', ' ')} model ({what}); "
                "TorchvisionModel trains image classifiers only: see docs/extending.md for the "
                "detection and segmentation tasks"
            )


def without_pretrained(arch: dict) -> dict:
    """Overrides of arch.args (config["arch"]) that build its network without reading its
    pretrained weights, for a model whose weights a checkpoint then replaces: weights null and,
    for a TorchvisionModel with torchvision's weights, the builder arguments torchvision takes
    from them; else none."""
    args = arch.get("args") or {}
    weights, name = args.get("weights"), args.get("name")
    if weights is None:
        return {}
    if not (arch.get("type") == "TorchvisionModel" and isinstance(weights, str)):
        return {"weights": None}
    if is_weights_file(weights) or name not in torchvision.models.list_models():
        return {"weights": None}  # a file's network is the builder's default one
    try:
        meta = verify_weights(name, weights).meta
    except ConfigValueError:  # e.g. a newer torchvision's name: the checkpoint's shapes tell
        return {"weights": None}
    # What torchvision's builders set from these weights besides the classes (not in a state
    # dict, or of another shape than the default): Inception's input rescaling, ViT's size.
    if name in AUX_HEADS:
        builder_args = {"transform_input": True}
    elif name.startswith("vit_"):
        builder_args = {"image_size": meta["min_size"][0]}
    elif name.startswith("maxvit_"):
        builder_args = {"input_size": meta["min_size"]}
    else:
        builder_args = {}
    return {"weights": None, "builder_args": builder_args}


def classification_head(network: nn.Module) -> tuple[str, nn.Linear | nn.Conv2d]:
    """(name, module) of the network's last layer with parameters: its classifier in
    torchvision, a Linear (SqueezeNet's is a 1x1 Conv2d)."""
    layers = [
        (name, module)
        for name, module in network.named_modules()
        if next(module.parameters(recurse=False), None) is not None
    ]
    if not layers or not isinstance(layers[-1][1], nn.Linear | nn.Conv2d):
        raise ConfigValueError(
            f"{type(network).__name__} has no Linear or Conv2d classification head to replace; "
            "use weights with num_classes as they were trained, or another model"
        )
    return layers[-1]


def resized_head(head: nn.Linear | nn.Conv2d, num_classes: int) -> nn.Linear | nn.Conv2d:
    """A new layer like `head` (untrained) with num_classes outputs."""
    bias = head.bias is not None
    if isinstance(head, nn.Conv2d):
        return nn.Conv2d(
            head.in_channels, num_classes, head.kernel_size, head.stride, head.padding, bias=bias
        )
    return nn.Linear(head.in_features, num_classes, bias=bias)


def is_weights_file(weights: str) -> bool:
    """A path rather than a torchvision weights name (names hold no "/" and do not end in
    .pth, .pt or .bin)."""
    path = Path(weights)
    return "/" in weights or path.suffix in (".pth", ".pt", ".bin") or path.exists()


def verify_weights(name: str, weights: str) -> torchvision.models.WeightsEnum:
    """The torchvision weights `weights` names for model `name`."""
    enum = torchvision.models.get_model_weights(name)
    try:
        return enum.verify(weights)
    except KeyError:
        available = ", ".join(["DEFAULT", *(member.name for member in enum)])
        raise ConfigValueError(
            f"unknown weights {weights!r} for {name} (available: {available}; or the path of a "
            "local state-dict file)"
        ) from None


def download_pretrained(name: str, weights: torchvision.models.WeightsEnum) -> nn.Module:
    """torchvision's `name` with `weights`, downloaded into torch's hub cache if not there yet."""
    try:
        return torchvision.models.get_model(name, weights=weights)
    except (OSError, RuntimeError) as error:  # no network (URLError), a damaged download
        raise UserError(
            f"arch.args.weights: could not download {weights} from {weights.url} "
            f"({describe_error(error)}); on an offline machine, download that file elsewhere "
            "and set arch.args.weights to its path"
        ) from None


def load_weights_file(network: nn.Module, path: Path, skipped: tuple[str, ...] = ()) -> None:
    """Load a state dict saved from this torchvision network (or one of our checkpoints of a
    TorchvisionModel) into `network`, whatever the number of classes it was trained on, but
    for the submodules `skipped` names (auxiliary heads `network` was built without)."""
    if not path.is_file():
        raise ConfigValueError(f"weights file {path} not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unsafe pickles, damaged files: one line, nothing run
        raise UserError(f"{path}: not a readable weights file ({describe_error(error)})") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        # One of this template's checkpoints: the weights its run's monitor judged, as test.py
        # loads them (the averaged ones when trainer.monitor watched a val/ema_ metric).
        state = ema_weights(state, path) if use_averaged_weights(state, "auto") else state["model"]
    if isinstance(state, dict) and state and all(key.startswith("network.") for key in state):
        state = {key.removeprefix("network."): value for key, value in state.items()}
    if isinstance(state, dict) and skipped:  # torchvision's files hold GoogLeNet's aux heads
        state = {key: value for key, value in state.items() if key.split(".")[0] not in skipped}
    head_name, head = classification_head(network)
    head_weight = state.get(f"{head_name}.weight") if isinstance(state, dict) else None
    if isinstance(head_weight, torch.Tensor) and head_weight.shape[0] != head.weight.shape[0]:
        # Trained on another number of classes: a head of that size takes the file's weights.
        network.set_submodule(head_name, resized_head(head, head_weight.shape[0]))
    try:
        network.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as error:
        detail = " ".join(str(error).split())[:300]
        raise UserError(
            f"{path}: its weights do not fit torchvision's {type(network).__name__}: {detail}"
        ) from None
