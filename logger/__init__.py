"""Logging setup and the TensorBoard writer."""

from logger.logger import setup_logging
from logger.visualization import TensorboardWriter

__all__ = ["TensorboardWriter", "setup_logging"]
