"""A custom step: knowledge distillation (Hinton et al., 2015) from a frozen teacher.

The student (arch) learns from the labels and from the teacher's softened outputs:
loss = alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * criterion(student, labels),
with both distributions softened by the temperature T. Only the training step changes; the
engine, the validation step (the student alone) and everything else are Trainer's.

    "trainer": {"type": "DistillationTrainer",
                "args": {"teacher": "saved/models/.../model_best.pth", "temperature": 4.0,
                         "alpha": 0.9}, ...}
"""

import copy
import itertools
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import model.model as arch_module
from base import BaseDataLoader, StepOutput
from base.checks import describe
from parse_config import ConfigParser
from trainer.trainer import Trainer
from utils import ConfigValueError, unwrap_model
from utils.data.batches import to_device
from utils.state.checkpoint import CheckpointError, load_checkpoint, use_averaged_weights
from utils.state.model_state import load_model_state
from utils.util import ConfigError, describe_error


class DistillationTrainer(Trainer):
    """Trainer whose training step also matches a teacher checkpoint's outputs."""

    def __init__(
        self, *args: Any, teacher: str, temperature: float = 4.0, alpha: float = 0.9, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        # JSON gives any type: a string or a list would fail at a comparison, with a traceback.
        numbers = all(
            isinstance(value, int | float) and not isinstance(value, bool)
            for value in (temperature, alpha)
        )
        if not numbers or not 0 < temperature < math.inf or not 0 <= alpha <= 1:
            raise ConfigValueError(
                "temperature must be a number > 0 (finite) and alpha one in [0, 1], got "
                f"{temperature!r} and {alpha!r}"
            )
        if not isinstance(teacher, str):
            raise ConfigValueError(f"teacher must be a checkpoint's path, got {teacher!r}")
        self.temperature, self.alpha = temperature, alpha
        self.teacher: torch.nn.Module | None = None
        if self.optimizer is None:  # test.py: it evaluates the student alone, without a teacher
            return
        self.teacher, teacher_names = load_teacher(Path(teacher))
        self.teacher.to(self.device)
        self.teacher_path = teacher
        check_classes(teacher, self.teacher, teacher_names, unwrap_model(self.model), self.data)

    def check_first_batch(self) -> None:
        """The teacher on a sample of the first training batch, before Trainer's check of the
        student: a teacher built for other inputs (another image size) or scoring another
        number of outputs is refused naming trainer.args.teacher, not the data or the student."""
        batch = next(iter(self.train_loader), None)
        if self.teacher is not None and batch is not None:
            images = to_device(batch, self.device, self.options["channels_last"])[0][:1]
            student = getattr(self.model, "_orig_mod", self.model)  # not compiled for this
            error = teacher_misfit(self.teacher, student, images)  # images: (1, C, H, W)
            if error is not None:
                raise ConfigError(
                    f"{self.config.source}: trainer.args: teacher: {self.teacher_path} {error}; "
                    "distil from a teacher trained on inputs and classes like this data's"
                )
        super().check_first_batch()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> StepOutput:
        images, labels = batch  # (B, C, H, W), (B,)
        # Both networks see the same mixed images (MixUp / CutMix, when batch_mixing is on).
        mixed_images, mixed_labels = self.mix(images, labels)
        output = self.model(mixed_images)  # student logits (B, num_classes)
        with torch.no_grad():
            teacher_output = self.teacher(mixed_images)  # (B, num_classes)
        temperature = self.temperature
        # KL divergence between the softened distributions, summed over the classes (dim 1) and
        # averaged over the rest: per sample for (B, K) (kl_div's "batchmean"), per pixel for a
        # dense (B, K, H, W), as the criterion averages. T^2 keeps its gradients' scale
        # independent of the temperature.
        soft_loss = F.kl_div(
            F.log_softmax(output / temperature, dim=1),
            F.log_softmax(teacher_output / temperature, dim=1),
            reduction="none",
            log_target=True,
        ).sum(dim=1).mean() * (temperature**2)
        hard_loss = self.criterion(output, mixed_labels)
        loss = self.alpha * soft_loss + (1 - self.alpha) * hard_loss
        return StepOutput(loss=loss, output=output, target=labels)


def teacher_misfit(
    teacher: torch.nn.Module, student: torch.nn.Module, images: torch.Tensor
) -> str | None:
    """Why the teacher cannot score `images` as the student does (None: it can): its forward
    fails on them, or its output has another shape than the student's (the soft loss compares
    them score by score). A student that fails is left to Trainer's check of the first batch."""
    training = student.training
    # Evaluation mode, no gradient, the random state untouched: the run starts as without it.
    with torch.random.fork_rng(devices=[images.device] if images.is_cuda else []), torch.no_grad():
        try:
            teacher_output = teacher(images)
        except (RuntimeError, ValueError) as error:
            return f"does not take the inputs {describe(images)}: {describe_error(error)}"
        try:
            student.eval()
            student_output = student(images)
        except (RuntimeError, ValueError):
            return None
        finally:
            student.train(training)
    if teacher_output.shape != student_output.shape:
        return (
            f"outputs {tuple(teacher_output.shape)} for the inputs {describe(images)}, the "
            f"student {tuple(student_output.shape)}"
        )
    return None


def load_teacher(path: Path) -> tuple[torch.nn.Module, list[str]]:
    """The model a checkpoint of this template holds, built from its own config, frozen and in
    evaluation mode: the weights its run's monitor judged, as test.py loads them (the averaged
    ones when trainer.monitor watched a val/ema_ metric); and the names of its classes (none
    for a task without classes, or an old checkpoint)."""
    if not path.exists():
        raise ConfigValueError(
            f"teacher: {path} not found; train a teacher first, e.g. python train.py "
            "-c configs/demo.json --run-id teacher"
        )
    try:
        state = load_checkpoint(path, map_location="cpu")  # a folder: it names a file to pass
    except CheckpointError as error:  # named as the config's key, as "not found" is
        raise ConfigValueError(f"teacher: {error}") from None
    config = copy.deepcopy(state["config"])
    arch_args = config.get("arch", {}).get("args", {})
    if arch_args.get("weights") is not None:
        # The pretrained weights the teacher's run started from: the checkpoint's own replace
        # them, so they are neither downloaded nor read (build.load_inference_model does so too).
        arch_args["weights"] = None
    teacher = ConfigParser(config, source=str(path)).init_obj("arch", arch_module)
    load_model_state(teacher, state, path, ema=use_averaged_weights(state, "auto"))
    teacher.requires_grad_(False)
    return teacher.eval(), list(state.get("class_names") or [])


def check_classes(
    path: str,
    teacher: torch.nn.Module,
    teacher_names: list[str],
    student: torch.nn.Module,
    data: BaseDataLoader,
) -> None:
    """Refuse a teacher that scores other classes than the student: the soft loss compares their
    scores class by class. Another number of them would fail deep inside kl_div at the first
    batch, naming neither network; other names, or the same in another order (ImageFolder sorts
    its folders), would train silently on the wrong targets."""
    teacher_count = getattr(teacher, "num_classes", None)
    student_count = getattr(student, "num_classes", None)
    if None not in (teacher_count, student_count) and teacher_count != student_count:
        raise ConfigValueError(
            f"teacher: {path} scores {teacher_count} classes, the student "
            f"(arch.args.num_classes) {student_count}; distil from a teacher trained on the "
            "same classes"
        )
    data_names = list(data.class_names())
    if teacher_names and data_names and teacher_names != data_names:
        pairs = enumerate(itertools.zip_longest(teacher_names, data_names))
        index, names = next((i, pair) for i, pair in pairs if pair[0] != pair[1])
        theirs, ours = ("none" if name is None else repr(name) for name in names)
        raise ConfigValueError(
            f"teacher: {path} was trained on other classes than this data's: class {index} is "
            f"{theirs} there, {ours} here; distil from a teacher trained on the same classes, "
            "in the same order"
        )
