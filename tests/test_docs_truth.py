"""What README.md and docs/*.md promise about outputs and commands is what the code does: every
key a checkpoint holds is in docs/outputs.md's table and every key the table names is in a
checkpoint; every
train.py or test.py command with a config that the docs show is accepted as written."""

import importlib.util
import json
import re
import shlex

import torch
from conftest import ENTRY_POINTS, ROOT, run_main

from parse_config import ConfigParser
from utils import UserError
from utils.util import ConfigError

OUTPUTS = ROOT / "docs" / "outputs.md"
# A row of a Markdown table whose first cell names keys: | `optimizer`, `lr_scheduler` | ... |
TABLE_KEYS = re.compile(r"^\| ((?:`\w+`(?: \(\d\))?(?:, )?)+) \|", re.MULTILINE)


def table_keys(section: str) -> set[str]:
    """The keys named in the first cells of the Markdown table under `section` of outputs.md."""
    text = OUTPUTS.read_text(encoding="utf-8").partition(section)[2]
    table = text.partition("\n\n|")[2].partition("\n\n")[0]
    return {key for cell in TABLE_KEYS.findall("|" + table) for key in re.findall(r"`(\w+)`", cell)}


def test_the_checkpoint_table_names_every_key_a_checkpoint_holds(demo_checkpoint):
    documented = table_keys("## Checkpoint contents")
    assert {"format", "model", "logger_runs"} <= documented  # the parsing above found the table
    held = set(torch.load(demo_checkpoint, weights_only=True))
    assert not held - documented, f"in a checkpoint, not in docs/outputs.md: {held - documented}"
    assert not documented - held, f"in docs/outputs.md, not in a checkpoint: {documented - held}"


def test_test_json_holds_the_keys_outputs_md_lists(demo_checkpoint, tmp_path):
    report = tmp_path / "report.json"
    result = run_main("test.py", "-r", str(demo_checkpoint), "--json", str(report))
    assert result.returncode == 0, result.stderr[-3000:]
    listed = re.search(r"`test.py --json PATH` writes[^{]*\{([^}]*)\}", OUTPUTS.read_text())
    assert listed is not None, "no list of test.py --json's keys in docs/outputs.md"
    assert set(re.findall(r'"(\w+)"', listed.group(1))) == set(json.loads(report.read_text()))


# `python train.py <arguments>` (or test.py) in README.md or docs/*.md, up to a comment or pipe.
TRAIN_OR_TEST = re.compile(r"python (train|test)\.py ([^`#|&;\n]*)")


def documented_runs() -> list[tuple[str, str, list[str]]]:
    """(page, script, arguments) of each train.py or test.py command that names a config."""
    runs = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        # A command continued over lines (a trailing backslash) is one command.
        text = re.sub(r"\\\n\s*", " ", page.read_text(encoding="utf-8"))
        for script, arguments in TRAIN_OR_TEST.findall(text):
            argv = shlex.split(arguments)
            # -r needs a run of the reader's; the last word of a line of prose is no command.
            if ("-c" in argv or "--config" in argv) and "-r" not in argv and argv[-1] != "--set":
                runs.append((page.name, script, argv))
    return runs


def test_each_documented_config_and_override_is_accepted():
    """What train.py/test.py read before they build anything: a renamed key or a config that is
    not there fails here, not in the reader's terminal."""
    runs = documented_runs()
    assert len(runs) > 20  # the pattern finds the commands
    refused = []
    for page, script, argv in runs:
        if argv[argv.index("-c") + 1] == "vectors.json":  # written by the reader from the page
            continue
        try:
            ConfigParser.from_args(ENTRY_POINTS[script].parse_args(argv))
        except (ConfigError, SystemExit) as error:
            refused.append(f"{page}: {script} {' '.join(argv)}: {error}")
    assert not refused, "\n".join(refused)


def listed_names() -> list[re.Pattern]:
    """The file names of docs/outputs.md's trees (`checkpoint-epoch<N>.pth`, `events.out.*`) as
    patterns: <X> and * stand for any text."""
    trees = re.findall(r"^```\nsaved/\n(.*?)^```", OUTPUTS.read_text(encoding="utf-8"), re.M | re.S)
    assert trees, "no saved/ tree in docs/outputs.md"
    patterns = []
    for line in "".join(trees).splitlines():
        # "    name, other   what it is": the names before the two spaces of the description.
        for name in re.split(r",\s*", re.split(r"\s{2,}", line.strip())[0]):
            if name and not name.endswith("/"):
                escaped = re.escape(name).replace(r"\*", ".*")
                patterns.append(re.compile(re.sub(r"<[^>]*>", ".+", escaped) + "$"))
    return patterns


def test_every_file_of_a_run_is_listed_in_outputs_md(demo_checkpoint):
    save_dir = demo_checkpoint.parents[3]
    written = [path for path in save_dir.rglob("*") if path.is_file()]
    assert {"config.json", "latest", "info.log"} <= {path.name for path in written}
    patterns = listed_names()
    unlisted = [path for path in written if not any(p.match(path.name) for p in patterns)]
    assert not unlisted, f"written, not in docs/outputs.md: {unlisted}"


def test_each_documented_sweep_is_planned_as_written():
    """sweep.py's commands in the docs: their space and every trial's config are accepted (the
    checks sweep.py runs before any trial, without running one)."""
    from sweeps.plan import plan

    commands = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"\\\n\s*", " ", page.read_text(encoding="utf-8"))
        for arguments in re.findall(r"python sweep\.py (-c [^`#|&;\n]*)", text):
            commands.append((page.name, shlex.split(arguments)))
    assert len(commands) >= 5  # the pattern finds the commands
    refused = []
    for page, argv in commands:
        if "--optuna" in argv and importlib.util.find_spec("optuna") is None:
            continue  # an optional dependency: pip install optuna
        try:
            plan(ENTRY_POINTS["sweep"].parse_args(argv))
        except (UserError, SystemExit) as error:
            refused.append(f"{page}: sweep.py {' '.join(argv)}: {error}")
    assert not refused, "\n".join(refused)
