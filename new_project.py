"""Copy this template into a new project folder.

    python new_project.py ../MyProject

Copies everything except run outputs (saved/), data, caches, virtual environments, .git and
this script itself. The copy runs its own tests and demo unchanged.
"""

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

# Names skipped wherever they appear, and top-level paths skipped only at the root.
IGNORED_NAMES = {
    ".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".venv", ".venv-ci", "venv"
}  # fmt: skip
IGNORED_AT_ROOT = {"saved", "data", "new_project.py"}


def ignore(root: Path) -> Callable[[str, list[str]], set[str]]:
    def ignored(directory: str, names: list[str]) -> set[str]:
        skipped = {name for name in names if name in IGNORED_NAMES or name.endswith(".pyc")}
        if Path(directory).resolve() == root:
            skipped |= IGNORED_AT_ROOT & set(names)
        return skipped

    return ignored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Copy this template into a new project folder.")
    parser.add_argument("target", help="folder to create, e.g. ../MyProject")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent
    target = Path(args.target).resolve()
    if target.exists() and any(target.iterdir()):
        print(f"error: {target}: already exists and is not empty", file=sys.stderr)
        return 2
    if target.is_relative_to(root):
        print(f"error: {target}: must be outside the template ({root})", file=sys.stderr)
        return 2
    shutil.copytree(root, target, ignore=ignore(root), dirs_exist_ok=True)
    (target / "saved").mkdir(exist_ok=True)
    (target / "saved" / ".gitkeep").touch()
    print(f"New project in {target}. Next: cd {target} && python train.py -c configs/demo.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
