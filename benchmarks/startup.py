"""Start-up cost of train.py: `python train.py --help` against `python -c "import torch"`.

What is measured: the wall time of each command run as a fresh subprocess (the interpreter's own
start included), N times each, interleaved (the first of each pair alternating) so that load from
other processes hits both alike. train.py imports torch only after parsing its arguments, so
--help should cost no more than importing torch (goal: ratio <= 1.5). Printed: every time, the
median of each and the ratio of the medians.

python benchmarks/startup.py [--repeats 7]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "train.py --help": [sys.executable, "train.py", "--help"],
    "import torch": [sys.executable, "-c", "import torch"],
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs of each command (default 7)")
    return parser.parse_args()


def time_command(command: list[str]) -> float:
    """Wall seconds of one run of `command` from the repository root; it must succeed."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the same for both: no GPU probing
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    names = list(COMMANDS)
    for name in names:  # warm-up, untimed: the file system cache, .pyc files
        time_command(COMMANDS[name])
    times: dict[str, list[float]] = {name: [] for name in names}
    print(f"{'repeat':>6}  " + "  ".join(f"{name:>16}" for name in names))
    for repeat in range(args.repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            times[name].append(time_command(COMMANDS[name]))
        print(f"{repeat + 1:>6}  " + "  ".join(f"{times[name][-1]:>15.3f}s" for name in names))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{'median':>6}  " + "  ".join(f"{medians[name]:>15.3f}s" for name in names))
    ratio = medians["train.py --help"] / medians["import torch"]
    print(f"ratio train.py --help / import torch: {ratio:.3f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
