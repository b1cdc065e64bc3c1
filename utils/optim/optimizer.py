"""The trainable parameters and the optimizer, from config: arch.freeze, optimizer.param_groups,
the weight decay of normalisation layers and biases, learning rates scaled to the global batch,
and fused optimizer kernels on CUDA."""

import torch
from torch import nn

from parse_config import ConfigError, ConfigParser
from utils.data.batches import lr_scale
from utils.distributed.device import capabilities
from utils.distributed.sharding import is_sharded
from utils.optim.combined import CombinedOptimizer, combine

# Optimizers whose fused CUDA kernels take GradScaler's inf check as a device tensor: with them
# an fp16 step never waits on the GPU, while GradScaler.step reads it on the host otherwise.
FUSED_ON_CUDA = ("Adam", "AdamW", "SGD")
# Those whose fused kernel DTensor (FSDP's sharded parameters) has a sharding rule for: not SGD's
# (aten._fused_sgd_ raises NotImplementedError at the first step), which takes foreach instead.
FUSED_ON_SHARDS = ("Adam", "AdamW")
# Layers whose weights scale normalised activations: decaying them towards 0 only fights the
# normalisation (so torchvision's and timm's recipes exempt them, with every bias).
NORM_LAYERS = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.InstanceNorm1d,
    nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm,
)  # fmt: skip


def build_optimizer(
    config: ConfigParser, model: nn.Module, device: torch.device, world_size: int = 1
) -> torch.optim.Optimizer:
    """optimizer.type over the model's trainable parameters, in optimizer.param_groups, each
    split in two when norm_bias_weight_decay is set.

    Every learning rate is multiplied by lr_scale (with reference_batch_size). On CUDA, Adam,
    AdamW and SGD use their fused kernels unless optimizer.args sets "fused" or "foreach"; SGD
    over FSDP's shards its foreach kernels (kernel_args).
    """
    section = config["optimizer"]
    groups = parameter_groups(model, section.get("param_groups") or [], config.source)
    if section["norm_bias_weight_decay"] is not None:
        groups = split_norm_and_bias(model, groups, section["norm_bias_weight_decay"])
    sharded = is_sharded(model)
    if sharded and section["args"].get("fused") and section["type"] not in FUSED_ON_SHARDS:
        raise ConfigError(
            f'{config.source}: optimizer.args.fused: not with distributed.strategy "fsdp": '
            f"{section['type']}'s fused kernel does not take sharded parameters (DTensor)"
        )
    # train_epochs is the engine's (utils/optim/group_epochs.py), not a torch.optim option.
    groups = [{k: v for k, v in group.items() if k != "train_epochs"} for group in groups]
    extra = kernel_args(
        section["type"],
        section["args"],
        fused_available=capabilities(device).fused_optimizers,
        sharded=sharded,
    )
    if any("optimizer" in group for group in groups):
        optimizer = combined_optimizer(config, groups, extra, sharded)
    else:
        optimizer = config.init_obj("optimizer", torch.optim, groups, **extra)
    scale = lr_scale(config, world_size)
    if scale != 1:  # the learning rate grows with the batch
        for group in optimizer.param_groups:
            group["lr"] *= scale
    return optimizer


def combined_optimizer(
    config: ConfigParser, groups: list[dict], extra: dict, sharded: bool
) -> CombinedOptimizer:
    """optimizer.type over the groups without an "optimizer" key (with optimizer.args), and
    each other torch.optim algorithm over the groups that name it (with torch's defaults for
    the options they leave out)."""
    section, source = config["optimizer"], config.source
    if sharded:
        raise ConfigError(
            f'{source}: optimizer.param_groups[].optimizer: not with distributed.strategy "fsdp" '
            "(its parameters are shards, not whole matrices); use ddp"
        )
    main = getattr(torch.optim, section["type"])
    algorithms = [getattr(torch.optim, group.pop("optimizer", section["type"])) for group in groups]
    kwargs = {algorithm: {} for algorithm in algorithms}
    kwargs[main] = {**section["args"], **extra}
    return combine(groups, algorithms, kwargs)


def kernel_args(
    optimizer_type: str, args: dict, *, fused_available: bool, sharded: bool
) -> dict[str, bool]:
    """What build_optimizer adds to optimizer.args: fused=True where the device has fused
    kernels (CUDA) for this optimizer and its parameters take them; for sharded parameters
    whose fused kernel DTensor cannot run (SGD), foreach=True, the multi-tensor kernels. Nothing
    when optimizer.args chooses: "fused", or "foreach" (true; for those, either)."""
    if not fused_available or optimizer_type not in FUSED_ON_CUDA or "fused" in args:
        return {}
    if sharded and optimizer_type not in FUSED_ON_SHARDS:
        return {} if "foreach" in args else {"foreach": True}
    return {} if args.get("foreach") else {"fused": True}


def kind_of(module: nn.Module, name: str, param: torch.Tensor) -> set[str]:
    """The optimizer.param_groups kinds (PARAM_KINDS) that parameter `name` of `module` is."""
    norm = isinstance(module, NORM_LAYERS)
    # torch calls some biases otherwise: MultiheadAttention's in_proj_bias, bias_k and bias_v
    # (those two of shape (1, 1, E), no matrix), the RNNs' bias_ih_l0 and bias_hh_l0.
    bias = "bias" in name.split("_")
    kinds = {"norm", f"norm_{name}"} if norm else set()
    kinds |= {"matrix"} if param.dim() >= 2 and not norm and not bias else set()
    return kinds | ({"bias"} if bias else set())


def parameter_kinds(model: nn.Module) -> dict[int, set[str]]:
    """id(parameter) -> its kinds."""
    return {
        id(param): kind_of(module, name, param)
        for module in model.modules()
        for name, param in module.named_parameters(recurse=False)
    }


def split_norm_and_bias(model: nn.Module, groups: list[dict], weight_decay: float) -> list[dict]:
    """Each group as (its other parameters, its normalisation-layer parameters and biases with
    this weight decay), leaving out an empty half."""
    special = {key for key, kinds in parameter_kinds(model).items() if kinds - {"matrix"}}
    split = []
    for group in groups:
        rest = [param for param in group["params"] if id(param) not in special]
        exempt = [param for param in group["params"] if id(param) in special]
        if rest:
            split.append({**group, "params": rest})
        if exempt:
            split.append({**group, "params": exempt, "weight_decay": weight_decay})
    return split


def parameter_groups(model: nn.Module, groups: list[dict], source: str) -> list[dict]:
    """The trainable parameters as torch.optim parameter groups: first those no group takes
    (they take optimizer.args), then one per entry of optimizer.param_groups, which takes the
    parameters under its "params" (parameter-name prefixes, whole name parts, as in
    arch.freeze) that are of its "kind" (PARAM_KINDS), either alone or both. Its other keys are
    the group's options, train_epochs included (build_optimizer leaves that one out). A tied
    weight (one parameter under several names) is under a prefix when any of its names is."""
    trainable = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
    names: dict[int, list[str]] = {}  # id(parameter) -> every name it goes by
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    kinds = parameter_kinds(model)
    owner: dict[str, int] = {}  # parameter name -> index of the group that took it
    built = []
    for index, group in enumerate(groups):
        where = f"{source}: optimizer.param_groups[{index}]"
        prefixes = group.get("params", [""])
        prefixes = [prefixes] if isinstance(prefixes, str) else prefixes
        kind = group.get("kind")
        params = []
        for prefix in prefixes:
            matched = [
                (name, param)
                for name, param in trainable
                if (not prefix or any(under_prefix(alias, prefix) for alias in names[id(param)]))
                and (kind is None or kind in kinds[id(param)])
            ]
            if not matched:
                what = f".params: {prefix!r}" if prefix else f".kind: {kind!r}"
                what += f" of kind {kind!r}" if prefix and kind else ""
                raise ConfigError(
                    f"{where}{what} matches no trainable parameter (frozen ones are left out; "
                    f"names start with: {', '.join(name_prefixes(model))})"
                )
            for name, param in matched:
                if owner.get(name) == index:  # under two of this group's prefixes: once
                    continue
                if name in owner:
                    field = ".params" if "params" in group else ".kind"
                    tied = ", ".join(names[id(param)][1:])
                    raise ConfigError(
                        f"{where}{field}: {name}{f' (tied: also {tied})' if tied else ''} is "
                        f"already in optimizer.param_groups[{owner[name]}]"
                    )
                owner[name] = index
                params.append(param)
        options = {key: value for key, value in group.items() if key not in ("params", "kind")}
        check_algorithm(options.get("optimizer"), params, where)
        built.append({**options, "params": params})
    rest = [param for name, param in trainable if name not in owner]
    return ([{"params": rest}] if rest else []) + built


def under_prefix(name: str, prefix: str) -> bool:
    """Whether parameter `name` is `prefix` or lies under it, by whole name parts:
    "network.layer1" covers "network.layer1.0.conv1.weight", not "network.layer10..."."""
    return name == prefix or name.startswith(prefix + ".")


def name_prefixes(module: nn.Module) -> list[str]:
    """The first two parts of the parameter names (e.g. network.layer1), for error messages:
    every name of a tied weight (arch.freeze and param_groups take any of them)."""
    names = (name for name, _ in module.named_parameters(remove_duplicate=False))
    return sorted({".".join(name.split(".")[:2]) for name in names})


def check_algorithm(name: str | None, params: list[torch.Tensor], where: str) -> None:
    """A param_groups entry's "optimizer": a torch.optim class this torch has; Muon over
    parameters of two or more dimensions only."""
    if name is None:
        return
    found = getattr(torch.optim, name, None)
    if not (isinstance(found, type) and issubclass(found, torch.optim.Optimizer)):
        raise ConfigError(
            f"{where}.optimizer: torch {torch.__version__} has no optimizer torch.optim.{name}"
            + (
                " (Muon came with torch 2.9): upgrade torch, or remove this group and its "
                "max_lr so that optimizer.type trains its parameters"
                if name == "Muon"
                else ""
            )
        )
    flat = [param for param in params if param.dim() < 2]
    if found.__name__ == "Muon" and flat:
        raise ConfigError(
            f"{where}.optimizer: Muon takes matrices (and convolution filters), got a parameter "
            f'of shape {tuple(flat[0].shape)}; select them with "kind": "matrix"'
        )
