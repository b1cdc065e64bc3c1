"""README.md stays short, and it and docs/ stay true to the code: links resolve, every flag of
train.py, test.py, predict.py, export.py and sweep.py is documented, files they name exist, the step they show is the real one."""

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


@pytest.mark.parametrize("script", ["train.py", "test.py", "predict.py", "export.py", "sweep.py"])
def test_every_flag_is_documented(script):
    result = run_script(script, "--help")
    assert result.returncode == 0, result.stderr
    # Option lines of argparse's help: "  -c CONFIG, --config CONFIG   help text".
    flags = set()
    for line in result.stdout.splitlines():
        if line.startswith("  -"):
            invocation = re.split(r"\s{2,}", line.strip())[0]
            flags.update(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", invocation))
    flags -= {"-h", "--help"}
    assert flags & {"--resume", "--config"}  # the parsing above found the options
    text = documented_text()
    missing = sorted(flag for flag in flags if not re.search(rf"(?<![\w-]){flag}(?![\w-])", text))
    assert not missing, f"{script} flags not in README.md or docs/*.md: {missing}"


def test_files_the_docs_name_exist():
    named = set(PROJECT_FILE.findall(documented_text()))
    assert "configs/denoise.json" in named  # the pattern finds them
    # A copy made by new_project.py leaves that script out, and keeps the README that names it.
    named.discard("new_project.py")
    missing = sorted(name for name in named if not (ROOT / name).exists())
    assert not missing, missing


def test_the_step_shown_is_the_one_in_trainer_py():
    """docs/extending.md shows Trainer's steps in full: they must be the code's, verbatim."""
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    section = text.partition("## The step")[2]
    shown = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert shown is not None, "no python block under '## The step' in docs/extending.md"
    source = (ROOT / "trainer" / "trainer.py").read_text(encoding="utf-8")
    assert "def training_step" in shown.group(1)
    assert shown.group(1) in source, "update the step in docs/extending.md from trainer/trainer.py"
