"""README.md stays short, and it and docs/ stay true to the code: links resolve, every flag of
the entry points and of the benchmarks the docs name is documented, every flag a documented
command passes exists, files they name exist, the step they show is the real one."""

import functools
import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, run_script

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250

# [text](target): the target up to ")" or a space (a title may follow).
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)[^)]*\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
# Project files named in prose or commands, e.g. configs/denoise.json, tests/test_examples.py.
FOLDERS = "configs|scripts|benchmarks|tests|model|trainer|base|utils|data_loader|logger|docs"
SCRIPTS = "train|test|predict|export|new_project|parse_config|config_schema"
PROJECT_FILE = re.compile(
    rf"(?<![\w./-])((?:(?:{FOLDERS})/[\w./-]+|{SCRIPTS})"
    r"\.(?:py|json|sh|sbatch|md|yml))(?![\w/-])"
)


def prose(text: str) -> str:
    """`text` without its fenced code blocks (a `# comment` there is not a heading)."""
    return FENCE.sub("", text)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of `page`: lower case, punctuation dropped, spaces
    as hyphens, and -1, -2, ... for repeats."""
    seen: dict[str, int] = {}
    for heading in HEADING.findall(prose(page.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def documented_text() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in PAGES)


def test_readme_fits_in_a_head():
    num_lines = len(README.read_text(encoding="utf-8").splitlines())
    assert num_lines <= MAX_README_LINES, f"README.md has {num_lines} lines; move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, broken


ENTRY_POINTS = ["train.py", "test.py", "predict.py", "export.py", "sweep.py", "tune.py"]
# `<script>.py <arguments>` in a command or prose, up to a comment, pipe, redirect or the end.
COMMAND = re.compile(r"(?<![\w/.-])((?:\w+/)*\w+\.py)((?:[ \t]+(?![#|&;>(]|\$)[^\s`]+)*)")
# With the other scripts with options the docs run as `python <script>.py` (benchmarks,
# new_project.py), as far as they are there (a lean copy leaves out some).
RUN = sorted(set(re.findall(r"python ((?:\w+/)*\w+\.py)", documented_text())) - set(ENTRY_POINTS))
SCRIPTS = ENTRY_POINTS + [
    name for name in RUN if (ROOT / name).is_file() and "argparse" in (ROOT / name).read_text()
]
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


# Each script's real `--help`, as `python <script> --help` runs it (its folder first on sys.path,
# run as __main__), but all in one interpreter: one process per script cost about 2-4 s each.
HELP_ALL = """
import contextlib, io, json, os, runpy, sys, traceback
helps = {}
for script in sys.argv[1:]:
    sys.argv, out = [script, "--help"], io.StringIO()
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exit:
            code = exit.code or 0
        except Exception:  # a broken script: its traceback, and the others still run
            code = 1
            out.write(traceback.format_exc())
    del sys.path[0]
    helps[script] = [code, out.getvalue()]
print(json.dumps(helps))
"""


@functools.cache  # one interpreter for every script's --help, per session
def all_help() -> dict[str, tuple[int, str]]:
    """{script: (exit code, stdout)} of `--help` for every script of SCRIPTS."""
    result = run_script("-c", HELP_ALL, *SCRIPTS)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def help_flags(script: str) -> set[str]:
    """The options `python <script> --help` lists, but -h and --help."""
    code, stdout = all_help()[script]
    assert code == 0, stdout
    # Option lines of argparse's help: "  -c CONFIG, --config CONFIG   help text".
    flags = set()
    for line in stdout.splitlines():
        if line.startswith("  -"):
            invocation = re.split(r"\s{2,}", line.strip())[0]
            flags.update(FLAG.findall(invocation))
    return flags - {"-h", "--help"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_is_documented(script):
    flags = help_flags(script)
    # The parsing above found the options (config_schema.py takes a path only).
    assert flags or script not in ENTRY_POINTS
    text = documented_text()
    missing = sorted(flag for flag in flags if not re.search(rf"(?<![\w-]){flag}(?![\w-])", text))
    assert not missing, f"{script} flags not in README.md or docs/*.md: {missing}"


def commands_flags() -> dict[str, set[str]]:
    """{script: the flags README.md and docs/*.md pass to it in a command}."""
    used: dict[str, set[str]] = {}
    for page in PAGES:
        # A command continued over lines (a trailing backslash) is one command.
        text = re.sub(r"\\\n\s*", " ", page.read_text(encoding="utf-8"))
        for script, arguments in COMMAND.findall(text):
            used.setdefault(script, set()).update(FLAG.findall(arguments))
    return used


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_a_documented_command_passes_exists(script):
    """`python predict.py --top-k 3` in README.md or docs/*.md: predict.py has --top-k."""
    assert {"-r", "--top-k"} <= commands_flags()["predict.py"]  # the pattern finds them
    unknown = commands_flags().get(script, set()) - help_flags(script) - {"-h", "--help"}
    assert not unknown, f"README.md or docs/*.md pass {script} flags it does not have: {unknown}"
