"""The trainer section of config.json (the training loop), one dataclass field per key; the
rest of the schema is config_schema.py, which includes this section."""

import dataclasses
from typing import Any

from utils.config.config_checks import (
    AMP,
    BOOL,
    COMPILE_MODE,
    LOGGERS,
    NON_NEGATIVE_INT,
    NON_NEGATIVE_NUMBER,
    NONFINITE,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    PROBABILITY,
    PROFILE_WINDOW,
    REQUIRED,
    SHARE,
    STRING,
    VERBOSITY,
    WANDB_MODE,
    choice,
    key,
    optional,
)


@dataclasses.dataclass(kw_only=True)
class TrainerConfig:
    """trainer: the training loop."""

    epochs: int = key(REQUIRED, POSITIVE_INT, "number of epochs (> 0)")
    save_dir: str = key("saved/", STRING, "root of all outputs (relative to the working directory)")
    save_period: int = key(
        1, POSITIVE_INT, "save `checkpoint-epoch<N>.pth` every N epochs, and the last"
    )
    verbosity: int = key(1, VERBOSITY, "`0`: warnings only, no progress bar; `1`: info; `2`: debug")
    monitor: str = key(
        "off",
        STRING,
        '`"min|max <split>/<metric>"` or `"off"`: best model and early stopping',
    )
    early_stop: int | None = key(
        0, optional(NON_NEGATIVE_INT), "stop after N epochs without improvement; `0`/`null`: never"
    )
    loggers: list[str] = key(
        ["tensorboard"], LOGGERS, "where metrics go: any of `tensorboard`, `csv`, `wandb`, `mlflow`"
    )
    tensorboard: bool = key(
        True, BOOL, "`false`: no TensorBoard even when `loggers` names it (the older switch)"
    )
    wandb_project: str | None = key(
        None, optional(STRING), "the W&B project; `null`: the config's `name`"
    )
    wandb_mode: str | None = key(
        None,
        WANDB_MODE,
        '`"online"` or `"offline"`; `null`: W&B default (`WANDB_MODE`, else online)',
    )
    mlflow_tracking_uri: str | None = key(
        None,
        optional(STRING),
        "MLflow tracking URI; `null`: `sqlite:///<save_dir>/log/<name>/mlflow.db`",
    )
    len_epoch: int | None = key(
        None, optional(POSITIVE_INT), "batches per epoch; `null`: one pass over the data"
    )
    progress_seconds: float = key(
        20,
        NON_NEGATIVE_NUMBER,
        "without a terminal (a pipe, a log file): a progress line at most this often; `0`: at every `log_step` read",
    )
    profile: list[int] | None = key(
        None,
        optional(PROFILE_WINDOW),
        "`[wait, warmup, active]`: `torch.profiler` over the run's first training batches "
        "(skip `wait`, warm up `warmup`, record `active`, e.g. `[5, 2, 5]`): a trace and the "
        "top operators in the log folder's `profile/`; `null`: off",
    )
    profile_all_ranks: bool = key(False, BOOL, "with `profile`: every rank, not rank 0 alone")
    log_step: int = key(
        10, POSITIVE_INT, "batches between reads of the running loss: the loop's only host sync"
    )
    keep_last: int | None = key(
        None,
        optional(POSITIVE_INT),
        "keep the newest N checkpoints (and the best); `null`: all",
    )
    deterministic: bool = key(False, BOOL, "fail on kernels without a deterministic implementation")
    nonfinite: str = key(
        "stop", NONFINITE, 'a NaN/inf loss: `"stop"` with an error or `"skip"` its batch'
    )
    max_skipped_steps: int = key(
        10, NON_NEGATIVE_INT, 'with `"skip"`: stop after more than this many skipped batches'
    )
    auto_resume: bool = key(
        False, BOOL, "continue from the newest checkpoint of an existing run folder"
    )
    amp: str | None = key(
        None, AMP, '`"bf16"` or `"fp16"` autocast (fp16 adds a GradScaler); `null`: off'
    )
    channels_last: bool = key(False, BOOL, "NHWC memory format for the model and inputs")
    compile: bool = key(False, BOOL, "`torch.compile` the model; checkpoints hold the plain model")
    compile_mode: str = key("default", COMPILE_MODE, "the `mode` of `torch.compile`")
    async_checkpoint: bool = key(
        False, BOOL, "with fsdp: write each epoch's shards while the next one trains"
    )
    activation_checkpointing: bool = key(
        False, BOOL, "recompute each block's activations in backward (the model's blocks())"
    )
    grad_accum_steps: int = key(
        1, POSITIVE_INT, "accumulate gradients over this many batches per optimizer step"
    )
    grad_clip: float | None = key(
        None, optional(POSITIVE_NUMBER), "clip the global gradient norm to this; `null`: off"
    )
    cudnn_benchmark: bool = key(
        False, BOOL, "`torch.backends.cudnn.benchmark` (CUDA; not with `deterministic`)"
    )
    tf32: bool | None = key(
        None, optional(BOOL), "TF32 matmuls and convolutions on CUDA; `null`: torch's defaults"
    )
    ema_decay: float | None = key(
        None,
        optional(PROBABILITY),
        "keep an exponential moving average of the weights with this decay; `null`: off",
    )
    ema_period: int = key(1, POSITIVE_INT, "optimizer steps between two updates of the average")
    ema_warmup_reset: bool = key(
        False, BOOL, "restart the average at every update inside the warmup (torchvision's recipe)"
    )
    lookahead_period: int | None = key(
        None,
        optional(POSITIVE_INT),
        "Lookahead: every this many optimizer steps the slow weights move towards the trained "
        "ones, and training goes on from them; `null`: off",
    )
    lookahead_decay: float = key(
        0.5, SHARE, "the share of the slow weights kept at a synchronisation (at the ramp's end)"
    )
    lookahead_ramp: float = key(
        0.0,
        NON_NEGATIVE_NUMBER,
        "the kept share grows as (step / total steps) ** this; `0`: constant (the paper's)",
    )
    tta_flip: bool = key(
        False,
        BOOL,
        "validation, test.py, predict.py and export.py also see each image mirrored "
        "(test-time augmentation)",
    )
    tta_translate: int = key(
        0,
        NON_NEGATIVE_INT,
        "...and each view shifted by this many pixels both ways (reflect padding; less than the "
        "images' height and width); `0`: not",
    )
    tta_average: str = key(
        "logits",
        choice("logits", "probabilities"),
        'how the views combine: mean logits, or `"probabilities"` (log of mean softmax)',
    )
    tta_translate_weight: float = key(
        1.0,
        POSITIVE_NUMBER,
        "the weight of each shifted view against an unshifted one's 1 (only with `tta_translate`); "
        "`0.5`: the CIFAR-10 speed record's (airbench94)",
    )
    save_top_k: int = key(
        0, NON_NEGATIVE_INT, "also keep the k best epochs as `model_best-epoch<N>.pth`"
    )
    type: str = key(
        "Trainer", STRING, "the trainer class: a name in the `trainer` package's `__all__`"
    )
    args: dict[str, Any] = key({}, None, "keyword arguments for that class's constructor")
