"""The machinery under the engine, grouped by the question it answers (none of it is edited
for a new task; what users edit is model/, data_loader/, trainer/ and configs/):

  state/        how a run is resumed and where its files go: checkpoints, the timeline, resume
  distributed/  which device, how many processes: the process group, collectives, devices
  config/       how a config becomes checked values (with parse_config.py, config_schema.py)
  data/         what batches, in which order: samplers, the epoch's batches, the data summary
  evaluation/   how results are counted: metric sums, the confusion matrix, the monitor
  optim/        how the optimizer moves: parameter groups, schedules, the weight average
  util.py, timing.py   small helpers anyone may use (errors, seeding, RNG state, timing)

Imports run one way (.importlinter): entry scripts and build.py, then trainer/, model/,
data_loader/, then base/, logger/, then the packages above in the order listed, then
parse_config.py and config/, then the helpers here.
"""

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
    "seed_everything",
    "set_rng_state",
    "unwrap_model",
]
