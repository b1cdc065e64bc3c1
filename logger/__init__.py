"""Logging setup, and the loggers that record a run's metrics (trainer.loggers)."""

from logger.experiment_logger import ExperimentLogger, RunInfo, ScalarLogger
from logger.logger import setup_logging
from logger.loggers import Loggers, check_logger_packages, open_loggers, selected_loggers
from logger.visualization import TensorboardLogger

__all__ = [
    "ExperimentLogger",
    "Loggers",
    "RunInfo",
    "ScalarLogger",
    "TensorboardLogger",
    "check_logger_packages",
    "open_loggers",
    "selected_loggers",
    "setup_logging",
]
