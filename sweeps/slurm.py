"""--slurm: a SLURM job array with one trial per array task, in the conventions of
scripts/slurm.sbatch: SIGUSR1 two minutes before the time limit makes the trial save a
checkpoint, and the task requeues itself; the requeued task resumes the trial."""

import shlex
import subprocess
from pathlib import Path

from sweeps.space import SweepError

SCRIPT = """#!/bin/bash
# Sweep {name}: trial $SLURM_ARRAY_TASK_ID of {num_trials}, one per array task (written by sweep.py --slurm).
#
#   sbatch {script}        # sbatch options on the command line override those below
#
# Two minutes before the time limit SLURM sends SIGUSR1 to this batch shell; it passes the signal
# to sweep.py, which passes it to the trial's train.py: the trial saves a checkpoint, writes
# $requeue_file and exits 0, and this shell requeues the task. The requeued task runs the same
# command, which resumes the trial from its newest checkpoint (a finished trial is skipped).
#SBATCH --job-name=sweep-{name}
#SBATCH --array=0-{last}{limit}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
{gpus}#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={output}/slurm-%A_%a.out
set -euo pipefail
cd {cwd}

task=${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}
requeue_file={sweep_dir}/requeue-$task
rm -f "$requeue_file"  # left by this task's previous run: it has been requeued since

# A signal before sweep.py has started is passed on once it has; one before Python has set its
# handler kills it (exit 128 + USR1): the task is then requeued here, and resumes the trial.
trial="" stop_asked=0
forward_stop() {{
    echo "Time limit near: asking trial $SLURM_ARRAY_TASK_ID to save a checkpoint and stop."
    stop_asked=1
    if [[ -n $trial ]]; then kill -USR1 "$trial"; fi
}}
trap forward_stop USR1

{command} --trial "$SLURM_ARRAY_TASK_ID" --requeue-file "$requeue_file" &
trial=$!
if ((stop_asked)); then kill -USR1 "$trial"; fi

while :; do
    status=0
    wait "$trial" || status=$?
    # The trap cuts `wait` short (status > 128) while the trial is still saving: wait again.
    if ((status <= 128)) || ! kill -0 "$trial" 2>/dev/null; then
        break
    fi
done

if [[ -f $requeue_file ]]; then
    echo "Checkpoint saved: requeueing task $task."
elif ((stop_asked && status == 128 + $(kill -l USR1))); then
    echo "sweep.py was ended by the signal before it could hold it: requeueing task $task."
else
    exit "$status"
fi
rm -f "$requeue_file"
scontrol requeue "$task"
exit 0
"""


def job_script(
    *,
    name: str,
    sweep_dir: Path,
    command: list[str],
    num_trials: int,
    parallel: int | None,
    gpus: bool,
) -> str:
    """The batch script of the array: task i runs `command --trial i` (sweep.py)."""
    script = sweep_dir / "sweep.sbatch"
    return SCRIPT.format(
        name=name,
        num_trials=num_trials,
        script=shlex.quote(str(script)),
        last=num_trials - 1,
        limit="" if parallel is None else f"%{parallel}",  # at most K tasks at once
        gpus="#SBATCH --gpus-per-node=1\n" if gpus else "",
        # #SBATCH lines are not read by the shell: no quoting there.
        output=sweep_dir.resolve(),
        sweep_dir=shlex.quote(str(sweep_dir.resolve())),
        cwd=shlex.quote(str(Path.cwd())),
        command=shlex.join(command),
    )


def submit(script: Path) -> str:
    """sbatch the script; its answer, e.g. "Submitted batch job 4242"."""
    try:
        result = subprocess.run(["sbatch", str(script)], capture_output=True, text=True)
    except FileNotFoundError:
        raise SweepError(f"--submit: sbatch not found on PATH; submit {script} by hand") from None
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise SweepError(f"--submit: sbatch {script} failed: {reason}")
    return result.stdout.strip()
