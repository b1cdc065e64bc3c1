"""Copy this template into a new project folder, and later bring the template's newer commits
into that copy (docs/new-project.md).

    python new_project.py ../MyProject            # a copy, a git repository with one commit
    python new_project.py --lean ../MyProject     # without the optional parts (lean_copy.py)
    python new_project.py --update ../MyProject   # merge the template's changes since then

copier (https://copier.readthedocs.io) does both: it records the template's commit in the copy
(.copier-answers.yml) and an update merges three ways, keeping the copy's own edits; a true
conflict is left as conflict markers, never a silent overwrite. copier.yml lists what is not
copied (run outputs, data, caches, this script); environments are found by what they hold (a
pyvenv.cfg or conda-meta/), whatever their name.
"""

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path

ANSWERS = ".copier-answers.yml"
PROJECT_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")  # PEP 508
CONFLICT = re.compile(r"^<{7} ", re.MULTILINE)


class CopyError(Exception):
    """A one-line refusal: nothing in the target was changed."""


def is_environment(folder: Path) -> bool:
    """A virtual or conda environment: named by what is in it, not by its name (.venv-ci-floor,
    env311, ...). CI installs one beside the template while the tests copy it."""
    return (folder / "pyvenv.cfg").is_file() or (folder / "conda-meta").is_dir()


def environments(root: Path) -> list[str]:
    """Every environment under root, as copier exclude patterns (/path/from/root)."""
    found = []
    for directory, names, _ in os.walk(root):
        for name in list(names):
            if name == ".git" or is_environment(Path(directory) / name):
                names.remove(name)  # not walked into
                if name != ".git":
                    found.append("/" + (Path(directory) / name).relative_to(root).as_posix())
    return found


def git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    if shutil.which("git") is None:
        raise CopyError("git not found: install it (copies are git repositories, updates merge)")
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def template_commit(root: Path) -> str | None:
    """The template's commit (None: not a git repository), after a warning when it has
    uncommitted changes: they are copied, but an update can only start from a commit."""
    head = git("rev-parse", "HEAD", cwd=root)
    if head.returncode != 0:
        return None
    if git("status", "--porcelain", cwd=root).stdout.strip():
        print(f"warning: {root} has uncommitted changes: they are copied, but --update can only "
              "merge from the template's commits", file=sys.stderr)  # fmt: skip
    return head.stdout.strip()


def record_commit(root: Path, target: Path, commit: str | None) -> None:
    """From a template with uncommitted changes copier records the commit it makes in its own
    clone, which the template never has: the next --update could not start ("Unknown
    revision"). Record the template's HEAD instead; the uncommitted changes that were taken
    then count as the copy's own edits."""
    answers = target / ANSWERS
    recorded = re.search(r"(?m)^_commit: '?([^'\n]*)'?$", answers.read_text(encoding="utf-8"))
    if commit is None or recorded is None:
        return  # not from a git repository: no update starts from a commit
    known = git("rev-parse", "--verify", "--quiet", f"{recorded[1]}^{{commit}}", cwd=root)
    if known.returncode != 0:  # quoted: YAML must read it as text, whatever its digits
        text = answers.read_text(encoding="utf-8").replace(recorded[0], f"_commit: '{commit}'")
        answers.write_text(text, encoding="utf-8")


def lean_texts(root: Path, folder: Path, files: Iterable[str] = ()) -> dict[str, str]:
    """lean_copy.texts: the files a lean copy changes, with their new text; its ValueError (an
    edit that no longer applies) a one-line refusal."""
    import lean_copy

    try:
        return lean_copy.texts(root, folder, files)
    except ValueError as error:
        raise CopyError(str(error)) from None


# A copy's README section in place of new_project.py's (not in a copy): copier updates it.
UPDATING = """### Updating from the template

```bash
pip install copier                            # (requirements-extras.txt)
copier update --defaults --vcs-ref HEAD       # merge the template's newer commits into this copy
```

`.copier-answers.yml` records the template and commit this copy came from. Commit your work first:
the update keeps your edits, a true conflict left as markers: [docs/new-project.md](docs/new-project.md#updating-a-copy).
"""


def readme_in_a_copy(text: str) -> str:
    """The template's README as a copy has it: no command that runs new_project.py."""
    import lean_copy

    lines = text.splitlines(keepends=True)
    try:
        start, end = lean_copy.section(lines, "### new_project.py")
    except ValueError as error:
        raise CopyError(f"README.md: {error}; update new_project.readme_in_a_copy") from None
    text = "".join([*lines[:start], UPDATING, "\n", *lines[end:]])
    return text.replace(" new_project.py   the commands", "   the commands", 1)


def copy_template(
    root: Path, target: Path, project_name: str = "my-project", *, lean: bool = False
) -> None:
    """root's files into target (copier), less what copier.yml and `environments` leave out
    (and with `lean`, the optional parts: lean_copy.py)."""
    import copier  # only this script needs it

    if lean:  # refused before anything is written
        lean_texts(root, root)
    with warnings.catch_warnings():  # copier's own about a dirty template: template_commit's
        warnings.simplefilter("ignore", copier.errors.DirtyLocalWarning)
        copier.run_copy(
            str(root), target, data={"project_name": project_name, "lean": lean}, defaults=True,
            quiet=True, exclude=environments(root),
            vcs_ref="HEAD" if (root / ".git").exists() else None,
        )  # fmt: skip
    files = [path.relative_to(target).as_posix() for path in target.rglob("*")]
    for name, text in lean_texts(root, target, files).items() if lean else ():
        (target / name).write_text(text, encoding="utf-8")
    (target / "saved").mkdir(exist_ok=True)
    (target / "saved" / ".gitkeep").touch()
    # The copy is its own project: its name in the package metadata and the README's title
    # (the first line, "# PyTorch Template"), nowhere else.
    for name, pattern, replacement in (
        ("pyproject.toml", r'(?m)^name = ".*"$', f'name = "{project_name}"'),
        ("README.md", r"\A# .*$", f"# {project_name}"),
    ):
        if (target / name).is_file():
            text = (target / name).read_text(encoding="utf-8")
            text = re.sub(pattern, replacement, text, count=1, flags=re.MULTILINE)
            (target / name).write_text(text, encoding="utf-8")
    readme = target / "README.md"
    if readme.is_file() and "new_project.py" in readme.read_text(encoding="utf-8"):
        readme.write_text(readme_in_a_copy(readme.read_text(encoding="utf-8")), encoding="utf-8")


def first_commit(target: Path, commit: str | None) -> None:
    """Make the copy a git repository with one commit: copier's update merges into it."""
    identity = ["-c", "user.name=new_project.py", "-c", "user.email=new_project@localhost"]
    if git("config", "user.email", cwd=target).returncode == 0:
        identity = []  # the user's own
    version = f" at {commit[:12]}" if commit else ""
    for args in (["init", "-q"], ["add", "-A"],
                 [*identity, "commit", "-q", "-m", f"New project from the template{version}"]):  # fmt: skip
        result = git(*args, cwd=target)
        if result.returncode != 0:
            raise CopyError(f"{target}: git {args[-1]} failed: {result.stderr.strip()}")


def create(root: Path, target: Path, project_name: str, *, lean: bool) -> None:
    """The copy, made in a hidden folder beside `target` and renamed to it once whole: a failure
    or an interrupt midway leaves no half copy (files, no commit) that a rerun or --update would
    take for a project. `target` is new or an empty folder (main)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    )
    try:
        commit = template_commit(root)
        copy_template(root, staging, project_name, lean=lean)
        record_commit(root, staging, commit)
        first_commit(staging, commit)
        staging.replace(target)  # one rename; POSIX replaces an empty folder
    except OSError as error:  # a full disk, a permission: one line, nothing left
        shutil.rmtree(staging, ignore_errors=True)
        raise CopyError(f"{target}: the copy failed, nothing was kept: {error}") from None
    except BaseException:  # CopyError, Ctrl-C, a bug: also nothing left, and raised as it is
        shutil.rmtree(staging, ignore_errors=True)
        raise


def changed_files(target: Path) -> list[str]:
    """The copy's changed and new files, named from it: its own alone where it is a folder of a
    larger repository, whose root git names them from (a conflict went unseen)."""
    prefix = git("rev-parse", "--show-prefix", cwd=target).stdout.strip()
    # -z: names as they are (plain --porcelain quotes one with a space or a non-ASCII letter, and
    # a conflict in it went unseen); a rename's entry is followed by its old name.
    fields = git("status", "--porcelain", "-z", "--untracked-files=all", "--", ".", cwd=target)
    changed, entries = [], iter(fields.stdout.split("\0"))
    for entry in filter(None, entries):
        changed.append(entry[3:].removeprefix(prefix))
        if entry[0] in "RC":
            next(entries)  # the old name
    return changed


def deleted_but_changed(root: Path, target: Path, last: str, commit: str | None) -> list[str]:
    """Files the copy deleted (its own: --relative) that the template changed since `last`: the
    deletion stands, as copier leaves it, and the user is told of the change it dropped."""
    diff = ["--name-only", "--no-renames", "-z", "--relative"]  # a rename: a deletion too
    changed = git("diff", *diff, last, str(commit), "--", ".", cwd=root).stdout.split("\0")
    gone = git("log", *diff, "--diff-filter=D", "--pretty=format:", cwd=target).stdout.split("\0")
    return sorted(n for n in set(changed) & set(gone) if n and not (target / n).exists())


def update(root: Path, target: Path) -> int:
    """Merge the template's commits since the copy's into it; 1 when conflicts are left."""
    import copier
    import yaml  # copier's own dependency

    answers = target / ANSWERS
    if not answers.is_file():
        raise CopyError(f"{target}: no {ANSWERS}; only a copy made by new_project.py updates")
    try:  # YAML: a path may be written quoted
        last = yaml.safe_load(answers.read_text()) or {}
        recorded = last.get("_src_path")
    except (yaml.YAMLError, AttributeError):
        raise CopyError(f"{target}: {ANSWERS} is not copier's answers file") from None
    if not isinstance(recorded, str) or Path(recorded).resolve() != root:
        source = recorded or "unknown"
        raise CopyError(f"{target}: copied from {source}, not {root}; run that template's "
                        f"new_project.py, or set _src_path in {ANSWERS} and commit")  # fmt: skip
    if changed_files(target):
        raise CopyError(f"{target}: uncommitted changes; commit them first (an update merges)")
    commit = template_commit(root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", copier.errors.DirtyLocalWarning)
            copier.run_update(target, defaults=True, overwrite=True, skip_answered=True,
                              conflict="inline", quiet=True, vcs_ref="HEAD")  # fmt: skip
    except Exception as error:  # copier's errors: a one-line refusal
        raise CopyError(f"{target}: copier update failed: {error}") from None
    record_commit(root, target, commit)
    changed = changed_files(target)
    conflicts = [
        name for name in changed
        if (target / name).is_file() and CONFLICT.search((target / name).read_text(errors="replace"))
    ]  # fmt: skip
    summary = f"Updated {target}: {len(changed)} file(s) changed"
    deleted = deleted_but_changed(root, target, str(last.get("_commit")), commit)
    kept = f"; the template changed {len(deleted)} you deleted, left deleted: " if deleted else ""
    kept += ", ".join(deleted)
    if conflicts:
        print(f"{summary}, {len(conflicts)} with conflicts to resolve (<<<<<<< markers): "
              f"{', '.join(conflicts)}{kept}", file=sys.stderr)  # fmt: skip
        return 1
    print(f"{summary}, no conflicts{kept}. Review with git diff, then commit.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Copy this template into a new project folder.")
    parser.add_argument("target", help="folder to create, e.g. ../MyProject")
    parser.add_argument("--update", action="store_true",
                        help="merge this template's newer commits into the copy TARGET")  # fmt: skip
    parser.add_argument("--name", help="the project's name (default: the folder's name)")
    parser.add_argument("--lean", action="store_true",
                        help="leave out the optional parts: benchmarks, sweeps, the worked "
                        "examples of other tasks (docs/new-project.md)")  # fmt: skip
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent
    target = Path(args.target).resolve()
    try:
        if importlib.util.find_spec("copier") is None:
            raise CopyError("new_project.py needs copier: pip install copier")
        if args.update:
            return update(root, target)
        if target.is_relative_to(root):  # the template itself too, or a link to it
            raise CopyError(f"{target}: must be outside the template ({root})")
        if target.exists() and not target.is_dir():
            raise CopyError(f"{target}: is a file, not a folder")
        if target.exists() and any(target.iterdir()):
            raise CopyError(f"{target}: already exists and is not empty")
        name = target.name if args.name is None else args.name  # --name '' is refused
        if not PROJECT_NAME.fullmatch(name):
            raise CopyError(f"{name!r}: not a project name (letters, digits, '.', '_', '-'); "
                            "pass --name")  # fmt: skip
        create(root, target, name, lean=args.lean)
    except CopyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"New project in {target}. Next: cd {target} && python train.py -c configs/demo.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
