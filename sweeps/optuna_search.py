"""--optuna N: Optuna's TPE sampler picks each trial's values from the trials before it, and its
median pruner stops a trial whose monitored metric falls behind the others' at the same epoch.

Each trial is still `python train.py ...` in a process of its own (see sweep_runner). The
per-epoch values pruning needs are read from the trial's checkpoint-epoch<N>.pth files as they
appear (the sweep sets trainer.save_period to 1; a cross-validated trial's from fold-0/, its
first fold): each is renamed into place complete and holds
its epoch's metrics, so no hook inside the training process is needed and what Optuna sees is
exactly what the run saved. A pruned trial gets SIGTERM: train.py saves a checkpoint and exits.

The study is kept in <sweep folder>/optuna.db (SQLite), so that a stopped sweep goes on with the
same study: a trial still marked running there continues in its run folder.
"""

import importlib.util
import json
import logging
import math
from typing import TYPE_CHECKING, Any

from sweeps.space import Dimension, SweepError, Trial
from utils.util import UserError, derive_seed

if TYPE_CHECKING:
    from sweeps.plan import Sweep

REPEATS = "repeats"  # user attribute of a trial whose values an earlier one had: its number


def require_optuna() -> None:
    """A SweepError naming the package when optuna is not installed."""
    if importlib.util.find_spec("optuna") is None:
        raise SweepError("--optuna: needs the optuna package (pip install optuna)")


class OptunaTrials:
    """The trials of an Optuna study, handed to sweep_runner.run_trials one at a time."""

    def __init__(self, sweep: "Sweep") -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep logs each trial itself
        self.optuna, self.dimensions, self.key = optuna, sweep.dimensions, sweep.key
        self.num_trials = sweep.num_trials
        storage = f"sqlite:///{(sweep.sweep_dir / 'optuna.db').resolve()}"
        try:
            num_before = len(optuna.load_study(study_name=sweep.name, storage=storage).trials)
        except KeyError:  # a new study
            num_before = 0
        self.study = optuna.create_study(
            storage=storage,
            study_name=sweep.name,
            load_if_exists=True,
            direction="maximize" if sweep.mode == "max" else "minimize",
            # The sampler's random stream starts afresh in each run of the sweep: seeded by
            # --seed alone, a resumed study would draw the values of its first trials again.
            sampler=optuna.samplers.TPESampler(seed=derive_seed(sweep.seed, num_before) % 2**32),
            pruner=optuna.pruners.MedianPruner(),
        )
        running = optuna.trial.TrialState.RUNNING
        # Left running by a sweep that was stopped (or killed): they continue where they were.
        self.resumable = [trial for trial in self.study.trials if trial.state == running]
        self.active: dict[int, Any] = {}  # trial number -> optuna.trial.Trial
        self.check = sweep.parser  # the trial's validated config, or a UserError
        self.num_refused = 0  # trials failed in this run because the config refuses them
        self.reported: dict[int, set[int]] = {}  # trial number -> epochs reported

    def next_trial(self) -> Trial | None:
        """A trial to continue, else a new one while the study has fewer than num_trials.

        Only the ends of each range were checked before the sweep: a trial whose values the
        config refuses fails in the study, without starting, and the next one is asked for."""
        while (found := self._next()) is not None:
            optuna_trial, values = found
            trial = Trial(optuna_trial.number, values)
            refusal = self._refusal(trial)
            if refusal is None:
                self.active[trial.index] = optuna_trial
                return trial
            self.study.tell(optuna_trial, state=self.optuna.trial.TrialState.FAIL)
            self.num_refused += 1
            logging.getLogger("sweep").warning("%s failed, not started: %s", trial.name, refusal)
        return None

    def _next(self) -> tuple[Any, dict[str, Any]] | None:
        """The next trial to continue or to ask for, and its values; None once there are N."""
        while self.resumable:
            frozen = self.resumable.pop(0)
            values = self._decode(frozen.params)
            if values is None:  # stopped between asking and suggesting: nothing ran
                self.study.tell(frozen.number, state=self.optuna.trial.TrialState.FAIL)
                continue
            # Optuna has no public way to re-attach to a running trial: this is the
            # constructor study.ask() itself uses.
            trial = self.optuna.trial.Trial(self.study, frozen._trial_id)
            self.reported[frozen.number] = set(frozen.intermediate_values)
            return trial, values
        while len(self.study.trials) < self.num_trials:
            trial = self.study.ask()
            self.reported[trial.number] = set()
            values = {
                dimension.key: self._suggest(trial, dimension) for dimension in self.dimensions
            }
            if not self._reused(trial, values):
                return trial, values
        return None

    def _reused(self, trial: Any, values: dict[str, Any]) -> bool:
        """Whether the sampler asked again for the values of a trial that has ended (TPE does,
        on a space of choices): every trial trains with the config's seed, so it would be the
        same run again. It gets that trial's result instead, counts toward N, and runs nothing."""
        states = self.optuna.trial.TrialState
        for earlier in self.study.get_trials(
            deepcopy=False, states=(states.COMPLETE, states.PRUNED)
        ):
            if earlier.number != trial.number and self._decode(earlier.params) == values:
                trial.set_user_attr(REPEATS, earlier.number)
                if earlier.state == states.COMPLETE:
                    self.study.tell(trial, earlier.value)
                else:
                    self.study.tell(trial, state=earlier.state)
                name, again = Trial(earlier.number, values).name, Trial(trial.number, values).name
                logging.getLogger("sweep").info(
                    "%s: the values of %s again (the same run): its result counts, nothing runs",
                    again,
                    name,
                )
                return True
        return False

    def _refusal(self, trial: Trial) -> str | None:
        """Why the project's validation refuses the trial's config, or None."""
        try:
            self.check(trial)
        except UserError as error:
            return str(error)
        return None

    def _suggest(self, trial: Any, dimension: Dimension) -> Any:
        if dimension.kind == "choice":
            # Optuna's categories must be plain scalars: a list (e.g. layer widths) goes as JSON.
            encoded = [json.dumps(value) for value in dimension.values]
            return json.loads(trial.suggest_categorical(dimension.key, encoded))
        low, high = dimension.values
        return trial.suggest_float(dimension.key, low, high, log=dimension.kind == "log_uniform")

    def _decode(self, params: dict[str, Any]) -> dict[str, Any] | None:
        if set(params) != {dimension.key for dimension in self.dimensions}:
            return None
        return {
            dimension.key: json.loads(params[dimension.key])
            if dimension.kind == "choice"
            else params[dimension.key]
            for dimension in self.dimensions
        }

    def on_epoch(self, trial: Trial, epoch: int, metrics: dict) -> bool:
        """Report the epoch's monitored value; True when the pruner says stop."""
        value = metrics.get(self.key)
        if value is None or not math.isfinite(value) or epoch in self.reported[trial.index]:
            return False
        self.reported[trial.index].add(epoch)
        optuna_trial = self.active[trial.index]
        optuna_trial.report(float(value), epoch)
        return optuna_trial.should_prune()

    def finish(self, trial: Trial, status: str, best: float | None) -> None:
        """Tell the study how the trial ended; an interrupted one stays running, to continue."""
        states = self.optuna.trial.TrialState
        optuna_trial = self.active.pop(trial.index)
        if status == "finished" and best is not None and math.isfinite(best):
            self.study.tell(optuna_trial, best)
        elif status == "pruned":
            self.study.tell(optuna_trial, state=states.PRUNED)
        elif status != "interrupted":  # failed, or finished without a monitored value
            self.study.tell(optuna_trial, state=states.FAIL)

    def trials(self) -> list[Trial]:
        """Every trial of the study so far with its values, less those the config refuses and
        the repeats of an earlier trial (they have no run folder)."""
        found = []
        for frozen in self.study.trials:
            if REPEATS in frozen.user_attrs:  # another trial's result: no run folder of its own
                continue
            values = self._decode(frozen.params)
            if values is not None and self._refusal(Trial(frozen.number, values)) is None:
                found.append(Trial(frozen.number, values))
        return found
