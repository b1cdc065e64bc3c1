"""TensorBoard event files in the run's log folder."""

from pathlib import Path

import torch

from logger.experiment_logger import ScalarLogger


class TensorboardLogger(ScalarLogger):
    """A thin wrapper over SummaryWriter.

    TensorBoard is imported only when this logger is opened: it adds about a second to start-up.
    """

    name = "tensorboard"
    takes_images = True

    def __init__(self, log_dir: Path, start_step: int | None = None) -> None:
        """start_step: where training starts (its global step); None adds to a run's logs
        (test.py's images) and hides none of them."""
        from torch.utils.tensorboard import SummaryWriter

        # TensorBoard hides the events at steps from purge_step on that earlier event files of
        # this folder hold: what a run cut short logged after the checkpoint it resumes from (or
        # another timeline logged after it). Every step then shows once. Only a training run
        # may: test.py's purge_step would hide every step of the curves after its checkpoint's.
        purge_step = None if start_step is None else start_step + 1
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def log_image(self, tag: str, image: torch.Tensor, step: int) -> None:
        self.writer.add_image(tag, image, step)

    def close(self, *, finished: bool) -> None:
        self.writer.close()
