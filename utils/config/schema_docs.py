"""docs/config.md's key tables, written from the schema's dataclasses (config_schema.py)."""

import dataclasses
import inspect
import json
import re

from utils.config.config_checks import Marker

MARKED_TABLE = re.compile(r"(<!-- schema: (\S+) -->\n)(.*?)(<!-- /schema -->)", re.DOTALL)


def markdown_table(schema: type) -> str:
    """The keys `schema` declares itself as a table: key, default (as JSON), meaning."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    declared = inspect.get_annotations(schema)  # not the fields it inherits
    for item in (item for item in dataclasses.fields(schema) if item.name in declared):
        default = item.metadata["default"]
        shown = default.label if isinstance(default, Marker) else f"`{json.dumps(default)}`"
        meaning = item.metadata["doc"].replace("|", "\\|")
        lines.append(f"| `{item.name}` | {shown} | {meaning} |")
    return "\n".join(lines) + "\n"


def marked_tables(text: str) -> list[str]:
    """The names of the tables marked in `text`, in order."""
    return [match.group(2) for match in MARKED_TABLE.finditer(text)]
