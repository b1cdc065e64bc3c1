"""What the engine checks of the data and the model before anything is written: the first
training batch, through the task's own training_step and the metrics, and through
validation_step's test-time augmentation (a mistake in the data's dtypes or shapes then stops
the run in one line, not after an epoch, nor by training on nothing)."""

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from base.evaluation import averaged_over_views
from utils import unwrap_model
from utils.data.batches import has_length, to_device
from utils.evaluation.metric_sums import MetricSums
from utils.util import DataError, UserError, describe_error

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer


def tensors(batch: Any) -> list[torch.Tensor]:
    """The tensors of a batch (tuples, lists and dicts of them)."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        return [tensor for item in batch for tensor in tensors(item)]
    return []


def describe(batch: Any) -> str:
    """ "(32, 13) float32, (32,) int64": the shape and dtype of each tensor of a batch."""
    return ", ".join(
        f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tensors(batch)
    )


@contextlib.contextmanager
def one_sample_batch_check(trainer: "BaseTrainer") -> Iterator[None]:
    """Around the first batch's forward: refuse, in one line, a training split whose last batch
    of each pass holds one sample on this rank (the padded share under torchrun, equal on every
    rank) when a BatchNorm the model trains sees one value per channel of a sample ((N, C), or
    (N, C, 1, 1) as in resnet18's last blocks at 32 px): torch cannot take a variance of one
    value and raised mid-epoch, after a whole pass. (A batch_size of 1 fails at the first step.)
    An epoch of trainer.len_epoch batches fewer than a pass never reaches that batch: every
    epoch starts a new pass (utils.data.batches.epoch_batches)."""
    loader = trainer.train_loader
    batch_size = loader.batch_size
    share = len(loader.sampler) if has_length(loader.sampler) else 0  # this rank's, per pass
    if loader.drop_last or not batch_size or batch_size == 1 or share % batch_size != 1:
        yield
        return
    if trainer.len_epoch < -(-share // batch_size):  # the last batch of a pass is never trained
        yield
        return
    single: list[str] = []  # the trained BatchNorms that see one value per channel of a sample

    def before(name: str) -> Callable[[nn.Module, tuple], None]:
        def hook(module: nn.Module, inputs: tuple) -> None:
            if math.prod(inputs[0].shape[2:]) == 1:  # (N, C, *): the values per channel
                single.append(name)

        return hook

    # Frozen submodules stay in evaluation mode (arch.freeze), where BatchNorm takes any batch:
    # decided now, as the check's forward runs in evaluation mode.
    handles = [
        module.register_forward_pre_hook(before(name))
        for name, module in trainer.model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
    if single:
        raise UserError(
            f"{trainer.config.source}: data_loader.args.batch_size: {batch_size} leaves a last "
            f"training batch of 1 sample in each pass ({share} training samples per process), "
            f"and BatchNorm {single[0]} cannot train on one value per channel; choose another "
            "batch_size"
        )


def check_first_batch(trainer: "BaseTrainer") -> None:
    """One training batch through training_step and every metric (no gradients, evaluation
    mode, the random state untouched), and with test-time augmentation through validation_step
    over the views too: float64 data, float labels for a classifier, a batch the model, the
    loss or a metric refuses (a RuntimeError or ValueError: a shape or dtype that does not fit)
    and views that cannot be made or mapped back are a DataError naming what came. Any other
    exception is a bug in your code: it propagates."""
    loader = trainer.train_loader
    try:
        batch = next(iter(loader))
    except StopIteration:
        return  # no batch: check_loaders already refused empty data
    where = f"the first training batch ({describe(batch)})"
    if any(tensor.dtype == torch.float64 for tensor in tensors(batch)):
        raise DataError(
            f"{where}: float64 data, where the model computes in float32; convert it in the "
            "dataset, e.g. torch.as_tensor(values, dtype=torch.float32)"
        )
    num_classes = getattr(unwrap_model(trainer.model), "num_classes", None)
    if num_classes is not None and isinstance(batch, list | tuple) and len(batch) == 2:
        targets = batch[1]
        if isinstance(targets, torch.Tensor) and targets.is_floating_point() and targets.dim() == 1:
            raise DataError(
                f"{where}: a classifier's labels are class indices, int64 (B,); these are "
                f"{str(targets.dtype).removeprefix('torch.')}: convert them in the dataset"
            )
    options, model = trainer.options, trainer.model
    training = model.training
    try:
        # A compiled model would compile a graph of its own here, for nothing: the plain one.
        trainer.model = getattr(model, "_orig_mod", model)
        with one_sample_batch_check(trainer):
            trainer.flops_per_sample = run_step(trainer, batch, where, trainer.training_step)
        trainer.model = model
        # The views are checked on this batch (its images' size) rather than after an epoch;
        # they run the plain model, which compiles nothing.
        if options["tta_flip"] or options["tta_translate"]:
            with averaged_over_views(trainer, unwrap_model(model)):
                run_step(trainer, batch, where, trainer.validation_step)
    finally:
        trainer.model = model
        model.train(training)


def run_step(trainer: "BaseTrainer", batch: Any, where: str, step: Callable) -> float:
    """`step` on the batch in evaluation mode without gradients, the random state untouched,
    and its output through every metric; a RuntimeError or ValueError (what does not fit) is
    a DataError naming the batch. Returns the training FLOPs per sample that FlopCounterMode
    counts: the step's, plus twice those of the trained model's forward (its backward costs
    about twice its forward; a frozen teacher's forward, or the loss, has no backward)."""
    device = trainer.device
    forked = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=forked), torch.no_grad():
            trainer.model.eval()
            moved = to_device(batch, device, trainer.options["channels_last"])
            with (
                torch.autocast(device.type, trainer.amp_dtype, trainer.amp_dtype is not None),
                training_attention(),
                FlopCounterMode(display=False, custom_mapping=UNCOUNTED_OPS) as counter,
            ):
                model_flops, result = forward_flops(trainer.model, counter, step, moved)
            MetricSums(trainer.metric_fns, device).add(result)
            size = result.batch_size if result.batch_size is not None else len(result.target)
            return (counter.get_total_flops() + 2 * model_flops) / max(int(size), 1)
    except (RuntimeError, ValueError) as error:
        raise DataError(
            f"{where} does not fit the model, the loss or the metrics: {describe_error(error)}"
        ) from None


@contextlib.contextmanager
def training_attention() -> Iterator[None]:
    """nn.MultiheadAttention and nn.TransformerEncoder(Layer) as training runs them. In evaluation
    mode without gradients they take a fused fast path FlopCounterMode has no formula for: the
    count missed their attention (a ViT's) or the whole layer (an encoder counted 0 FLOPs)."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


def cudnn_rnn_flops(
    input_shape: torch.Size, weight_shapes: list[torch.Size], *args: Any, **kwargs: Any
) -> int:
    """aten._cudnn_rnn: nn.RNN, LSTM and GRU on a GPU, every layer and direction in one call."""
    return recurrent_flops(input_shape, [shape for shape in weight_shapes if len(shape) == 2])


def onednn_rnn_flops(
    input_shape: torch.Size, w_ih: torch.Size, w_hh: torch.Size, *args: Any, **kwargs: Any
) -> int:
    """aten.mkldnn_rnn_layer: one layer and direction of nn.LSTM on the CPU, through oneDNN."""
    return recurrent_flops(input_shape, [w_ih, w_hh])


def recurrent_flops(input_shape: torch.Size, matrix_shapes: list[torch.Size]) -> int:
    """A multiply and an add per weight of each matrix (input, hidden, projection) per token:
    what FlopCounterMode counts of the per-step matmuls where torch runs the steps itself."""
    num_tokens = math.prod(input_shape[:-1])  # (T, B, in), (B, T, in) or packed (sum B_t, in)
    return 2 * num_tokens * sum(math.prod(shape) for shape in matrix_shapes)


def cpu_attention_flops(
    query_shape: torch.Size,
    key_shape: torch.Size,
    value_shape: torch.Size,
    *args: Any,
    **kwargs: Any,
) -> int:
    """aten._scaled_dot_product_flash_attention_for_cpu: scaled_dot_product_attention on the CPU,
    counted as torch counts its GPU kernels (query @ key.T, then @ value)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# Fused kernels FlopCounterMode has no formula for, and counted as 0 FLOPs: a GRU on CUDA, an
# LSTM or attention on the CPU left time/flops_per_second and time/mfu at the rest's alone.
UNCOUNTED_OPS = {
    torch.ops.aten._cudnn_rnn: cudnn_rnn_flops,
    torch.ops.aten.mkldnn_rnn_layer: onednn_rnn_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention_flops,
}


def forward_flops(
    model: torch.nn.Module, counter: FlopCounterMode, step: Callable, batch: Any
) -> tuple[int, Any]:
    """(the FLOPs `counter` counted inside `model`'s forward passes, step(batch)'s result)."""
    flops = 0

    def before(module: torch.nn.Module, inputs: Any) -> None:
        nonlocal flops
        flops -= counter.get_total_flops()

    def after(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        nonlocal flops
        flops += counter.get_total_flops()

    handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    try:
        result = step(batch)
    finally:
        for handle in handles:
            handle.remove()
    return flops, result
