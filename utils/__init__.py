"""Small helpers shared by train.py, test.py and the trainer."""

from utils.checkpoint import load_checkpoint, save_checkpoint
from utils.util import (
    ConfigValueError,
    UserError,
    amp_dtype,
    configure_torch,
    derive_seed,
    describe_error,
    get_rng_state,
    seed_everything,
    set_rng_state,
    unwrap_model,
)

__all__ = [
    "ConfigValueError",
    "UserError",
    "amp_dtype",
    "configure_torch",
    "derive_seed",
    "describe_error",
    "get_rng_state",
    "load_checkpoint",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
    "unwrap_model",
]
