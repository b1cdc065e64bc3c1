"""Every key of config.json, declared once: type, default, check and a one-line doc.

Each section of the config is a dataclass (torchtitan's JobConfig is the model), each key one
field made by `key(default, check, doc)`. utils/config/load_config.py fills in defaults and checks values by
walking these fields; docs/config.md's tables are generated from them. So adding a trainer option
is adding one field to TrainerConfig (utils/config/trainer_schema.py, the longest section), then `python config_schema.py docs/config.md` to update the
docs (tests/test_docs.py fails until you do). At run time the config stays a plain dict
(config["trainer"]["epochs"]); checks across several keys live in utils/config/load_config.py.
"""

import argparse
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

from utils.config.config_checks import (
    BACKEND,
    BOOL,
    CLASS_WEIGHTS,
    DEVICE,
    FOLDS,
    INTERVAL,
    METRICS,
    NAME,
    NON_NEGATIVE_INT,
    NON_NEGATIVE_NUMBER,
    OPTIONAL,
    PARAM_GROUPS,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    PREFIX_LIST,
    PROBABILITY,
    REQUIRED,
    SAMPLER,
    SHARE,
    STRATEGY,
    STRING,
    VALIDATION_SPLIT,
    key,
    optional,
)
from utils.config.schema_docs import MARKED_TABLE, markdown_table, marked_tables
from utils.config.trainer_schema import TrainerConfig


# kw_only: a required key may follow keys with defaults. A field's order is its row in the docs.
@dataclasses.dataclass(kw_only=True)
class OptimizerArgs:
    """optimizer.args, and each param_groups entry, checked up front when present."""

    lr: float | None = key(OPTIONAL, POSITIVE_NUMBER, "learning rate (> 0)")
    weight_decay: float | None = key(OPTIONAL, NON_NEGATIVE_NUMBER, "weight decay (>= 0)")


@dataclasses.dataclass(kw_only=True)
class LossArgs:
    """loss.args, checked up front when present; any other argument is the function's."""

    label_smoothing: float | None = key(
        OPTIONAL, SHARE, "`cross_entropy`: weight of the uniform distribution in the target"
    )


@dataclasses.dataclass(kw_only=True)
class DataLoaderArgs:
    """data_loader.args of every loader, checked when present; the defaults are BaseDataLoader's."""

    batch_size: int = key(REQUIRED, POSITIVE_INT, "samples per batch (per process)")
    shuffle: bool = key(True, BOOL, '`false` is the older spelling of `"sampler": "sequential"`')
    sampler: str = key("random", SAMPLER, "how each epoch draws the training data")
    replacement: bool = key(False, BOOL, '`"random"` only: draw with replacement')
    num_samples: int | None = key(
        None, optional(POSITIVE_INT), '`"random"`, `"weighted"`: draws per pass; `null`: all'
    )
    class_weights: list[float] | None = key(
        None, optional(CLASS_WEIGHTS), '`"weighted"` only: one weight per class; `null`: balanced'
    )
    validation_split: float | int = key(
        0.0, VALIDATION_SPLIT, "a fraction or number of training samples to validate on"
    )
    folds: int | None = key(None, optional(FOLDS), "k-fold cross-validation with this many folds")
    fold: int | None = key(
        None, optional(NON_NEGATIVE_INT), "the fold (0 to `folds` - 1) this run trains"
    )
    num_workers: int = key(0, NON_NEGATIVE_INT, "DataLoader worker processes")
    pin_memory: bool = key(False, BOOL, "page-locked host memory for faster copies to the GPU")
    persistent_workers: bool = key(
        True, BOOL, "keep worker processes between epochs (with `num_workers` > 0)"
    )
    prefetch_factor: int | None = key(
        None, optional(POSITIVE_INT), "batches each worker loads ahead; `null`: PyTorch's 2"
    )


@dataclasses.dataclass(kw_only=True)
class Section:
    """A {"type": NAME, "args": {...}} section: NAME(**args), NAME looked up in one module."""

    known_args: ClassVar[type | None] = None  # the dataclass of the args checked up front

    type: str = key(REQUIRED, STRING, "what to build: a name in the section's module")
    args: dict[str, Any] = key({}, None, "the keyword arguments it is called with")


@dataclasses.dataclass(kw_only=True)
class ArchSection(Section):
    """arch: the model."""

    freeze: list[str] | None = key(
        OPTIONAL, PREFIX_LIST, "parameter-name prefixes of the parameters not to train"
    )
    freeze_norm_scale: bool = key(
        False,
        BOOL,
        "normalisation layers keep their scale (`weight`) as built, 1 for BatchNorm: not trained",
    )


@dataclasses.dataclass(kw_only=True)
class DataLoaderSection(Section):
    """data_loader: the data."""

    known_args = DataLoaderArgs


@dataclasses.dataclass(kw_only=True)
class LossSection(Section):
    """loss, when it has arguments: a function in model/loss.py."""

    known_args = LossArgs


@dataclasses.dataclass(kw_only=True)
class OptimizerSection(Section):
    """optimizer: any optimizer in torch.optim."""

    known_args = OptimizerArgs

    param_groups: list[dict[str, Any]] | None = key(
        OPTIONAL, PARAM_GROUPS, "parts of the model with their own optimizer options"
    )
    norm_bias_weight_decay: float | None = key(
        None,
        optional(NON_NEGATIVE_NUMBER),
        "weight decay of normalisation-layer weights and of biases (e.g. `0.0`); `null`: as the rest",
    )
    reference_batch_size: int | None = key(
        None,
        optional(POSITIVE_INT),
        "the learning rates are for this global batch: scaled by global batch / this; `null`: as given",
    )


@dataclasses.dataclass(kw_only=True)
class SchedulerSection(Section):
    """lr_scheduler: any scheduler in torch.optim.lr_scheduler."""

    interval: str = key("epoch", INTERVAL, "step the scheduler after each epoch or each step")
    warmup_epochs: float = key(
        0,
        NON_NEGATIVE_NUMBER,
        'linear warmup before the schedule, in epochs (whole with `"epoch"`)',
    )
    warmup_steps: int = key(
        0, NON_NEGATIVE_INT, 'linear warmup in optimizer steps (`"step"` interval only)'
    )
    warmup_start_factor: float = key(
        0.01, PROBABILITY, "warmup starts at this fraction of the learning rate (in (0, 1])"
    )


@dataclasses.dataclass(kw_only=True)
class BatchMixingConfig:
    """batch_mixing: MixUp and CutMix of training batches (torchvision.transforms.v2)."""

    mixup_alpha: float = key(0.0, NON_NEGATIVE_NUMBER, "MixUp's Beta(alpha, alpha); `0`: no MixUp")
    cutmix_alpha: float = key(
        0.0, NON_NEGATIVE_NUMBER, "CutMix's Beta(alpha, alpha); `0`: no CutMix"
    )
    prob: float = key(1.0, PROBABILITY, "the chance that a batch is mixed")
    cutmix_prob: float = key(
        0.5, PROBABILITY, "with both on: the chance of CutMix rather than MixUp for a batch"
    )


@dataclasses.dataclass(kw_only=True)
class DistributedConfig:
    """distributed: used only under torchrun."""

    backend: str | None = key(None, BACKEND, '`"nccl"` or `"gloo"`; `null`: by device')
    strategy: str = key("ddp", STRATEGY, '`"ddp"`: whole model per rank; `"fsdp"`: FSDP2 shards it')
    reshard_after_forward: bool = key(
        True, BOOL, "with fsdp: free each block's gathered parameters after its forward pass"
    )
    sync_bn: bool = key(False, BOOL, "convert BatchNorm layers to SyncBatchNorm")
    timeout: float | None = key(
        None,
        optional(POSITIVE_NUMBER),
        "minutes a collective may wait for the other processes; `null`: torch's (NCCL 10, gloo 30)",
    )


@dataclasses.dataclass(kw_only=True)
class Config:
    """The whole config.json."""

    name: str = key(REQUIRED, NAME, "experiment name: its folder in `saved/models/`, `saved/log/`")
    device: str = key(
        "auto",
        DEVICE,
        '`"auto"`: CUDA, else Apple MPS, else the CPU; or `"cpu"`, `"cuda"`, `"cuda:N"`, `"mps"`',
    )
    n_gpu: int = key(
        1,
        NON_NEGATIVE_INT,
        'with `device` `"auto"`: `0` the CPU; `>= 1` CUDA or MPS if present (one a process)',
    )
    seed: int = key(0, NON_NEGATIVE_INT, "seeds the model, the split and each epoch's draws")
    arch: ArchSection = key(REQUIRED, None, "the model, from `model/model.py`")
    data_loader: DataLoaderSection = key(
        REQUIRED, None, "the data, from `data_loader/data_loaders.py`"
    )
    optimizer: OptimizerSection = key(REQUIRED, None, "any optimizer in `torch.optim`")
    loss: str | LossSection = key(
        REQUIRED, STRING, 'a function name from `model/loss.py`, or {"type": NAME, "args": {...}}'
    )
    metrics: list[str | dict] = key(
        [],
        METRICS,
        'names from `model/metric.py`, or {"type": NAME, "name": KEY, "args": {...}}: logged as `val/KEY` (KEY by default NAME; one type twice needs a name)',
    )
    lr_scheduler: SchedulerSection | None = key(None, None, "a `torch.optim.lr_scheduler` class")
    trainer: TrainerConfig = key(REQUIRED, None, "the training loop")
    batch_mixing: BatchMixingConfig = key({}, None, "MixUp / CutMix; off by default")
    distributed: DistributedConfig = key({}, None, "used only under torchrun")


# docs/config.md holds one table per entry, between <!-- schema: NAME --> and <!-- /schema -->.
TABLES: dict[str, type] = {
    "top-level": Config,
    "section": Section,
    "arch": ArchSection,
    "optimizer": OptimizerSection,
    "lr_scheduler": SchedulerSection,
    "trainer": TrainerConfig,
    "batch_mixing": BatchMixingConfig,
    "distributed": DistributedConfig,
    "data_loader.args": DataLoaderArgs,
    "optimizer.args": OptimizerArgs,
    "loss.args": LossArgs,
}


def render_docs(text: str) -> str:
    """`text` with every marked table replaced by the one the schema generates."""

    def table(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise ValueError(f"<!-- schema: {name} -->: no such table (known: {', '.join(TABLES)})")
        return match.group(1) + markdown_table(TABLES[name]) + match.group(4)

    return MARKED_TABLE.sub(table, text)


def main(path: Path) -> int:
    """Regenerate the marked tables of `path` in place; 1 when a table has no marker there."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SystemExit(f"{path}: cannot read ({error.strerror})") from None
    path.write_text(render_docs(text), encoding="utf-8")
    missing = [name for name in TABLES if name not in marked_tables(text)]
    if missing:
        print(f"{path}: no <!-- schema: NAME --> table for {', '.join(missing)}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Regenerate the key tables of docs/config.md.")
    parser.add_argument("path", type=Path, help="the Markdown file to update, e.g. docs/config.md")
    sys.exit(main(parser.parse_args().path))
