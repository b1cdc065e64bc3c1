"""Bad input to train.py and test.py: exit code 2, one "error:" line, and nothing on disk touched.

The cases run in-process through train.main / test.main (fast); two also run as real
subprocesses. One real 1-epoch run, trained once per module, supplies the checkpoints that the
resume cases need; each test works on its own copy of it under tmp_path/saved.
"""

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import ENTRY_POINTS, ROOT, checkpoint_dirs, run_script, shrink

import data_loader.data_loaders as data_module
import model.loss as loss_module
import model.metric as metric_module
import model.model as arch_module
from utils import UserError

RUN_NAME = "Demo_CifarCNN"


@pytest.fixture(scope="module")
def trained_saved_dir(tmp_path_factory):
    """saved/ of one real run: the shrunk demo config (as make_config writes it), 1 epoch, run id "base"."""
    root = tmp_path_factory.mktemp("trained")
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), root / "saved")
    config["trainer"]["epochs"] = 1
    config_path = root / "config.json"
    config_path.write_text(json.dumps(config, indent=4))
    result = run_script("train.py", "-c", str(config_path), "--run-id", "base")
    assert result.returncode == 0, result.stderr
    assert [path.name for path in checkpoint_dirs(root / "saved")] == ["base"]
    return root / "saved"


def available(module: object) -> str:
    """What an unknown-name error lists: the module's __all__, as the copy holds it (a model,
    loss, metric or loader added there the documented way keeps these cases true)."""
    return ", ".join(sorted(module.__all__))


@dataclass
class Env:
    """What a case builds its arguments from; all paths lie under tmp."""

    tmp: Path
    saved: Path
    run_dir: Path  # saved/models/Demo_CifarCNN/base, a finished 1-epoch run
    marker: Path  # created only if an unsafe checkpoint ran its payload
    make_config: Callable[..., Path]

    @property
    def checkpoint(self) -> str:
        return str(self.run_dir / "checkpoint-epoch1.pth")

    def config(self, name: str = "configs/demo.json", *, drop: str = "", **overrides) -> str:
        """A shrunk shipped config (outputs in saved/) with dotted-key overrides and,
        optionally, the dotted key `drop` removed."""
        path = self.make_config(name, filename="case.json", **overrides)
        if drop:
            config = json.loads(path.read_text())
            *parents, last = drop.split(".")
            node = config
            for key in parents:
                node = node[key]
            del node[last]
            path.write_text(json.dumps(config))
        return str(path)

    def write(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.write_text(text)
        return str(path)

    def planted(self, folder: str, write) -> str:
        """tmp/<folder>/checkpoint.pth written by write(path), with the run's config.json beside it."""
        run_dir = self.tmp / folder
        run_dir.mkdir()
        shutil.copy(self.run_dir / "config.json", run_dir / "config.json")
        path = run_dir / "checkpoint.pth"
        write(path)
        return str(path)

    def truncated(self) -> str:
        data = (self.run_dir / "checkpoint-epoch1.pth").read_bytes()
        return self.planted("truncated", lambda path: path.write_bytes(data[: len(data) // 2]))

    def foreign(self, content) -> str:
        return self.planted("foreign", lambda path: torch.save(content, path))

    def unsafe(self) -> str:
        return self.planted("unsafe", lambda path: torch.save(unsafe_payload(self.marker), path))


class Touch:
    """Unpickling this calls Path.touch(marker): what a malicious checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def unsafe_payload(marker: Path) -> dict:
    """A checkpoint-shaped dict whose loading with weights_only=False runs code."""
    return {"model": Touch(marker), "config": {}, "epoch": 1}


@pytest.fixture
def env(tmp_path, trained_saved_dir, make_config, monkeypatch):
    """A fresh copy of the trained saved/ folder in tmp_path, the working directory."""
    monkeypatch.chdir(tmp_path)
    saved = tmp_path / "saved"
    shutil.copytree(trained_saved_dir, saved)
    run_dir = saved / "models" / RUN_NAME / "base"
    # The copied run writes its outputs to this copy, not to the shared original.
    config = json.loads((run_dir / "config.json").read_text())
    config["trainer"]["save_dir"] = str(saved)
    (run_dir / "config.json").write_text(json.dumps(config, indent=4))
    return Env(tmp_path, saved, run_dir, tmp_path / "payload-ran", make_config)


def snapshot(folder: Path) -> dict:
    """Every path under folder -> (sha256, mtime) for files, None for folders."""
    return {
        str(path.relative_to(folder)): (
            (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
            if path.is_file()
            else None
        )
        for path in sorted(folder.rglob("*"))
    }


def case(script: str, build, expected: str, *, case_id: str, marks=()):
    """build(env) -> argv; expected is formatted with tmp, run (the trained run folder) and ckpt."""
    return pytest.param(script, build, expected, id=case_id, marks=marks)


CASES = [
    # Config files that cannot be read.
    case(
        "train",
        lambda env: ["-c", env.write("bad.json", '{\n    "name": "x",\n    oops\n}\n')],
        "{tmp}/bad.json: invalid JSON at line 3, column 5",
        case_id="malformed-json",
    ),
    case(
        "train",
        lambda env: ["-c", str(env.tmp / "nope.json")],
        "{tmp}/nope.json: config file not found",
        case_id="missing-config",
    ),
    case(
        "train",
        lambda env: ["-c", env.write("list.json", "[1, 2]")],
        "{tmp}/list.json: the top level must be a JSON object",
        case_id="top-level-list",
    ),
    case("train", lambda env: [], "no config given", case_id="no-config"),
    # Missing keys, wrong types and ranges.
    case(
        "train",
        lambda env: ["-c", env.config(drop="name")],
        "{tmp}/case.json: name: missing required key",
        case_id="missing-name",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(drop="trainer.epochs")],
        "{tmp}/case.json: trainer.epochs: missing required key",
        case_id="missing-epochs",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"trainer.epochs": 0})],
        "{tmp}/case.json: trainer.epochs: must be a positive integer, got 0",
        case_id="epochs-0",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--epochs", "0"],
        "{tmp}/case.json: trainer.epochs: must be a positive integer, got 0",
        case_id="epochs-flag-0",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"optimizer.args.lr": -0.1})],
        "{tmp}/case.json: optimizer.args.lr: must be a number > 0, got -0.1",
        case_id="negative-lr",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--lr", "-1"],
        "{tmp}/case.json: optimizer.args.lr: must be a number > 0, got -1.0",
        case_id="negative-lr-flag",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"data_loader.args.validation_split": 1.5})],
        "{tmp}/case.json: data_loader.args.validation_split: must be a fraction in [0, 1)",
        case_id="validation-split-1.5",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "data_loader.args.batch_size=a"],
        '{tmp}/case.json: data_loader.args.batch_size: must be a positive integer, got "a"',
        case_id="batch-size-a",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "trainer.args=[1]"],
        "{tmp}/case.json: trainer.args: must be an object {{...}}",
        case_id="trainer-args-not-an-object",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"trainer.tensorboard": "yes"})],
        '{tmp}/case.json: trainer.tensorboard: must be true or false, got "yes"',
        case_id="tensorboard-yes",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "data_loader.args.validation_split=320"],
        "data_loader.args.validation_split: 320 leaves no training samples out of 320",
        case_id="validation-split-everything",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "optimizer.args.momentum=0.9"],
        "{tmp}/case.json: optimizer.args: unknown key 'momentum' for Adam (known: amsgrad, ",
        case_id="unexpected-optimizer-arg",
    ),
    case(
        "train",
        lambda env: [
            "-c",
            env.config(),
            "--set",
            "optimizer.type=SGD",
            "--set",
            "optimizer.args.momentum=-1",
        ],
        "{tmp}/case.json: optimizer.args: Invalid momentum value: -1",
        case_id="optimizer-value-error",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "arch.args.in_shape=[3, 2, 2]"],
        "{tmp}/case.json: arch.args: in_shape [3, 2, 2] is too small for 2 blocks",
        case_id="model-too-deep",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "arch.args.widths=5"],
        "{tmp}/case.json: arch",
        case_id="widths-not-a-list",
    ),
    # Unknown type names.
    case(
        "train",
        lambda env: ["-c", env.config(**{"arch.type": "ResNet9"})],
        "{tmp}/case.json: arch.type: unknown name 'ResNet9' in model.model "
        f"(available: {available(arch_module)})",
        case_id="unknown-arch",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"optimizer.type": "Adamm"})],
        "{tmp}/case.json: optimizer.type: unknown name 'Adamm' in torch.optim (available: ",
        case_id="unknown-optimizer",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"loss": "hinge"})],
        "{tmp}/case.json: loss: unknown name 'hinge' in model.loss "
        f"(available: {available(loss_module)})",
        case_id="unknown-loss",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"metrics": ["accuracy", "f1"]})],
        "{tmp}/case.json: metrics[1]: unknown name 'f1' in model.metric "
        f"(available: {available(metric_module)})",
        case_id="unknown-metric",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"data_loader.type": "MnistDataLoader"})],
        "{tmp}/case.json: data_loader.type: unknown name 'MnistDataLoader' in "
        f"data_loader.data_loaders (available: {available(data_module)})",
        case_id="unknown-data-loader",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"lr_scheduler.type": "Cosine"})],
        "{tmp}/case.json: lr_scheduler.type: unknown name 'Cosine' in torch.optim.lr_scheduler",
        case_id="unknown-scheduler",
    ),
    # Monitor strings.
    case(
        "train",
        lambda env: ["-c", env.config(**{"trainer.monitor": "max val/f1"})],
        '{tmp}/case.json: trainer.monitor: unknown metric "val/f1" (choose from val/loss, ',
        case_id="monitor-unknown-metric",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "trainer.monitor=best val/accuracy"],
        '{tmp}/case.json: trainer.monitor: must be "off" or "min|max <metric>", '
        'got "best val/accuracy"',
        case_id="monitor-bad-mode",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "data_loader.args.validation_split=0"],
        "trainer.monitor watches val/accuracy but there is no validation data",
        case_id="monitor-val-without-validation",
    ),
    # --set paths and values.
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "trainer.epoch=3"],
        "--set trainer.epoch=3: trainer.epoch: unknown key (known here: ",
        case_id="set-unknown-key",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "trainer.epochs"],
        "--set 'trainer.epochs': expected KEY.PATH=VALUE",
        case_id="set-without-value",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "loss.type=nll_loss"],
        "--set loss.type=nll_loss: loss.type: loss is not a section",
        case_id="set-through-a-value",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "metrics.7=accuracy"],
        "--set metrics.7=accuracy: metrics.7: no list index 7 (length 2)",
        case_id="set-list-index",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--run-id", "a/b"],
        "--run-id 'a/b': must be a name of letters",
        case_id="run-id-slash",
    ),
    # Samplers, cross-validation and the classes of the data (data_loader.args, arch.args).
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "data_loader.args.sampler=balanced"],
        '{tmp}/case.json: data_loader.args.sampler: must be one of "random", "sequential", '
        '"subset_random", "weighted", got "balanced"',
        case_id="unknown-sampler",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "data_loader.args.class_weights=[1, 2]"],
        '{tmp}/case.json: data_loader.args.class_weights: only used by sampler "weighted", '
        'not "random"; remove it',
        case_id="class-weights-without-weighted-sampler",
    ),
    case(
        "train",
        lambda env: [
            *["-c", env.config(), "--set", "data_loader.args.shuffle=false"],
            *["--set", "data_loader.args.sampler=weighted"],
        ],
        '{tmp}/case.json: data_loader.args.shuffle: false contradicts sampler "weighted"; '
        "remove shuffle",
        case_id="shuffle-false-with-weighted-sampler",
    ),
    case(
        "train",
        lambda env: [
            *["-c", env.config(), "--set", "data_loader.args.sampler=weighted"],
            *["--set", "data_loader.args.class_weights=[1, 2]"],
        ],
        "data_loader.args.class_weights: 2 weights, but the 'train' split of "
        "SyntheticDataLoader has 10 classes",
        case_id="class-weights-not-one-per-class",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--folds", "1"],
        "{tmp}/case.json: data_loader.args.folds: must be an integer >= 2 or null, got 1",
        case_id="folds-1",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--folds", "3", "--fold", "3"],
        "{tmp}/case.json: data_loader.args.fold: must be a fold index from 0 to 2 (folds is 3), "
        "got 3",
        case_id="fold-out-of-range",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--fold", "0"],
        "{tmp}/case.json: data_loader.args.fold: needs data_loader.args.folds",
        case_id="fold-without-folds",
    ),
    case(
        "train",
        lambda env: ["-r", env.checkpoint, "--folds", "3"],
        "--folds/--fold: {ckpt} continues its own run, folds included",
        case_id="resume-with-folds",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"arch.args.num_classes": 5})],
        "the 'train' split of SyntheticDataLoader: 10 classes, but arch.args.num_classes is 5: "
        "labels 5 to 9 are outside the model's outputs; set arch.args.num_classes to 10",
        case_id="num-classes-below-the-data",
    ),
    # Where data and outputs live.
    case(
        "train",
        lambda env: [
            "-c",
            env.config(
                "configs/imagenet.json", **{"data_loader.args.data_dir": str(env.tmp / "nowhere")}
            ),
        ],
        "{tmp}/nowhere/train: folder not found; expected {tmp}/nowhere/train/<class>/<image>",
        case_id="missing-data-folder",
    ),
    case(
        "train",
        lambda env: [
            "-c",
            env.config(
                "configs/imagenet.json", **{"data_loader.args.data_dir": empty_classes(env)}
            ),
        ],
        "{tmp}/images/train: Found no valid file for the classes cat, dog.",
        case_id="data-folder-without-images",
    ),
    case(
        "train",
        lambda env: [
            "-c",
            env.config(),
            "--set",
            f"trainer.save_dir={env.write('file', 'x')}/saved",
        ],
        "{tmp}/file/saved/models/Demo_CifarCNN/",
        case_id="save-dir-under-a-file",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "--run-id", "base"],
        "{run}: this run already exists; resume it with -r {run}, set trainer.auto_resume, "
        "or choose another --run-id",
        case_id="run-id-exists",
    ),
    # Checkpoints to resume from.
    case(
        "train",
        lambda env: ["-r", str(env.tmp / "gone" / "checkpoint.pth")],
        "{tmp}/gone/checkpoint.pth: checkpoint not found",
        case_id="resume-missing",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(), "-r", str(env.tmp / "gone.pth")],
        "{tmp}/gone.pth: checkpoint not found",
        case_id="resume-missing-with-config",
    ),
    case(
        "train",
        lambda env: ["-r", env.truncated()],
        "{tmp}/truncated/checkpoint.pth: not a readable checkpoint (truncated or corrupted?)",
        case_id="resume-truncated",
    ),
    case(
        "train",
        lambda env: ["-r", env.foreign(torch.zeros(3))],
        "{tmp}/foreign/checkpoint.pth: not a checkpoint written by this template "
        "(expected a dict with keys model, config, epoch)",
        case_id="resume-foreign-tensor",
    ),
    case(
        "train",
        lambda env: ["-r", env.foreign({"state_dict": {"weight": torch.zeros(2)}, "epoch": 3})],
        "{tmp}/foreign/checkpoint.pth: not a checkpoint written by this template",
        case_id="resume-foreign-dict",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"arch.args.widths": [4, 8]}), "-r", env.checkpoint],
        "{ckpt}: its weights (arch CifarCNN) do not fit the configured model",
        case_id="resume-incompatible-model",
    ),
    case(
        "train",
        lambda env: ["-r", env.unsafe()],
        "{tmp}/unsafe/checkpoint.pth: refused to load",
        case_id="resume-unsafe",
    ),
    # Refused at the first batch, before anything is written (issue 31, items 13 and 14): a
    # shift the images cannot take crashed in reflect padding after a whole epoch; a metric
    # whose shapes do not fit broadcast (RMSE of logits (B, 10) against labels (B,)).
    case(
        "train",
        lambda env: ["-c", env.config(), "--set", "trainer.tta_translate=32"],
        "trainer.tta_translate: 32 pixels must be less than the images' height and width, got "
        "images of 32 x 32",
        case_id="tta-translate-too-large",
    ),
    case(
        "train",
        lambda env: ["-c", env.config(**{"metrics": ["accuracy", "RMSE"]})],
        "RMSE: needs an output and a target of one shape (B, ...), got (32, 10) float32 and "
        "(32,) int64",
        case_id="metric-shapes-differ",
    ),
    # test.py
    case(
        "test",
        lambda env: ["-r", str(env.tmp / "gone.pth")],
        "{tmp}/gone.pth: checkpoint not found",
        case_id="test-missing-checkpoint",
    ),
    case(
        "test",
        lambda env: ["-r", env.truncated()],
        "{tmp}/truncated/checkpoint.pth: not a readable checkpoint (truncated or corrupted?)",
        case_id="test-truncated",
    ),
    case(
        "test",
        lambda env: ["-r", env.foreign({"model": {}})],
        "{tmp}/foreign/checkpoint.pth: not a checkpoint written by this template",
        case_id="test-foreign-dict",
    ),
    case(
        "test",
        lambda env: ["-r", env.unsafe()],
        "{tmp}/unsafe/checkpoint.pth: refused to load: it references the Python object",
        case_id="test-unsafe",
    ),
    case(
        "test",
        lambda env: ["-r", env.checkpoint, "--set", "trainer.tta_translate=40"],
        "trainer.tta_translate: 40 pixels must be less than the images' height and width",
        case_id="test-tta-translate-too-large",
    ),
    case(
        "test",
        lambda env: ["-r", env.checkpoint, "--set", "arch.args.widths=[4, 8]"],
        "{ckpt}: its weights (arch CifarCNN) do not fit the configured model",
        case_id="test-incompatible-model",
    ),
    case(
        "test",
        lambda env: [
            *["-r", env.checkpoint, "--split", "val"],
            *["--set", "data_loader.args.validation_split=0"],
        ],
        "this data has no 'val' split (it has: train, test)",
        case_id="test-no-val-split",
    ),
    case(
        "test",
        lambda env: ["-r", env.checkpoint, "--set", "data_loader.args.data_dir.x=1"],
        "data_loader.args.data_dir: unknown key (known here: ",
        case_id="test-set-unknown-path",
    ),
    case(
        "test",
        lambda env: ["-r", env.checkpoint, "--json", str(env.tmp / "no" / "dir" / "out.json")],
        "--json {tmp}/no/dir/out.json: folder {tmp}/no/dir not found",
        case_id="test-json-unwritable",
    ),
    case(  # checked before the JSON is written: an existing report is kept as it was
        "test",
        lambda env: [
            *["-r", env.checkpoint, "--json", env.write("kept.json", '{"kept": true}\n')],
            *["--confusion-png", str(env.tmp / "no" / "dir" / "matrix.png")],
        ],
        "--confusion-png {tmp}/no/dir/matrix.png: folder {tmp}/no/dir not found",
        case_id="test-png-unwritable-keeps-json",
    ),
    case(
        "test",
        lambda env: ["-r", env.checkpoint, "--json", str(env.tmp), "--confusion-png", "m.png"],
        "--json {tmp}: is a folder",
        case_id="test-json-is-a-folder",
    ),
    case(
        "test",
        lambda env: [
            *["-r", env.checkpoint, "--json", env.write("both.json", "{}\n")],
            *["--confusion-png", str(env.tmp / "both.json")],
        ],
        "--json and --confusion-png: both name {tmp}/both.json",
        case_id="test-json-and-png-one-file",
    ),
    case(  # as predict.py --out: an earlier report is not lost to a rerun
        "test",
        lambda env: ["-r", env.checkpoint, "--json", env.write("old.json", '{"kept": true}\n')],
        "--json {tmp}/old.json: already exists; pass --force to replace it",
        case_id="test-json-exists",
    ),
    case(
        "test",
        lambda env: [
            *["-r", env.checkpoint, "--json", str(env.tmp / "new.json")],
            *["--confusion-png", env.write("old.png", "not replaced\n")],
        ],
        "--confusion-png {tmp}/old.png: already exists; pass --force to replace it",
        case_id="test-png-exists",
    ),
]


def test_test_py_force_replaces_an_existing_report(env, capsys):
    report = Path(env.write("old.json", '{"kept": true}\n'))
    image = Path(env.write("old.png", "old\n"))
    argv = ["-r", env.checkpoint, "--json", str(report), "--confusion-png", str(image)]

    code = ENTRY_POINTS["test"].main([*argv, "--force"])

    assert code == 0, capsys.readouterr().err
    assert json.loads(report.read_text())["num_samples"] > 0
    assert image.read_bytes().startswith(b"\x89PNG")


# A run's files that no command's output may replace, even with --force: (the file, the
# checkpoint the command reads). "a renamed input" is a copy of the checkpoint named like a report.
PROTECTED = {
    "the checkpoint read": lambda env: (env.checkpoint, env.checkpoint),
    "another checkpoint": lambda env: (str(env.run_dir / "model_best.pth"), env.checkpoint),
    "the run's config.json": lambda env: (str(env.run_dir / "config.json"), env.checkpoint),
    "the run's latest": lambda env: (str(env.run_dir / "latest"), env.checkpoint),
    "the run's info.log": lambda env: (
        str(env.saved / "log" / RUN_NAME / "base" / "info.log"),
        env.checkpoint,
    ),
    "a fold's result.json not yet written": lambda env: (
        str(env.run_dir / "result.json"),
        env.checkpoint,
    ),
    "a renamed input": lambda env: (
        (copy := shutil.copy(env.checkpoint, env.tmp / "copy.json")),
        copy,
    ),
}
# Each command's output flag, and the arguments it needs besides -r and that flag.
OUTPUT_FLAGS = {
    "test --json": ("test", "--json", []),
    "test --confusion-png": ("test", "--confusion-png", []),
    "predict --out": ("predict", "--out", ["{tmp}/image.png"]),
}


@pytest.mark.parametrize("command", OUTPUT_FLAGS)
@pytest.mark.parametrize("protected", PROTECTED)
def test_no_output_replaces_a_run_file_or_an_input_even_with_force(env, capsys, command, protected):
    """The invariant: whatever the command and the file, a run's checkpoint, config.json and
    logs, and the checkpoint read, are never written over; the refusal is one line, exit 2."""
    from PIL import Image

    Image.new("RGB", (32, 32), "red").save(env.tmp / "image.png")
    script, flag, extra = OUTPUT_FLAGS[command]
    target, checkpoint = PROTECTED[protected](env)
    argv = ["-r", str(checkpoint), flag, str(target), "--force"]
    argv += [text.format(tmp=env.tmp) for text in extra]
    before = snapshot(env.tmp)

    code = ENTRY_POINTS[script].main(argv)

    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert_one_error_line(stderr, f"{flag} {target}: ")
    assert snapshot(env.tmp) == before


@pytest.mark.parametrize("name", ["result.json", "metrics.csv"])
def test_a_report_named_like_a_run_file_outside_a_run_is_replaced_with_force(env, capsys, name):
    """Only in a run's (or its log's) folder is result.json or metrics.csv the run's own: a
    user's report of that name elsewhere is replaced with --force, as any report."""
    from PIL import Image

    Image.new("RGB", (32, 32), "red").save(env.tmp / "image.png")
    report = Path(env.write(name, "old\n"))
    argv = ["-r", env.checkpoint, str(env.tmp / "image.png"), "--out", str(report), "--force"]

    assert ENTRY_POINTS["predict"].main(argv) == 0, capsys.readouterr().err

    assert report.read_text() != "old\n"


def test_test_py_json_over_its_own_checkpoint_is_refused(env, capsys):
    """The case found: test.py --json CKPT --force wrote the report over the checkpoint."""
    argv = ["-r", env.checkpoint, "--json", env.checkpoint, "--force"]

    assert ENTRY_POINTS["test"].main(argv) == 2

    assert_one_error_line(
        capsys.readouterr().err,
        f"--json {env.checkpoint}: names a run's file (a checkpoint, config.json or log); it "
        "is not written, even with --force",
    )
    assert torch.load(env.checkpoint, weights_only=True)["epoch"] == 1


def empty_classes(env: Env) -> str:
    """tmp/images with train/cat/ and train/dog/ but no image in them."""
    for name in ("cat", "dog"):
        (env.tmp / "images" / "train" / name).mkdir(parents=True)
    return str(env.tmp / "images")


def expected_text(template: str, env: Env) -> str:
    return template.format(tmp=env.tmp, run=env.run_dir, ckpt=env.checkpoint)


def assert_one_error_line(stderr: str, expected: str) -> None:
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    assert expected in lines[0]


@pytest.mark.parametrize(("script", "build", "expected"), CASES)
def test_bad_input_is_reported_in_one_line(env, capsys, script, build, expected):
    argv = build(env)
    before = snapshot(env.tmp)

    code = ENTRY_POINTS[script].main(argv)

    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert_one_error_line(captured.err, expected_text(expected, env))
    # Nothing under tmp (saved/ and the working directory) was created, changed or removed.
    assert snapshot(env.tmp) == before
    assert not env.marker.exists()


def test_enough_cases():
    assert len(CASES) >= 25


def test_unknown_split_is_an_argparse_error(env, capsys):
    before = snapshot(env.tmp)
    with pytest.raises(SystemExit) as exit_info:
        ENTRY_POINTS["test"].main(["-r", env.checkpoint, "--split", "train"])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert "argument --split: invalid choice: 'train'" in stderr
    assert "Traceback" not in stderr
    assert snapshot(env.tmp) == before


def test_unsafe_payload_runs_code_when_loaded_without_weights_only(tmp_path):
    """The unsafe cases above prove something: this payload does act when fully unpickled."""
    marker = tmp_path / "ran"
    torch.save(unsafe_payload(marker), tmp_path / "unsafe.pth")
    torch.load(tmp_path / "unsafe.pth", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize(
    ("script", "build", "expected"),
    [
        case(
            "train.py",
            lambda env: ["-c", env.write("bad.json", '{"name": "x",}')],
            "{tmp}/bad.json: invalid JSON at line 1, column 14",
            case_id="malformed-json",
        ),
        case(
            "test.py",
            lambda env: ["-r", env.truncated()],
            "{tmp}/truncated/checkpoint.pth: not a readable checkpoint (truncated or corrupted?)",
            case_id="truncated-checkpoint",
        ),
    ],
)
def test_bad_input_in_a_subprocess(env, script, build, expected):
    argv = build(env)
    before = snapshot(env.tmp)

    result = run_script(str(ROOT / script), *argv, cwd=env.tmp)

    assert result.returncode == 2, result.stderr
    assert_one_error_line(result.stderr, expected_text(expected, env))
    assert snapshot(env.tmp) == before


def test_other_classes_are_refused_in_one_short_line():
    """test.py's class check (the data's class i is scored against the model's output i): equal
    lists pass, a shift is refused, and ImageNet's 1000 names are not printed whole."""
    check_names = ENTRY_POINTS["test"].check_names

    class Data:
        def __init__(self, classes: list[str]) -> None:
            self.classes = classes

        def feature_names(self) -> list[str]:
            return []

        def class_names(self) -> list[str]:
            return self.classes

    names = [f"n{index:08d}" for index in range(1000)]
    state = {"feature_names": [], "class_names": names}
    check_names(state, Data(list(names)), Path("ckpt.pth"))
    check_names({}, Data(names[1:]), Path("ckpt.pth"))  # a checkpoint that kept no names
    with pytest.raises(UserError) as error:
        check_names(state, Data(names[1:]), Path("ckpt.pth"))
    message = str(error.value)
    assert "\n" not in message and len(message) < 400, message
    assert "n00000001, n00000002" in message and "(999 in all)" in message, message
