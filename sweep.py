"""Hyper-parameter sweeps: train.py runs over a search space, ranked by the monitored metric.

python sweep.py -c configs/demo.json --grid optimizer.args.lr=[0.01,0.003,0.001]
python sweep.py -c configs/demo.json --random 8 --log-uniform optimizer.args.lr=1e-4,1e-2 \
    --choice data_loader.args.batch_size=[32,64] --parallel 2
python sweep.py -c configs/demo.json --optuna 20 --log-uniform optimizer.args.lr=1e-4,1e-1
python sweep.py -c configs/demo.json --grid optimizer.args.lr=[0.1,0.01] --slurm --submit

Running the same command again skips the finished trials and resumes the others.
"""

import argparse
import contextlib
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported in main(), after parsing, so that --help answers at once
    from sweeps.plan import Sweep
    from sweeps.signals import HeldSignal
    from sweeps.space import Trial


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run train.py over a search space.")
    add = parser.add_argument
    # fmt: off
    add("-c", "--config", required=True, help="the config every trial starts from")
    add("--name", help="the sweep's name: its folder is <save_dir>/sweeps/NAME (default: the "
        "config's name)")
    add("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
        help="override a config key in every trial, as train.py --set does (repeatable)")
    add("--grid", action="append", default=[], metavar="KEY.PATH=[V,...]",
        help="a grid dimension: every combination of the --grid lists runs (repeatable)")
    add("--random", type=int, metavar="N", help="N trials drawn at random from the space")
    add("--optuna", type=int, metavar="N", help="N trials picked by Optuna's TPE, with pruning")
    add("--uniform", action="append", default=[], metavar="KEY.PATH=LOW,HIGH",
        help="with --random/--optuna: a number drawn uniformly (repeatable)")
    add("--log-uniform", action="append", default=[], metavar="KEY.PATH=LOW,HIGH",
        help="with --random/--optuna: a number drawn uniformly on a log scale (repeatable)")
    add("--choice", action="append", default=[], metavar="KEY.PATH=[V,...]",
        help="with --random/--optuna: one of the listed values (repeatable)")
    add("--seed", type=int, default=0, help="seed of the random draws and of Optuna's sampler")
    add("--parallel", type=int, metavar="K",
        help="K trials at once: one per GPU, or K processes sharing the CPU (default 1)")
    add("--slurm", action="store_true", help="write a SLURM job array, one trial per task")
    add("--submit", action="store_true", help="with --slurm: submit the job array with sbatch")
    add("--trial", type=int, metavar="I", help="run trial I alone (what each array task runs)")
    add("--requeue-file", metavar="PATH",
        help="with --trial: passed on to train.py (the job array's requeue on a time limit)")
    # fmt: on
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from sweeps.signals import held_signals

    with held_signals() as held:  # first: SLURM's SIGUSR1 may come while torch is imported
        args = parse_args(argv)
        from logger import setup_logging
        from sweeps.plan import plan
        from utils import UserError

        setup_logging(None)  # the console; the sweep's info.log once its folder exists
        try:
            return run(args, plan(args), held)
        except UserError as error:  # before any trial runs: a bad flag, space or config
            print(f"error: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # a second Ctrl-C, passed on to the trials
            print("Interrupted at once (second signal): nothing more was saved.", file=sys.stderr)
            return 130


def run(args: argparse.Namespace, sweep: "Sweep", held: "HeldSignal") -> int:
    """Write the job array; or run the trials not done yet, K at once, and the summary.
    Returns 1 if a trial failed, 128 + the signal that stopped the sweep, else 0."""
    from logger import setup_logging
    from sweeps.results import check_definition, locked
    from sweeps.space import SweepError

    try:  # a trainer.save_dir under a file, or not writable: one line, not a traceback
        sweep.sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        message = f"{sweep.sweep_dir}: cannot make the sweep's folder ({error.strerror})"
        raise SweepError(message) from None
    check_definition(sweep.sweep_dir, sweep.definition, sweep.num_trials)
    if args.slurm:  # not over a sweep running here: its array tasks would run the same trials
        with locked(sweep.sweep_dir / ".lock", wait=False):
            return write_job(args, sweep)
    single = args.trial is not None  # array tasks run at the same time: no sweep-wide lock
    with contextlib.nullcontext() if single else locked(sweep.sweep_dir / ".lock", wait=False):
        setup_logging(None if single else sweep.sweep_dir)
        return run_trials_of(args, sweep, held)


def run_trials_of(args: argparse.Namespace, sweep: "Sweep", held: "HeldSignal") -> int:
    """The trials not finished (or pruned) yet, K at once, each recorded as it ends."""
    from sweeps.optuna_search import OptunaTrials
    from sweeps.results import (
        BASE_CONFIG,
        DONE,
        best_value,
        last_error,
        read_status,
        record_path,
        summarize_sweep,
        write_json,
        write_record,
    )
    from sweeps.runner import run_trials
    from sweeps.signals import stopped_task_code

    logger, folder = logging.getLogger("sweep"), sweep.sweep_dir
    parallel = 1 if args.trial is not None else args.parallel or 1
    study = None
    if sweep.method == "optuna":
        study = OptunaTrials(sweep)
        pending = iter(study.next_trial, None)
    else:
        chosen = sweep.trials if args.trial is None else [sweep.trials[args.trial]]
        pending = iter([trial for trial in chosen if read_status(folder, trial) not in DONE])
    listed = study.trials if study else lambda: sweep.trials  # Optuna's grow as it asks
    write_sweep_file(args, sweep, listed())
    # What the trials start from: the config as checked now, not the file, which may change.
    write_json(folder / BASE_CONFIG, sweep.base)
    starter = TrialStarter(args, sweep, parallel)
    logger.info(
        "Sweep %s: %d %s trials in %s, %d at once%s.",
        sweep.name,
        sweep.num_trials,
        sweep.method,
        folder,
        parallel,
        f" on GPUs {','.join(starter.gpus)}" if starter.gpus else "",
    )
    ended: list[str] = []

    def finish(trial: "Trial", status: str, code: int, seconds: float) -> None:
        run_dir = sweep.run_dir(trial)
        value, epoch = best_value(run_dir, sweep.key)
        # The record first: a sweep killed between the two leaves the trial running in the
        # study, which the next run resumes and records again (the other way round, the study
        # would hold it done and its missing record show it pending, unranked, for good).
        write_record(folder, trial, status=status, code=code, run_dir=run_dir)
        if study is not None:
            study.finish(trial, status, value)
        ended.append(status)
        if status == "failed":
            log_path, start = record_path(folder, trial, ".log"), starter.log_starts[trial.name]
            error = last_error(log_path, start, code)
            logger.warning("%s failed (exit code %d): %s", trial.name, code, error)
        else:
            at = f"at epoch {epoch}" if epoch is not None else "over all folds"
            best = "" if value is None else f": best {sweep.key} {value:.4g} {at}"
            logger.info("%s %s after %.0f s%s", trial.name, status, seconds, best)

    signum = run_trials(
        lambda: next(pending, None),
        starter.start,
        finish,
        parallel=parallel,
        on_epoch=study.on_epoch if study else None,
        requeue_file=starter.requeue_file,
        signum=held.signum,  # one that came while the sweep was planned: no trial starts
    )
    write_sweep_file(args, sweep, listed())
    summarize_sweep(sweep, listed())
    if (signum := signum or held.signum) is not None:  # or one while the summary was written
        logger.info("Stopped: the same command resumes the sweep.")
        if starter.requeue_file is None:
            return 128 + signum
        status = read_status(folder, sweep.trials[args.trial])
        return stopped_task_code(status, starter.requeue_file)
    return 1 if "failed" in ended or (study is not None and study.num_refused) else 0


class TrialStarter:
    """Starts a trial: `python train.py -c <sweep folder>/base_config.json --set <its values>
    --run-id trial-NNN` with the environment of its slot (its GPU, its share of the CPU
    threads). A process of its own, not train.main in this one: see sweeps/runner.py."""

    def __init__(self, args: argparse.Namespace, sweep: "Sweep", parallel: int) -> None:
        from sweeps.runner import visible_gpus

        self.args, self.sweep, self.parallel = args, sweep, parallel
        self.log_starts: dict[str, int] = {}  # trial name -> where this run's output begins
        self.requeue_file = Path(args.requeue_file) if args.requeue_file else None
        # An array task keeps the GPU SLURM gave it.
        device, n_gpu = sweep.base["device"], sweep.base["n_gpu"]
        self.gpus = [] if args.trial is not None else visible_gpus(device, n_gpu, os.environ)

    def start(self, trial: "Trial", slot: int) -> tuple[subprocess.Popen, Path]:
        from sweeps.results import BASE_CONFIG, record_path
        from sweeps.runner import (
            TRAIN_SCRIPT,
            available_cpus,
            start_process,
            trial_environment,
            wait_for_run_folder,
        )
        from sweeps.space import describe_values, set_flags

        values = {**trial.values, **self.sweep.sweep_values}
        command = [
            sys.executable,
            str(TRAIN_SCRIPT),
            "-c",
            str(self.sweep.sweep_dir / BASE_CONFIG),  # the file and --set, as checked
            *set_flags(values),
            "--run-id",
            trial.name,
        ]
        if self.requeue_file is not None:
            command += ["--requeue-file", str(self.requeue_file)]
        env = trial_environment(
            slot,
            parallel=self.parallel,
            gpus=self.gpus,
            num_cpus=available_cpus(),
            environ=os.environ,
        )
        run_dir, logger = self.sweep.run_dir(trial), logging.getLogger("sweep")
        wait_for_run_folder(trial, run_dir, logger)
        log_path = record_path(self.sweep.sweep_dir, trial, ".log")
        self.log_starts[trial.name] = log_path.stat().st_size if log_path.exists() else 0
        logger.info(
            "%s started: %s (output: %s)", trial.name, describe_values(trial.values), log_path
        )
        return start_process(command, env, log_path), run_dir


def write_sweep_file(args: argparse.Namespace, sweep: "Sweep", trials: list["Trial"]) -> None:
    """sweep.json: the definition, and each trial with its values and run folder."""
    from sweeps.results import write_json

    listed = [
        {"trial": trial.name, "values": trial.values, "run_dir": str(sweep.run_dir(trial))}
        for trial in trials
    ]
    write_json(
        sweep.sweep_dir / "sweep.json",
        {
            "name": sweep.name,
            "config": args.config,
            "set": args.set,
            "monitor": sweep.monitor,
            "num_trials": sweep.num_trials,
            "definition": sweep.definition,
            "trials": listed,
        },
    )


def write_job(args: argparse.Namespace, sweep: "Sweep") -> int:
    """--slurm: sweep.json and sweep.sbatch in the sweep folder; with --submit, sbatch it."""
    from sweeps.slurm import job_script, submit
    from utils.state.checkpoint import write_text_atomic

    write_sweep_file(args, sweep, sweep.trials)
    # The command that defines the sweep, plus --trial I in each array task.
    arguments = ["-c", args.config, "--name", sweep.name, "--seed", str(args.seed)]
    for flag in ("set", "grid", "uniform", "log_uniform", "choice"):
        arguments += [
            item for text in getattr(args, flag) for item in (f"--{flag.replace('_', '-')}", text)
        ]
    if args.random is not None:
        arguments += ["--random", str(args.random)]
    # One GPU a task, unless the config trains elsewhere ("cpu", "mps", "auto" with n_gpu 0).
    device, n_gpu = sweep.base["device"], sweep.base["n_gpu"]
    uses_gpu = device.startswith("cuda") or (device == "auto" and n_gpu > 0)
    script = sweep.sweep_dir / "sweep.sbatch"
    text = job_script(
        name=sweep.name,
        sweep_dir=sweep.sweep_dir,
        num_trials=sweep.num_trials,
        command=[sys.executable, str(Path(__file__).resolve()), *arguments],
        parallel=args.parallel,
        gpus=uses_gpu,
    )
    write_text_atomic(script, text)
    script.chmod(0o755)
    print(f"Wrote {script}: a job array of {sweep.num_trials} trials.")
    print(submit(script) if args.submit else f"Submit it with: sbatch {script}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
