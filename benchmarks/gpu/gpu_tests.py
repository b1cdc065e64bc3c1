"""Run test files with pytest in this process and judge what happened, for gpu_check.sh.

Prints `figure: passed P, failed F, skipped S` and exits 0 only when no test failed or errored,
at least one passed, and every skip's reason contains one of the --allow-skip texts: on a GPU
machine a test skipped for "needs a CUDA device" is a failure of the check, not a pass.

python benchmarks/gpu/gpu_tests.py [-m gpu] [--allow-skip TEXT ...] FILE...
"""

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Outcomes:
    """A pytest plugin that keeps each test's outcome (and the reason of each skip)."""

    def __init__(self) -> None:
        self.passed: list[str] = []
        self.failed: list[str] = []
        self.skipped: dict[str, str] = {}  # test id -> reason

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:  # in setup, call or teardown
            self.failed.append(report.nodeid)
        elif report.skipped:
            # longrepr (path, line, "Skipped: <reason>") for a skip mark or pytest.skip().
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.skipped[report.nodeid] = reason.removeprefix("Skipped: ")
        elif report.when == "call":
            self.passed.append(report.nodeid)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # a file that does not import counts as a failure
            self.failed.append(report.nodeid)


def judge(outcomes: Outcomes, exit_code: int, allowed_skips: list[str]) -> tuple[str, bool]:
    """(the figure, whether it passes)."""
    refused = {
        test: reason
        for test, reason in outcomes.skipped.items()
        if not any(text in reason for text in allowed_skips)
    }
    figure = (
        f"passed {len(outcomes.passed)}, failed {len(outcomes.failed)}, "
        f"skipped {len(outcomes.skipped)}"
    )
    if refused:
        figure += f" ({len(refused)} not allowed: {sorted(set(refused.values()))[0]})"
    # Exit codes 0 (all passed) and 1 (some failed) are judged by the counts; the others
    # (interrupted, internal error, usage error, nothing collected) fail the check as such.
    ok = exit_code in (0, 1) and outcomes.passed and not outcomes.failed and not refused
    return figure, bool(ok)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="test files")
    parser.add_argument("-m", "--marker", help="run only the tests with this mark expression")
    parser.add_argument(
        "--allow-skip", action="append", default=[], metavar="TEXT",
        help="a skip whose reason contains TEXT does not fail the check (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    outcomes = Outcomes()
    pytest_args = ["-q", "-rfEs", "-p", "no:cacheprovider", *args.files]
    if args.marker:
        pytest_args += ["-m", args.marker]
    exit_code = int(pytest.main(pytest_args, plugins=[outcomes]))
    for test in outcomes.failed:
        print(f"failed: {test}")
    figure, ok = judge(outcomes, exit_code, args.allow_skip)
    print(f"figure: {figure}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
