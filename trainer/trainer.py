"""The task: what one training step and one validation step compute. Edit these.

The engine (base/base_trainer.py) hands each step a batch already on the device, inside
autocast, and does the rest: the backward pass, accumulation, the optimizer and schedule, DDP,
the metric sums, logging, checkpoints. Every metric in config["metrics"] is called as
metric(output, target) on what the step returns. A step needs something else (a teacher
network, an extra loss)? Subclass Trainer and name the subclass in trainer.type, as
trainer/distillation.py does.
"""

from typing import Any

import torch
import torchvision

from base import BaseTrainer, StepOutput
from base.base_model import model_summary
from data_loader.transforms import batch_mixing
from utils import unwrap_model
from utils.data.batches import has_length, num_samples
from utils.data.data_summary import log_data_summary


class Trainer(BaseTrainer):
    """Supervised learning on (input, target) batches: classification with the shipped configs
    (logits, class indices), and any other task whose loss and metrics take (output, target),
    e.g. denoising images (configs/denoise.json)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        num_classes = getattr(unwrap_model(self.model), "num_classes", None)
        # A classifier's labels must fit its outputs: refused here, before anything is written.
        self.data.check(num_classes)
        # MixUp / CutMix (config batch_mixing); no_mixing, which changes nothing, when off.
        self.mix = batch_mixing(num_classes, **self.config["batch_mixing"])

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> StepOutput:
        inputs, targets = batch  # images (B, C, H, W); class indices (B,) or any target
        # MixUp / CutMix: mixed images and soft targets (B, num_classes); unchanged when off.
        mixed_inputs, mixed_targets = self.mix(inputs, targets)
        output = self.model(mixed_inputs)  # logits (B, num_classes), or what the model makes
        loss = self.criterion(output, mixed_targets)  # the batch's mean
        # The metrics compare with the original labels: training accuracy stays a share of
        # right answers.
        return StepOutput(loss=loss, output=output, target=targets)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> StepOutput:
        # Unmixed; the engine runs it in evaluation mode, without gradients.
        inputs, targets = batch
        output = self.model(inputs)
        return StepOutput(loss=self.criterion(output, targets), output=output, target=targets)

    def on_train_start(self) -> None:
        """Log the model and the data; show the loggers that take images what the model sees."""
        model = unwrap_model(self.model)
        self.logger.info("%s", model_summary(model))  # verbosity 2: the whole module tree
        self.logger.debug("%s", model)
        geometry = self.geometry  # the global batch, and what it is made of
        self.logger.info(
            "Data: %s training samples, %s validation samples, %s; %d batches per epoch. "
            "Global batch %d = %d per process x %d process(es) x %d accumulated, on %s.",
            num_samples(self.train_loader),
            num_samples(self.val_loader) if self.val_loader is not None else 0,
            f"{len(self.data.class_names())} classes" if self.data.class_names() else "no classes",
            self.len_epoch,
            geometry["global_batch"],
            geometry["batch_size"],
            geometry["world_size"],
            geometry["grad_accum_steps"],
            self.device,
        )
        if self.rank == 0:  # the data of all ranks together: logged once
            log_data_summary(self.data, self.logger, self.start_epoch, self.train_loader.sampler)
        self.logger.info("Outputs: %s and %s", self.checkpoint_dir, self.config.log_dir)
        # Logged when the run starts, not again when it resumes.
        fresh = self.global_step == 0
        if not fresh or not self.loggers.takes_images or not has_length(self.train_loader.dataset):
            return
        # One grid of (de-normalised) training inputs. Augmenting them draws random numbers:
        # fork the RNG so that the run's own stream is untouched.
        dataset = self.train_loader.dataset
        with torch.random.fork_rng(devices=[]):
            samples = [dataset[index] for index in range(min(32, len(dataset)))]
        inputs = [item[0] if isinstance(item, tuple | list) else item for item in samples]
        # Only images (C, H, W) of one shape stack into a grid: not rows of features, nor
        # sequences of unequal length, nor inputs that are not one tensor.
        if not all(is_image(item, len(self.data.mean)) for item in inputs) or (
            len({item.shape for item in inputs}) != 1
        ):
            self.logger.info("No TensorBoard input grid: the inputs are not images of one shape.")
            return
        images = torch.stack(inputs)  # (B, C, H, W)
        mean = torch.tensor(self.data.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.data.std).view(1, -1, 1, 1)
        grid = torchvision.utils.make_grid((images * std + mean).clamp(0, 1), nrow=8)
        self.loggers.log_image("train/inputs", grid, self.global_step)


def is_image(item: Any, num_channels: int) -> bool:
    """Whether a sample's input is an image the grid can show: a float tensor (C, H, W)."""
    return (
        isinstance(item, torch.Tensor)
        and item.is_floating_point()
        and item.dim() == 3
        and item.shape[0] == num_channels
    )
