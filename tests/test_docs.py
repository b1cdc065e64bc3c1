"""docs/config.md agrees with config_schema.py, and the schema describes what the code does."""

import dataclasses
import inspect
import typing

import pytest
from conftest import ROOT, run_script

import config_schema
from base.base_data_loader import BaseDataLoader
from config_schema import OPTIONAL, REQUIRED, TABLES, Config, DataLoaderArgs
from utils.config.config_checks import Marker

DOCS = ROOT / "docs" / "config.md"


def schema_classes() -> set[type]:
    """Every dataclass the config is described by: nested sections, known args and base classes."""
    found: set[type] = set()
    pending = [Config]
    while pending:
        schema = pending.pop()
        if schema in found:
            continue
        found.add(schema)
        pending += [base for base in schema.__mro__[1:] if dataclasses.is_dataclass(base)]
        if getattr(schema, "known_args", None) is not None:
            pending.append(schema.known_args)
        for item in dataclasses.fields(schema):
            for candidate in (item.type, *typing.get_args(item.type)):
                if dataclasses.is_dataclass(candidate):
                    pending.append(candidate)
    return found


def test_marked_tables_match_the_schema():
    text = DOCS.read_text(encoding="utf-8")
    # On failure: python config_schema.py docs/config.md
    assert config_schema.render_docs(text) == text


def test_every_schema_table_is_marked_once():
    marked = config_schema.marked_tables(DOCS.read_text(encoding="utf-8"))
    assert sorted(marked) == sorted(TABLES)


def test_every_section_of_the_schema_has_a_table():
    """A new schema dataclass with keys of its own needs a table in TABLES (and in the docs)."""
    with_own_keys = {schema for schema in schema_classes() if inspect.get_annotations(schema)}
    assert with_own_keys == set(TABLES.values())


def test_every_key_has_a_one_line_doc_and_a_check():
    for schema in schema_classes():
        for item in dataclasses.fields(schema):
            doc, check = item.metadata["doc"], item.metadata["check"]
            assert doc and "\n" not in doc, f"{schema.__name__}.{item.name}"
            # Only objects go without a check: a nested section, or keyword arguments.
            is_object = dataclasses.is_dataclass(item.type) or any(
                dataclasses.is_dataclass(candidate) for candidate in typing.get_args(item.type)
            )
            assert check is not None or is_object or item.name == "args", item.name


def test_defaults_pass_their_own_checks():
    for schema in schema_classes():
        for item in dataclasses.fields(schema):
            default, check = item.metadata["default"], item.metadata["check"]
            if check is not None and not isinstance(default, Marker):
                assert check[0](default), f"{schema.__name__}.{item.name}: {default!r}"


def test_data_loader_args_defaults_are_the_constructors():
    """The docs show BaseDataLoader's defaults for data_loader.args: keep them in step."""
    parameters = inspect.signature(BaseDataLoader.__init__).parameters
    for item in dataclasses.fields(DataLoaderArgs):
        default = parameters[item.name].default
        expected = REQUIRED if default is inspect.Parameter.empty else default
        assert item.metadata["default"] == expected, item.name


def test_a_table_renders_key_default_and_meaning():
    table = config_schema.markdown_table(config_schema.ArchSection).splitlines()
    assert table[0] == "| key | default | meaning |"
    assert table[2].startswith("| `freeze` | not set | parameter-name prefixes")
    trainer = config_schema.markdown_table(config_schema.TrainerConfig)
    assert '| `save_dir` | `"saved/"` | ' in trainer
    assert "| `epochs` | required | " in trainer
    assert "| `args` | `{}` | " in trainer
    assert "min\\|max" in trainer  # a | inside a cell would split it
    assert OPTIONAL.label == "not set"


def test_render_docs_replaces_only_marked_tables():
    text = "intro\n<!-- schema: distributed -->\n| stale |\n<!-- /schema -->\noutro | kept\n"
    rendered = config_schema.render_docs(text)
    assert rendered.startswith("intro\n<!-- schema: distributed -->\n| key | default | meaning |")
    assert "| `sync_bn` | `false` | " in rendered
    assert "stale" not in rendered
    assert rendered.endswith("<!-- /schema -->\noutro | kept\n")
    with pytest.raises(ValueError, match="no such table"):
        config_schema.render_docs("<!-- schema: nope -->\n<!-- /schema -->\n")


def test_the_command_rewrites_stale_tables(tmp_path):
    path = tmp_path / "config.md"
    stale = DOCS.read_text(encoding="utf-8").replace(
        "| `sync_bn` | `false` |", "| `sync_bn` | `true` |"
    )
    path.write_text(stale, encoding="utf-8")
    result = run_script(str(ROOT / "config_schema.py"), str(path))
    assert result.returncode == 0, result.stderr
    assert path.read_text(encoding="utf-8") == DOCS.read_text(encoding="utf-8")


def test_the_command_reports_a_missing_table(tmp_path, capsys):
    path = tmp_path / "config.md"
    path.write_text("<!-- schema: trainer -->\n<!-- /schema -->\n", encoding="utf-8")
    assert config_schema.main(path) == 1
    assert "no <!-- schema: NAME --> table for top-level, section" in capsys.readouterr().err
    assert "| `epochs` | required |" in path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [([], "usage: config_schema.py"), (["missing.md"], "missing.md: cannot read")],
)
def test_the_command_reports_a_wrong_call_in_one_line(tmp_path, argv, expected):
    # No argument, or a file that is not there: a usage line or one-line error, not a traceback.
    result = run_script(str(ROOT / "config_schema.py"), *argv, cwd=tmp_path)
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_the_command_has_help(tmp_path):
    result = run_script(str(ROOT / "config_schema.py"), "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "usage: config_schema.py" in result.stdout
    assert not (tmp_path / "--help").exists()
