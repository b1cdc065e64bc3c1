"""new_project.py (issue 34): a copy made with copier leaves out what is not the template
(environments by what they hold: CI installs .venv-ci-floor beside the template while the tests
copy it, and 11 GB filled CI's disk), records the template's commit, and is a git repository;
--update merges the template's newer commits into it, keeping the copy's own edits and leaving a
true conflict as conflict markers with a one-line summary."""

import ast
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

if not (ROOT / "new_project.py").is_file():
    pytest.skip("a copy made by new_project.py, which leaves itself out", allow_module_level=True)
pytest.importorskip("copier", reason="new_project.py's copier (requirements-extras.txt)")

import new_project


def touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_template(root: Path) -> Path:
    for name in ("copier.yml", ".copier-answers.yml.jinja"):
        touch(root / name, (ROOT / name).read_text())
    return root.resolve()


def test_the_copy_leaves_out_environments_caches_and_outputs(tmp_path: Path) -> None:
    root, target = fake_template(tmp_path / "template"), tmp_path / "MyProject"
    kept = ["train.py", "model/model.py", "model/data/vocab.txt", "configs/demo.json", "tests/x.py"]
    for name in kept:
        touch(root / name)
    left_out = [
        ".venv-ci-floor/pyvenv.cfg", ".venv-ci-floor/lib/torch/__init__.py",  # any name
        "env311/pyvenv.cfg", "tools/py/pyvenv.cfg",  # at any depth
        "miniconda/conda-meta/history", "miniconda/bin/python",
        ".import_linter_cache/x", "model/__pycache__/model.cpython-311.pyc", "loose.pyc",
        "template.egg-info/PKG-INFO", ".git/HEAD", "saved/models/run/model_best.pth",
        "data/cifar/batch_1", "new_project.py",
    ]  # fmt: skip
    for name in left_out:
        touch(root / name)

    new_project.copy_template(root, target)

    copied = {str(path.relative_to(target)) for path in target.rglob("*") if path.is_file()}
    assert copied == {*kept, "saved/.gitkeep", ".copier-answers.yml"}


def test_a_folder_named_like_an_environment_without_one_is_copied(tmp_path: Path) -> None:
    # Named "env" or "conda", with no pyvenv.cfg or conda-meta/: the user's code, kept.
    root, target = fake_template(tmp_path / "template"), tmp_path / "MyProject"
    touch(root / "env" / "wrappers.py")
    touch(root / "conda" / "meta.txt")
    new_project.copy_template(root, target)
    assert (target / "env" / "wrappers.py").is_file() and (target / "conda" / "meta.txt").is_file()


def git(*args: str, cwd: Path) -> str:
    identity = ["-c", "user.name=test", "-c", "user.email=test@localhost"]
    result = subprocess.run(["git", *identity, *args], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def new_project_py(template: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(template / "new_project.py"), *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """This template's files (tracked, and new ones not ignored) as a git repository of one
    commit: what a user clones."""
    files = git("ls-files", "-co", "--exclude-standard", "-z", cwd=ROOT).split("\0")
    template = tmp_path / "template"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (template / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, template / name)
    git("init", "-q", cwd=template)
    git("add", "-A", cwd=template)
    git("commit", "-q", "-m", "the template, v1", cwd=template)
    return template


def answered(copy: Path) -> dict:
    """The copy's .copier-answers.yml, parsed: a short hash of digits alone is written quoted
    ('3386203'), which a text search for `_commit: 3386203` missed (1 run in about 27)."""
    import yaml  # copier's own dependency

    return yaml.safe_load((copy / ".copier-answers.yml").read_text())


@pytest.mark.slow  # about 1 min: a copy, an update, some of the copy's tests
def test_an_update_merges_the_templates_commits_and_keeps_the_users_edits(
    template: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "MyProject"
    result = new_project_py(template, str(copy))
    assert result.returncode == 0, result.stderr
    v1 = git("rev-parse", "HEAD", cwd=template).strip()
    answers = answered(copy)
    assert answers["_src_path"] == str(template) and answers["_commit"] == v1[:7]
    assert 'name = "MyProject"' in (copy / "pyproject.toml").read_text()
    assert git("status", "--porcelain", cwd=copy) == ""  # one commit, everything in it

    # The user's edits, the way docs/extending.md suggests: their own model, a metric, a
    # config value, and the training step.
    edit(copy / "model/model.py", "__all__ = [", '__all__ = ["MyNet", ')
    (copy / "model/model.py").write_text(
        (copy / "model/model.py").read_text() + "\n\nclass MyNet(CifarCNN):\n    pass\n"
    )
    (copy / "model/metric.py").write_text(
        (copy / "model/metric.py").read_text() + "\n\n# the user's metric\n"
    )
    edit(copy / "configs/demo.json", '"epochs": 3', '"epochs": 7')
    edit(copy / "trainer/trainer.py", '"""', '"""The user\'s task. ')
    git("commit", "-q", "-am", "my project", cwd=copy)

    # The template's next commit: the machinery, the metrics, a shipped config, and (on purpose)
    # the same line of trainer.py the user changed.
    edit(template / "base/base_trainer.py", "import abc\n", "import abc  # template v2\n")
    (template / "utils/util.py").write_text(
        (template / "utils/util.py").read_text() + "\n\ndef template_v2() -> int:\n    return 2\n"
    )
    edit(template / "model/metric.py", '"""', '"""Template v2. ')
    edit(template / "configs/demo.json", '"log_step": 10', '"log_step": 20')
    edit(template / "trainer/trainer.py", '"""', '"""The template\'s v2. ')
    git("commit", "-q", "-am", "the template, v2", cwd=template)
    v2 = git("rev-parse", "HEAD", cwd=template).strip()

    result = new_project_py(template, "--update", str(copy))
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "1 with conflicts to resolve" in line and line.endswith("trainer/trainer.py")
    # Both sides' changes are there; the conflict is marked, not overwritten either way.
    assert "import abc  # template v2" in (copy / "base/base_trainer.py").read_text()
    assert "def template_v2" in (copy / "utils/util.py").read_text()
    metric = (copy / "model/metric.py").read_text()
    assert '"""Template v2. ' in metric and "# the user's metric" in metric
    config = json.loads((copy / "configs/demo.json").read_text())
    assert (config["trainer"]["epochs"], config["trainer"]["log_step"]) == (7, 20)
    assert "class MyNet(CifarCNN)" in (copy / "model/model.py").read_text()
    trainer = (copy / "trainer/trainer.py").read_text()
    assert "<<<<<<< " in trainer and "The user's task." in trainer and "template's v2" in trainer
    assert answered(copy)["_commit"] == v2[:7]

    # Resolved the user's way, the copy's tests pass.
    lines = trainer.splitlines(keepends=True)
    start = next(i for i, text in enumerate(lines) if text.startswith("<<<<<<< "))
    middle = next(i for i, text in enumerate(lines) if text.startswith("======="))
    end = next(i for i, text in enumerate(lines) if text.startswith(">>>>>>> "))
    resolved = lines[:start] + lines[start + 1 : middle] + lines[end + 1 :]
    (copy / "trainer/trainer.py").write_text("".join(resolved))
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/test_model.py", "tests/test_config.py"],
        cwd=copy, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-3000:]


def test_an_update_is_refused_in_one_line_when_it_cannot_merge(
    template: Path, tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    result = new_project_py(template, "--update", str(plain))
    assert result.returncode == 2 and "no .copier-answers.yml" in result.stderr
    copy = tmp_path / "MyProject"
    assert new_project_py(template, str(copy)).returncode == 0
    (copy / "notes.txt").write_text("not committed")
    result = new_project_py(template, "--update", str(copy))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "uncommitted changes; commit them first" in result.stderr
    other = tmp_path / "other"
    shutil.copytree(template, other)
    (copy / "notes.txt").unlink()
    result = new_project_py(other, "--update", str(copy))
    assert result.returncode == 2 and f"copied from {template}, not {other}" in result.stderr


def test_a_copy_is_refused_in_one_line_where_it_would_overwrite(template: Path, tmp_path: Path):
    busy = tmp_path / "busy"
    touch(busy / "mine.txt", "keep")
    result = new_project_py(template, str(busy))
    assert result.returncode == 2 and "already exists and is not empty" in result.stderr
    assert (busy / "mine.txt").read_text() == "keep"
    result = new_project_py(template, str(template / "inside"))
    assert result.returncode == 2 and "must be outside the template" in result.stderr
    result = new_project_py(template, str(tmp_path / "My Project"))
    assert result.returncode == 2 and "pass --name" in result.stderr
    assert not (tmp_path / "My Project").exists()


@pytest.mark.slow  # CI's main job
def test_a_fresh_copy_passes_its_pre_commit_hooks(template: Path, tmp_path: Path) -> None:
    """.pre-commit-config.yaml's hooks (ruff, the layering check) on every file of a new copy."""
    pre_commit = Path(sys.executable).parent / "pre-commit"
    if not pre_commit.is_file():
        pytest.skip("pre-commit is not installed (requirements-extras.txt)")
    copy = tmp_path / "MyProject"
    assert new_project_py(template, str(copy)).returncode == 0
    hooks = subprocess.run(
        [str(pre_commit), "run", "--all-files"],
        cwd=copy, capture_output=True, text=True, timeout=300,
        # The hooks are local (language: system): ruff and lint-imports from this interpreter's
        # environment, found on PATH, whether or not it is activated.
        env={**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"),
             "PATH": f"{pre_commit.parent}{os.pathsep}{os.environ.get('PATH', '')}"},
    )  # fmt: skip
    assert hooks.returncode == 0, hooks.stdout[-3000:]
    assert git("status", "--porcelain", cwd=copy) == ""  # nothing to fix


# --- a lean copy (--lean): the optional parts left out, and nothing names them -----------------


def lean_rules() -> tuple[list[str], re.Pattern]:
    """copier.yml's lean patterns, and what names a left-out part (lean_copy.mention)."""
    import lean_copy

    parts = lean_copy.lean_parts((ROOT / "copier.yml").read_text())
    assert {"benchmarks", "sweeps", "examples"} <= set(parts)
    patterns = [pattern for part in parts.values() for pattern in part]
    return patterns, lean_copy.mention(patterns, lean_copy.left_out_modules(patterns))


def mentions(folder: Path, files: list[str], texts: dict[str, str]) -> list[str]:
    """file:line of each kept text file's line that names a left-out part. This file is exempt:
    it names them to check them, and skips itself in any copy (no new_project.py)."""
    import lean_copy

    patterns, named = lean_rules()
    # A left-out file named alone ("gpu_check.sh", "throughput.py"), which lean_copy.mention's
    # paths miss, unless a kept file has the same name.
    template = [n for n in git("ls-files", cwd=ROOT).split() if (ROOT / n).is_file()]
    kept = {Path(n).name for n in template if not lean_copy.is_left_out(n, patterns)}
    alone = {Path(n).name for n in template if lean_copy.is_left_out(n, patterns)} - kept
    by_name = re.compile(rf"(?<![\w./-])(?:{'|'.join(map(re.escape, sorted(alone)))})(?![\w-])")
    found = []
    for name in files:
        if name == lean_copy.SELF_TEST or name.endswith(".png"):
            continue
        text = texts.get(name) or (folder / name).read_text(encoding="utf-8")
        found += [
            f"{name}:{i}: {line}"
            for i, line in enumerate(text.splitlines())
            if named.search(line) or by_name.search(line)
        ]
    return found


def test_a_lean_copys_edits_apply_to_the_template_and_leave_no_mention_of_what_it_left_out():
    """In memory, without copier: every lean_copy.EDITS entry applies to the template as it is
    now (a change to a file it edits fails here, not in a user's copy), and the kept files, so
    edited, name no left-out file or module."""
    import lean_copy

    patterns, _ = lean_rules()
    files = git("ls-files", "-co", "--exclude-standard", cwd=ROOT).split()
    files = [n for n in files if (ROOT / n).is_file()]
    kept = [name for name in files if not lean_copy.is_left_out(name, patterns)]
    assert {"sweep.py", "benchmarks/overhead.py", "docs/sweeps.md"}.isdisjoint(kept)
    assert {"train.py", "config.json", "configs/demo.json", "configs/cifar10_cnn.json"} <= set(kept)
    texts = new_project.lean_texts(ROOT, ROOT, kept)
    checked = [n for n in kept if n not in ("copier.yml", "lean_copy.py", lean_copy.SELF_TEST)]
    assert not mentions(ROOT, checked, texts)
    # Nor a link to a worked example that a lean copy drops.
    dropped = [
        re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        for name in checked if name.endswith(".md")
        for heading in re.findall(r"(?m)^#+ (Worked example\b.*)$", (ROOT / name).read_text())
        if heading not in texts.get(name, heading)
    ]  # fmt: skip
    links = [f"{name}: #{slug}" for name in checked for slug in dropped
             if f"#{slug})" in (texts.get(name) or (ROOT / name).read_text(errors="replace"))]  # fmt: skip
    assert not links, links
    # Nor what the kept code imported from them (a left-out loader, model or trainer by name,
    # e.g. in a docs table): those imports are gone, so must every mention be.
    modules = lean_copy.left_out_modules(patterns)
    imported = {
        alias.asname or alias.name
        for name in checked if name.endswith(".py")
        for node in ast.walk(ast.parse((ROOT / name).read_text()))
        if isinstance(node, ast.ImportFrom) and node.module
        and any(node.module == m or node.module.startswith(m + ".") for m in modules)
        for alias in node.names
    }  # fmt: skip
    if imported:
        named = re.compile(rf"(?<!\w)(?:{'|'.join(sorted(imported))})(?!\w)")
        left = [
            f"{name}:{i}: {line}"
            for name in checked if not name.endswith(".png")
            for i, line in enumerate((texts.get(name) or (ROOT / name).read_text()).splitlines())
            if named.search(line)
        ]  # fmt: skip
        assert not left, left
    # The generic part: a left-out module's import and its names in __all__ go.
    text = 'from model.sequence import GRUClassifier  # in __all__ too\n__all__ = [\n    "CifarCNN",\n    "GRUClassifier",\n]\n'  # fmt: skip
    assert (
        lean_copy.without_imports(text, {"model.sequence"}) == '__all__ = [\n    "CifarCNN",\n]\n'
    )


def test_a_lean_copy_drops_the_tests_and_worked_examples_of_a_left_out_part():
    import lean_copy

    patterns = ["sweep.py", "benchmarks", "data_loader/tasks"]
    named = lean_copy.mention(patterns, lean_copy.left_out_modules(patterns))
    tests = (
        "import os\nimport subprocess\n\nfrom conftest import ROOT\n\n\n"
        "def test_kept():\n    assert os.sep\n\n\n"
        "@pytest.mark.slow\ndef test_the_benchmark():\n    subprocess.run(['bash', 'benchmarks/x.sh'])\n\n\n"
        "def test_the_sweep():\n    assert (ROOT / 'sweep.py').is_file()\n"
    )  # fmt: skip
    assert lean_copy.without_tests_of(tests, named) == (
        "import os\n\n\ndef test_kept():\n    assert os.sep\n"
    )
    page = "# Extending\n\n## Worked example: rows\n\nkept\n\n## Worked example: sequences\n\n`configs/x.json`, `data_loader/tasks/sequences.py`\n\n```\n# not a heading\n```\n\n## After\n"  # fmt: skip
    assert lean_copy.without_examples_of(page, named) == (
        "# Extending\n\n## Worked example: rows\n\nkept\n\n## After\n"
    )


def test_a_lean_edit_that_no_longer_applies_refuses_the_copy_before_it_starts(
    tmp_path, monkeypatch
):
    import lean_copy

    root = fake_template(tmp_path / "template")
    touch(root / "README.md", "# A README that does not name the benchmarks\n")
    monkeypatch.setattr(lean_copy, "EDITS", [("README.md", "### Benchmarks", None)])
    with pytest.raises(new_project.CopyError, match="no single heading '### Benchmarks'"):
        new_project.copy_template(root, tmp_path / "MyProject", lean=True)
    assert not (tmp_path / "MyProject").exists()


@pytest.mark.slow  # about 1 min: a copy, ruff, lint-imports, some of the copy's tests, an update
def test_a_lean_copy_has_no_optional_part_and_passes_its_lint_layering_and_tests(
    template: Path, tmp_path: Path
) -> None:
    import lean_copy

    copy = tmp_path / "Lean"
    result = new_project_py(template, "--lean", str(copy))
    assert result.returncode == 0, result.stderr
    assert "lean: true" in (copy / ".copier-answers.yml").read_text()
    patterns, _ = lean_rules()
    files = git("ls-files", cwd=copy).split()
    assert not [name for name in files if lean_copy.is_left_out(name, patterns)]
    assert not (copy / "sweeps").exists() and not (copy / "benchmarks").exists()
    assert not mentions(copy, files, {})
    assert git("status", "--porcelain", cwd=copy) == ""  # the edits are in the first commit
    tools = Path(sys.executable).parent
    for command in (["ruff", "check", "."], ["ruff", "format", "--check", "."], ["lint-imports"]):
        if command[0] == "lint-imports" and not (tools / "lint-imports").is_file():
            continue  # import-linter: the dev extra
        checked = subprocess.run([str(tools / command[0]), *command[1:]], cwd=copy,
                                 capture_output=True, text=True, timeout=300)  # fmt: skip
        assert checked.returncode == 0, (command, checked.stdout[-3000:])
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/test_readme.py", "tests/test_docs.py", "tests/test_layers.py",
         "tests/test_config.py", "tests/test_model.py"],
        cwd=copy, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-3000:]

    # An update keeps it lean: the template's change comes in, the left-out files stay out,
    # and lean_copy.py's edits merge as the copy's own.
    edit(template / "README.md", "- **Reproducible**:", "- **Reproducible (v2)**:")
    (template / "sweep.py").write_text((template / "sweep.py").read_text() + "# v2\n")
    git("commit", "-q", "-am", "the template, v2", cwd=template)
    result = new_project_py(template, "--update", str(copy))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Reproducible (v2)" in (copy / "README.md").read_text()
    assert not (copy / "sweep.py").exists()
    assert not mentions(copy, git("ls-files", cwd=copy).split(), {})


# --- refusals in-process: what a target or a name may be, before copier runs ------------------


def refused(monkeypatch, capsys, *argv: str) -> str:
    """main(argv) must refuse in one line with exit 2 before copying: the one line."""

    def no_copy(*args, **kwargs):
        raise AssertionError("copied although it should have refused")

    monkeypatch.setattr(new_project, "create", no_copy)
    assert new_project.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "kind", ["file", "link to a file", "non-empty", "the template", "link to the template",
             "inside the template", "link inside the template"],
)  # fmt: skip
def test_a_target_that_is_not_a_new_folder_outside_the_template_is_refused_unchanged(
    kind: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A file as the target was a NotADirectoryError traceback; every kind is one line, and the
    target (and the template) stay as they were."""
    mine = tmp_path / "mine.txt"
    mine.write_text("keep")
    busy = tmp_path / "busy"
    touch(busy / "notes.txt", "keep")
    for name, to in (("file", mine), ("template", ROOT), ("tests", ROOT / "tests")):
        (tmp_path / f"link-to-{name}").symlink_to(to)
    target = {
        "file": mine,
        "link to a file": tmp_path / "link-to-file",
        "non-empty": busy,
        "the template": ROOT,
        "link to the template": tmp_path / "link-to-template",
        "inside the template": ROOT / "tests" / "a-new-project",
        "link inside the template": tmp_path / "link-to-tests" / "a-new-project",
    }[kind]
    refused(monkeypatch, capsys, str(target))
    assert mine.read_text() == "keep" and (busy / "notes.txt").read_text() == "keep"
    assert not (ROOT / "tests" / "a-new-project").exists()


@settings(max_examples=30, deadline=None)
@given(name=st.one_of(st.text(max_size=12), st.sampled_from(["", "a/b", "../x", "-x", "my-proj"])))
def test_a_name_is_copied_as_given_or_refused_in_one_line(name: str) -> None:
    """--name NAME: a project name (the core metadata spec's, ASCII) is the copy's name exactly;
    anything else (an empty name too: it fell back to the folder's name) is refused in one line,
    exit 2."""
    spec = r"[A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9]"  # packaging.python.org, "name" field
    valid = re.fullmatch(spec, name, re.IGNORECASE | re.ASCII) is not None
    copied = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(
            new_project, "create", lambda root, target, name, lean: copied.append(name)
        )
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = new_project.main(["/nonexistent/MyProject", f"--name={name}"])
    if valid:
        assert (code, copied) == (0, [name])
    else:
        assert code == 2 and not copied and err.getvalue().count("\n") == 1, err.getvalue()


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_copy_that_fails_midway_leaves_no_half_project(
    failure: BaseException, tmp_path: Path, monkeypatch, capsys
) -> None:
    """copier stopped after writing files (a full disk, Ctrl-C): the target must not hold a half
    copy with no git commit that looks like a project; a rerun then makes the whole copy."""
    import copier

    root = fake_template(tmp_path / "template")
    touch(root / "train.py", "print('train')\n")
    monkeypatch.setattr(new_project, "__file__", str(root / "new_project.py"))  # main's template
    target = tmp_path / "projects" / "MyProject"
    run_copy = copier.run_copy

    def fails_midway(*args, **kwargs) -> None:
        run_copy(*args, **kwargs)  # the files are written, then it stops
        raise failure

    monkeypatch.setattr(copier, "run_copy", fails_midway)
    if isinstance(failure, OSError):
        assert new_project.main([str(target)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "No space left on device" in err, err
    else:
        with pytest.raises(KeyboardInterrupt):
            new_project.main([str(target)])
    assert not target.exists() and list(target.parent.iterdir()) == []

    monkeypatch.setattr(copier, "run_copy", run_copy)
    assert new_project.main([str(target)]) == 0
    assert (target / "train.py").is_file() and git("status", "--porcelain", cwd=target) == ""


@settings(max_examples=10, deadline=None)
@given(name=st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,10}[A-Za-z0-9])?", fullmatch=True))
def test_the_projects_name_is_its_title_and_package_name_and_nothing_else_changes(
    name: str,
) -> None:
    """The copy is named in pyproject.toml's [project] name and in its README's title (which
    said "PyTorch Template" in every copy); every other byte is the template's, the word
    "pytorch-template" in a link or a code string included."""
    with tempfile.TemporaryDirectory() as folder:
        root, target = fake_template(Path(folder) / "template"), Path(folder) / "copy"
        readme = "# PyTorch Template\n\nIn the layout of victoresque/pytorch-template.\n\n# Usage\n"
        pyproject = (
            '[project]\nname = "pytorch-template"\n\n[[tool.x]]\nname = "pytorch-template"\n'
        )
        code = 'NAME = "pytorch-template"  # name = "pytorch-template"\n'
        for file, text in (("README.md", readme), ("pyproject.toml", pyproject), ("a.py", code)):
            touch(root / file, text)
        new_project.copy_template(root, target, name)
        assert (target / "README.md").read_text() == readme.replace("PyTorch Template", name)
        assert (target / "pyproject.toml").read_text() == pyproject.replace(
            "pytorch-template", name, 1
        )
        assert (target / "a.py").read_text() == code


def test_a_copy_of_a_template_with_uncommitted_changes_still_updates(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """copier records a dirty template's commit as the one it makes in its own clone, which the
    template never has: every later --update failed ("Unknown revision"). The copy records the
    template's HEAD instead, so the uncommitted changes it took count as the copy's own edits."""
    root = fake_template(tmp_path / "template")
    touch(root / "f.txt", "a\nb\nc\n")
    git("init", "-q", cwd=root)
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "v1", cwd=root)
    touch(root / "f.txt", "a\nb\nc\nuncommitted\n")
    monkeypatch.setattr(new_project, "__file__", str(root / "new_project.py"))  # main's template
    copy = tmp_path / "MyProject"
    assert new_project.main([str(copy)]) == 0
    assert "uncommitted changes" in capsys.readouterr().err
    assert (copy / "f.txt").read_text() == "a\nb\nc\nuncommitted\n"

    touch(root / "f.txt", "A\nb\nc\n")  # the template's next commit, without that change
    git("commit", "-q", "-am", "v2", cwd=root)
    assert new_project.main(["--update", str(copy)]) == 0, capsys.readouterr().err
    assert (copy / "f.txt").read_text() == "A\nb\nc\nuncommitted\n"
    recorded = git("rev-parse", str(answered(copy)["_commit"]), cwd=root)
    assert recorded == git("rev-parse", "HEAD", cwd=root)  # the next update starts from v2


def test_an_update_names_a_conflict_in_a_file_whose_name_git_quotes(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """git status --porcelain writes a name with a space or a non-ASCII letter in quotes, so the
    conflict in it went unseen: "no conflicts", exit 0, with <<<<<<< markers in the file."""
    root = fake_template(tmp_path / "template")
    names = ["docs/my notes.md", "données.txt"]
    for name in names:
        touch(root / name, "one\ntwo\n")
    git("init", "-q", cwd=root)
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "v1", cwd=root)
    monkeypatch.setattr(new_project, "__file__", str(root / "new_project.py"))  # main's template
    copy = tmp_path / "MyProject"
    assert new_project.main([str(copy)]) == 0
    for name in names:  # the same line changed on both sides
        touch(copy / name, "one, the user's\ntwo\n")
        touch(root / name, "one, the template's\ntwo\n")
    git("commit", "-q", "-am", "mine", cwd=copy)
    git("commit", "-q", "-am", "v2", cwd=root)
    capsys.readouterr()
    assert new_project.main(["--update", str(copy)]) == 1
    line = capsys.readouterr().err.strip()
    assert "2 with conflicts to resolve" in line and all(name in line for name in names), line


def test_every_script_a_copys_readme_runs_is_in_the_copy() -> None:
    """A copy has no new_project.py, yet its README told it to run `python new_project.py`: in a
    copy the section says how to update it from inside (copier update), and every script its
    bash blocks run is a file of the copy."""
    files = git("ls-files", cwd=ROOT).split()
    in_copy = set(files) - {"copier.yml", "new_project.py", "lean_copy.py"}
    readme = new_project.readme_in_a_copy((ROOT / "README.md").read_text(encoding="utf-8"))
    blocks = "".join(re.findall(r"(?s)```bash\n(.*?)```", readme))
    scripts = set(re.findall(r"(?:python|bash|torchrun .*?)\s+([\w/.-]+\.(?:py|sh))\b", blocks))
    assert {"train.py", "test.py"} <= scripts  # the pattern finds them
    assert not sorted(scripts - in_copy)
    assert "python new_project.py" not in readme
    assert "copier update --defaults --vcs-ref HEAD" in readme
    assert len(readme.splitlines()) <= len((ROOT / "README.md").read_text().splitlines())


def test_a_copys_files_name_no_file_it_lacks() -> None:
    """A copy has no new_project.py, lean_copy.py or copier.yml, yet its requirements-extras.txt
    and pyproject.toml said copier was "for new_project.py", when a copy needs it for `copier
    update`. Exempt: docs/new-project.md (how the copy was made) and tests/ (those that run
    new_project.py skip in a copy)."""
    lacks = ["copier.yml", "new_project.py", "lean_copy.py"]
    named = re.compile(rf"(?<![\w./-])(?:{'|'.join(map(re.escape, lacks))})(?![\w-])")
    files = [n for n in git("ls-files", cwd=ROOT).split() if (ROOT / n).is_file()]
    found = []
    for name in sorted(set(files) - set(lacks)):
        if name == "docs/new-project.md" or name.startswith("tests/") or name.endswith(".png"):
            continue
        text = (ROOT / name).read_text(encoding="utf-8")
        text = new_project.readme_in_a_copy(text) if name == "README.md" else text
        found += [f"{name}:{i}: {line}" for i, line in enumerate(text.splitlines(), 1)
                  if named.search(line)]  # fmt: skip
    assert not found, found


@pytest.mark.parametrize("parent_dirty", [False, True])
def test_an_update_of_a_copy_inside_a_larger_repository_looks_at_the_copy_alone(
    parent_dirty: bool, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A copy kept in a larger repository (parent/projects/mine, no .git of its own): git named
    its files from the parent's root, so the conflict the update left went unseen ("no
    conflicts", exit 0), and the parent's own uncommitted work refused the update. The copy's
    files alone count, and the parent's commits and other files stay as they were."""
    root = fake_template(tmp_path / "template")
    touch(root / "f.txt", "one\ntwo\n")
    git("init", "-q", cwd=root)
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "v1", cwd=root)
    monkeypatch.setattr(new_project, "__file__", str(root / "new_project.py"))  # main's template
    parent, copy = tmp_path / "parent", tmp_path / "parent" / "projects" / "mine"
    touch(parent / "notes.txt", "the parent's\n")
    git("init", "-q", cwd=parent)
    assert new_project.main([str(copy)]) == 0
    shutil.rmtree(copy / ".git")  # now a folder of the parent's repository
    touch(copy / "f.txt", "one, the user's\ntwo\n")
    git("add", "-A", cwd=parent)
    git("commit", "-q", "-m", "the parent, with the copy", cwd=parent)
    if parent_dirty:  # the parent's uncommitted work, outside the copy
        touch(parent / "notes.txt", "the parent's, edited\n")
    head = git("rev-parse", "HEAD", cwd=parent)
    touch(root / "f.txt", "one, the template's\ntwo\n")
    git("commit", "-q", "-am", "v2", cwd=root)
    capsys.readouterr()
    assert new_project.main(["--update", str(copy)]) == 1
    line = capsys.readouterr().err.strip()
    assert "1 with conflicts to resolve" in line and line.endswith(": f.txt"), line
    assert git("rev-parse", "HEAD", cwd=parent) == head
    assert (parent / "notes.txt").read_text() == (
        "the parent's, edited\n" if parent_dirty else "the parent's\n"
    )


@settings(max_examples=5, deadline=None)
@given(
    deleted=st.sets(st.sampled_from(["a.txt", "docs/b.md", "my notes.txt"]), min_size=1),
    changed=st.sets(st.sampled_from(["a.txt", "docs/b.md", "my notes.txt", "kept.txt"])),
)
def test_an_update_keeps_a_users_deletion_and_names_the_files_the_template_changed(
    deleted: set[str], changed: set[str]
) -> None:
    """A file the user deleted that the template then changed: copier kept it deleted and said
    nothing, so the template's change (a fix, say) was dropped unseen. The deletion stands, and
    the summary names exactly the deleted files the template changed."""
    names = ["a.txt", "docs/b.md", "my notes.txt", "kept.txt"]
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as monkeypatch:
        root = fake_template(Path(folder) / "template")
        for name in names:
            touch(root / name, "one\ntwo\n")
        git("init", "-q", cwd=root)
        git("add", "-A", cwd=root)
        git("commit", "-q", "-m", "v1", cwd=root)
        monkeypatch.setattr(new_project, "__file__", str(root / "new_project.py"))
        copy = Path(folder) / "MyProject"
        with contextlib.redirect_stdout(io.StringIO()):
            assert new_project.main([str(copy)]) == 0
        git("rm", "-q", *deleted, cwd=copy)
        git("commit", "-q", "-m", "mine", cwd=copy)
        for name in changed:
            touch(root / name, "one\ntwo, the template's\n")
        git("commit", "-q", "--allow-empty", "-am", "v2", cwd=root)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert new_project.main(["--update", str(copy)]) == 0
        assert not any((copy / name).exists() for name in deleted)
        told = sorted(deleted & changed)
        line = out.getvalue().strip()
        assert ("left deleted" in line) == bool(told), line
        if told:
            assert line.split("left deleted: ")[1].split(". ")[0] == ", ".join(told), line


def test_the_tests_that_run_new_project_py_skip_in_a_copy() -> None:
    """A copy has no new_project.py, yet test_snippets.py and test_task_docs.py ran it and so
    failed in a copy's full suite; each test module that runs it skips where it is missing."""
    runs = [
        p for p in sorted((ROOT / "tests").glob("test_*.py")) if '"new_project.py"' in p.read_text()
    ]
    assert {"test_snippets.py", "test_train_e2e.py"} <= {
        p.name for p in runs
    }  # the check finds them
    guard = '(ROOT / "new_project.py").is_file()'
    assert not [p.name for p in runs if guard not in p.read_text()]
