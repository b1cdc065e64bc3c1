"""Copy this template into a new project folder.

    python new_project.py ../MyProject

Copies everything except run outputs (saved/), data, caches, virtual environments (any folder
with a pyvenv.cfg or conda-meta/, whatever its name), .git and this script itself. The copy runs
its own tests and demo unchanged.
"""

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

# Names skipped wherever they appear, and top-level paths skipped only at the root.
IGNORED_NAMES = {
    ".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".import_linter_cache",
    ".venv", "venv",
}  # fmt: skip
IGNORED_AT_ROOT = {"saved", "data", "new_project.py"}


def is_environment(folder: Path) -> bool:
    """A virtual or conda environment: named by what is in it, not by its name (.venv-ci-floor,
    env311, ...). CI installs one beside the template while the tests copy it."""
    return (folder / "pyvenv.cfg").is_file() or (folder / "conda-meta").is_dir()


def ignore(root: Path) -> Callable[[str, list[str]], set[str]]:
    def ignored(directory: str, names: list[str]) -> set[str]:
        skipped = {
            name
            for name in names
            if name in IGNORED_NAMES
            or name.endswith((".pyc", ".egg-info"))
            or is_environment(Path(directory) / name)
        }
        if Path(directory).resolve() == root:
            skipped |= IGNORED_AT_ROOT & set(names)
        return skipped

    return ignored


def copy_template(root: Path, target: Path) -> None:
    """root's files into target, less what `ignore` skips; an empty saved/ for the runs."""
    shutil.copytree(root, target, ignore=ignore(root), dirs_exist_ok=True)
    (target / "saved").mkdir(exist_ok=True)
    (target / "saved" / ".gitkeep").touch()


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
    copy_template(root, target)
    print(f"New project in {target}. Next: cd {target} && python train.py -c configs/demo.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
