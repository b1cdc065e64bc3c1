"""new_project.py leaves out what is not the template: environments by what they hold (CI
installs .venv-ci-floor beside the template while the tests copy it: 11 GB filled CI's disk),
caches, run outputs and data at the root; a user's own folder named like them deeper down stays."""

from pathlib import Path

import new_project


def touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_copy_leaves_out_environments_caches_and_outputs(tmp_path: Path) -> None:
    root, target = tmp_path / "template", tmp_path / "MyProject"
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

    new_project.copy_template(root.resolve(), target)

    copied = {str(path.relative_to(target)) for path in target.rglob("*") if path.is_file()}
    assert copied == {*kept, "saved/.gitkeep"}


def test_a_folder_named_like_an_environment_without_one_is_copied(tmp_path: Path) -> None:
    # Named "env" or "conda", with no pyvenv.cfg or conda-meta/: the user's code, kept.
    root, target = tmp_path / "template", tmp_path / "MyProject"
    touch(root / "env" / "wrappers.py")
    touch(root / "conda" / "meta.txt")
    new_project.copy_template(root.resolve(), target)
    assert (target / "env" / "wrappers.py").is_file() and (target / "conda" / "meta.txt").is_file()
