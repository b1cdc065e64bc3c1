"""What README.md and docs/*.md promise about outputs and commands is what the code does: every
key a checkpoint holds is in docs/outputs.md's table and every key the table names is in a
checkpoint."""

import json
import re

import torch
from conftest import ROOT, run_main

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
