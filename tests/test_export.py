"""export.py: files that compute the eager model's logits (the parity check) and load back in
plain torch, without this repository, for the demo CNN and a torchvision ResNet-18.

ONNX runs only where its optional packages (onnx, onnxscript) are installed, and is skipped with
the reason otherwise. The checkpoints come from a real train.py run (conftest's demo_checkpoint)
or are written here as train.py writes them.

export.py runs in-process (conftest's run_main) but once: the demo CNN to torch.export, the
recommended format, is a real `python export.py` process. The docs' loading lines always run in
a Python of their own, which has torch but not this repository.
"""

import importlib.util
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import ROOT, run_main, run_script
from hypothesis import given, settings
from hypothesis import strategies as st

import export
import model.model as arch_module
from base.evaluation import averaged_over_views
from build import load_inference_model
from data_loader.tabular import TabularDataLoader
from model.model import CifarCNN, TabularMLP
from utils.evaluation.tracing import value_reads

ONNX_MISSING = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
FORMATS = [
    pytest.param("export", ".pt2", id="export"),
    pytest.param("torchscript", ".pt", id="torchscript"),
    pytest.param(
        "onnx", ".onnx", id="onnx",
        marks=pytest.mark.skipif(
            bool(ONNX_MISSING), reason=f"optional packages not installed: {', '.join(ONNX_MISSING)}"
        ),
    ),
]  # fmt: skip
PARITY = re.compile(
    r"max \|logit difference\| vs the eager model: (\S+) \(largest \|logit\| (\S+);"
)
DOCS = ROOT / "docs" / "predict-export.md"
SAVE_INPUTS_AND_LOGITS = """
import numpy
numpy.save("images.npy", numpy.asarray(images))
numpy.save("logits.npy", numpy.asarray(logits))
"""


def export_file(
    checkpoint: Path,
    format_name: str,
    out: Path,
    run: Callable[..., subprocess.CompletedProcess] = run_main,
) -> tuple[float, float]:
    """Run export.py, in-process unless `run` is run_script; (the parity difference it printed,
    the largest |logit|)."""
    arguments = ["-r", str(checkpoint), "--format", format_name, "--out", str(out)]
    result = run("export.py", *arguments)
    assert result.returncode == 0, result.stderr[-3000:]
    found = PARITY.search(result.stdout)
    assert found, result.stdout
    assert out.is_file() and [path.name for path in out.parent.iterdir()] == [out.name]
    return float(found.group(1)), float(found.group(2))


def snippets(suffix: str) -> list[str]:
    """The python blocks of the docs and the README that load a file with this suffix, e.g.
    model.pt2: one in docs/predict-export.md for each format, and the README's."""
    text = DOCS.read_text(encoding="utf-8") + (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    found = [block for block in blocks if f'"model{suffix}"' in block]
    assert len(found) == (2 if suffix == ".pt2" else 1), found
    return found


@pytest.mark.parametrize(("format_name", "suffix"), FORMATS)
def test_demo_cnn_parity_and_the_docs_way_to_load_it(
    demo_checkpoint, tmp_path, format_name, suffix
):
    out = tmp_path / f"model{suffix}"
    # One real `python export.py` (this file is its end-to-end test): the recommended format.
    run = run_script if format_name == "export" else run_main
    difference, scale = export_file(demo_checkpoint, format_name, out, run)
    assert difference <= export.TOLERANCE and scale > 0.1  # logits large enough to compare
    print(f"demo CNN {format_name}: logit difference {difference:.3g}, logits up to {scale:.3g}")
    if format_name == "onnx" and importlib.util.find_spec("onnxruntime") is None:
        pytest.skip("optional onnxruntime not installed: the docs' ONNX lines need it")
    model, _, _ = load_inference_model(demo_checkpoint)
    for block in snippets(suffix):
        # The docs' lines, run by a Python that has only torch (and onnxruntime), not this
        # repository.
        result = run_script("-c", block + SAVE_INPUTS_AND_LOGITS, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        images = torch.from_numpy(np.load(tmp_path / "images.npy"))
        with torch.no_grad():
            expected = model(images)
        assert expected.shape == (len(images), 10)
        logits = torch.from_numpy(np.load(tmp_path / "logits.npy"))
        assert (logits - expected).abs().max() <= export.TOLERANCE


@pytest.mark.parametrize(("format_name", "suffix"), FORMATS)
def test_torchvision_resnet18_parity(tmp_path, format_name, suffix):
    """configs/finetune.json at 32 pixels, randomly initialised: its ImageNet weights are not
    downloaded and its data folder does not exist; the checkpoint is all export.py needs."""
    config = json.loads((ROOT / "configs" / "finetune.json").read_text())
    config["data_loader"]["args"].update(image_size=32, data_dir=str(tmp_path / "nowhere"))
    torch.manual_seed(0)
    from model.model import TorchvisionModel

    model = TorchvisionModel("resnet18", num_classes=10)
    checkpoint = tmp_path / "checkpoint-epoch1.pth"
    torch.save({"model": model.state_dict(), "config": config, "epoch": 1}, checkpoint)
    (tmp_path / "out").mkdir()
    difference, scale = export_file(checkpoint, format_name, tmp_path / "out" / f"model{suffix}")
    assert difference <= export.TOLERANCE and scale > 0.1
    print(f"resnet18 {format_name}: logit difference {difference:.3g}, logits up to {scale:.3g}")


def test_ema_exports_the_averaged_weights(demo_checkpoint, tmp_path, capsys):
    state = torch.load(demo_checkpoint, weights_only=True)
    averaged = {f"module.{key}": value.clone() for key, value in state["model"].items()}
    averaged["module.head.weight"].zero_()  # averaged weights whose logits are all zero
    averaged["module.head.bias"].zero_()
    state["ema"] = {**averaged, "n_averaged": torch.tensor(3)}
    torch.save(state, tmp_path / "ema.pth")
    out = tmp_path / "ema.pt2"
    assert export.main(["-r", str(tmp_path / "ema.pth"), "--out", str(out), "--ema"]) == 0
    with torch.inference_mode():
        logits = torch.export.load(out).module()(torch.randn(3, 3, 32, 32))
    assert torch.equal(logits, torch.zeros(3, 10))


@pytest.mark.parametrize("flags", [[], ["--weights", "auto"]])
def test_auto_exports_the_averaged_weights_the_monitor_judged(
    demo_checkpoint, tmp_path, capsys, flags
):
    """A run whose trainer.monitor watched val/ema_...: test.py scores its averaged weights by
    default, and so does the file."""
    state = torch.load(demo_checkpoint, weights_only=True)
    averaged = {f"module.{key}": value.clone() for key, value in state["model"].items()}
    averaged["module.head.weight"].zero_()  # averaged weights whose logits are all zero
    averaged["module.head.bias"].zero_()
    state.update(ema={**averaged, "n_averaged": torch.tensor(3)}, weights="ema")
    state["config"]["trainer"].update(ema_decay=0.99, monitor="max val/ema_accuracy")
    torch.save(state, tmp_path / "ema.pth")
    out = tmp_path / "ema.pt2"
    assert export.main(["-r", str(tmp_path / "ema.pth"), "--out", str(out), *flags]) == 0
    assert capsys.readouterr().out.startswith(
        f"{tmp_path / 'ema.pth'}: the averaged weights (trainer.monitor 'max val/ema_accuracy' "
        "judged them)\n"
    )
    with torch.inference_mode():
        logits = torch.export.load(out).module()(torch.randn(3, 3, 32, 32))
    assert torch.equal(logits, torch.zeros(3, 10))


def test_a_parity_failure_writes_nothing(demo_checkpoint, tmp_path, capsys, monkeypatch):
    out = tmp_path / "model.pt2"
    exporter = export.EXPORTERS["export"]

    def off_by_a_little(model, inputs, path, signature):
        run_file = exporter(model, inputs, path, signature)
        return lambda images: run_file(images) + 0.01

    monkeypatch.setitem(export.EXPORTERS, "export", off_by_a_little)
    assert export.main(["-r", str(demo_checkpoint), "--out", str(out)]) == 1
    printed, err = capsys.readouterr()
    scale = float(PARITY.search(printed).group(2))
    allowed = export.TOLERANCE * max(1, scale)
    assert allowed < 0.01  # the demo's logits are under 100
    assert err == (
        f"error: export: the exported model's logits differ from the eager model's by 0.01 > "
        f"{allowed:.3g} (0.0001 x max(1, largest |logit| {scale:.3g})); {out} not written\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_an_output_of_another_shape_is_a_parity_failure(
    demo_checkpoint, tmp_path, capsys, monkeypatch
):
    """The file's logits with an extra leading dim, (1, B, K): the same values, which the
    difference broadcast against the eager (B, K) and passed as 0; a caller indexing the
    file's output by sample would get the whole batch."""
    exporter = export.EXPORTERS["export"]

    def one_more_dim(model, inputs, path, signature):
        run_file = exporter(model, inputs, path, signature)
        return lambda images: run_file(images).unsqueeze(0)

    monkeypatch.setitem(export.EXPORTERS, "export", one_more_dim)
    out = tmp_path / "model.pt2"
    assert export.main(["-r", str(demo_checkpoint), "--out", str(out)]) == 1
    assert capsys.readouterr().err == (
        "error: export: the exported model gives shape (1, 8, 10) on batch 8, the eager model "
        f"(8, 10); {out} not written\n"
    )
    assert list(tmp_path.iterdir()) == []


def regression_checkpoint(folder: Path, target_mean: float) -> Path:
    """configs/tabular.json's TabularMLP (randomly initialised), its outputs in a target's
    units around target_mean (e.g. prices): its standardisation buffers set as fit_data sets
    them."""
    config = json.loads((ROOT / "configs" / "tabular.json").read_text())
    torch.manual_seed(0)
    model = TabularMLP(**config["arch"]["args"])
    model.target_mean.fill_(target_mean)
    model.target_std.fill_(target_mean / 3)
    checkpoint = folder / "regression.pth"
    torch.save({"model": model.state_dict(), "config": config, "epoch": 1}, checkpoint)
    return checkpoint


def test_float32_rounding_of_large_outputs_is_not_a_parity_failure(tmp_path, monkeypatch):
    """A regression predicting prices near 3e5, whose exported file differs by float32's
    rounding there (2e-7 relative, 0.06 absolute; ONNX's fused kernels do): the file was
    refused against an absolute 1e-4, which no float32 of that size can meet."""
    exporter = export.EXPORTERS["export"]

    def rounded_otherwise(model, inputs, path, signature):
        run_file = exporter(model, inputs, path, signature)
        return lambda rows: run_file(rows) * (1 + 2e-7)

    monkeypatch.setitem(export.EXPORTERS, "export", rounded_otherwise)
    checkpoint = regression_checkpoint(tmp_path, 3e5)
    out = tmp_path / "out" / "model.pt2"
    out.parent.mkdir()
    result = run_main("export.py", "-r", str(checkpoint), "--out", str(out))
    assert result.returncode == 0, result.stderr
    difference, scale = map(float, PARITY.search(result.stdout).groups())
    assert 1e-4 < difference <= export.TOLERANCE * scale and out.is_file()


CASES = {
    "out exists": (["--out", "{t}/kept.pt2"], "--out {t}/kept.pt2: already exists; pass --force"),
    "wrong suffix": (["--out", "{t}/m.onnx"], "--out {t}/m.onnx: a --format export file must end in"),
    "no folder": (["--out", "{t}/no/m.pt2"], "--out {t}/no/m.pt2: folder {t}/no not found"),
    "missing checkpoint": (["-r", "{t}/none.pth", "--out", "{t}/m.pt2"], "{t}/none.pth: checkpoint not found"),
    "run folder": (["-r", "{t}", "--out", "{t}/m.pt2"], "{t}: a folder, not a checkpoint file; pass a checkpoint in it (e.g. {t}/model_best.pth)"),
    "no averaged weights": (["--ema", "--out", "{t}/m.pt2"], "{c}: holds no averaged weights"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_writes_nothing(case, demo_checkpoint, tmp_path, capsys):
    (tmp_path / "kept.pt2").write_text("keep me")
    arguments, expected = CASES[case]
    arguments = [argument.format(t=tmp_path) for argument in arguments]
    if "-r" not in arguments:
        arguments = ["-r", str(demo_checkpoint), *arguments]
    assert export.main(arguments) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: " + expected.format(t=tmp_path, c=demo_checkpoint)), err
    assert err.count("\n") == 1 and out == ""
    assert [path.name for path in tmp_path.iterdir()] == ["kept.pt2"]
    assert (tmp_path / "kept.pt2").read_text() == "keep me"


FORCED = {
    "a folder": ("export", "{t}/folder.pt2", "--out {t}/folder.pt2: is a folder"),
    "the checkpoint": (
        "torchscript", "{t}/model.pt", "--out {t}/model.pt: is the checkpoint to export (-r); name "
        "another file",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", FORCED)
def test_force_replaces_neither_a_folder_nor_the_checkpoint(
    case, demo_checkpoint, tmp_path, capsys
):
    """A folder named --out with --force was found after the whole export, as a traceback of
    os.replace; a checkpoint named model.pt exported to itself was replaced by the file."""
    (tmp_path / "folder.pt2").mkdir()
    checkpoint = tmp_path / "model.pt"
    checkpoint.write_bytes(demo_checkpoint.read_bytes())
    format_name, out, expected = (text.format(t=tmp_path) for text in FORCED[case])
    arguments = ["-r", str(checkpoint), "--format", format_name, "--out", out, "--force"]
    assert export.main(arguments) == 2
    out, err = capsys.readouterr()
    assert err == f"error: {expected}\n" and out == ""
    assert sorted(path.name for path in tmp_path.iterdir()) == ["folder.pt2", "model.pt"]
    assert checkpoint.read_bytes() == demo_checkpoint.read_bytes()


def test_onnx_without_its_packages_names_the_extra(demo_checkpoint, tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec

    def without_onnx(name: str, *rest):
        return None if name in ("onnx", "onnxscript") else find_spec(name, *rest)

    monkeypatch.setattr(importlib.util, "find_spec", without_onnx)
    arguments = ["-r", str(demo_checkpoint), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]
    assert export.main(arguments) == 2
    assert capsys.readouterr().err == (
        "error: --format onnx needs the optional packages onnx and onnxscript (onnx, onnxscript "
        "not installed): pip install onnx onnxscript onnxruntime (pyproject.toml's onnx extra)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_size_the_eager_model_refuses_by_value_error_is_left_out():
    """A model that refuses a size with a ValueError (the U-Net's, for a size its stride does
    not divide), as with a RuntimeError: that size is not checked, the others are."""

    def multiples_of_4(images: torch.Tensor) -> torch.Tensor:
        if images.shape[-1] % 4:
            raise ValueError(f"width must be a multiple of 4, got {images.shape[-1]}")
        return images

    checked = export.resized(multiples_of_4, torch.zeros(2, 3, 4, 4), {3: "width"})
    assert [label for label, _ in checked] == ["width 8"]


class ValueBranchCNN(CifarCNN):
    """The demo CNN, its logits negated for a batch darker than any normalised image: a branch
    on the data that the random example inputs never take."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = super().forward(images)
        if images.mean() < -100:  # a Python bool of a tensor's value: no trace keeps it
            return -logits
        return logits


BRANCH_LINE = f"{Path(__file__)}:{ValueBranchCNN.forward.__code__.co_firstlineno + 2}"


@pytest.mark.parametrize(("format_name", "suffix"), FORMATS)
def test_a_model_that_branches_on_values_is_refused_in_one_line(
    demo_checkpoint, tmp_path, capsys, monkeypatch, format_name, suffix
):
    """TorchScript traced the branch of the example inputs and wrote a file that ignores it
    (the parity check never saw a dark batch); torch.export failed with a traceback."""
    monkeypatch.setattr(arch_module, "ValueBranchCNN", ValueBranchCNN, raising=False)
    monkeypatch.setattr(arch_module, "__all__", [*arch_module.__all__, "ValueBranchCNN"])
    state = torch.load(demo_checkpoint, weights_only=True)
    state["config"]["arch"]["type"] = "ValueBranchCNN"
    checkpoint = tmp_path / "branch.pth"
    torch.save(state, checkpoint)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / f"model{suffix}"
    assert export.main(["-r", str(checkpoint), "--format", format_name, "--out", str(out)]) == 2
    _, err = capsys.readouterr()
    assert err == (
        f"error: {checkpoint}: the model reads a tensor's value in Python at {BRANCH_LINE} (a "
        "branch on the data, .item()); an exported file would take the branch of the example "
        "inputs for every input: write it with tensor operations (e.g. torch.where)\n"
    )
    assert list((tmp_path / "out").iterdir()) == []


def test_a_model_torch_cannot_export_is_one_line_and_writes_nothing(
    demo_checkpoint, tmp_path, capsys, monkeypatch
):
    def unsupported(model, inputs, path, signature):
        path.write_bytes(b"half a file")
        raise RuntimeError("an operator the exporter lacks\nand torch's advice on it")

    monkeypatch.setitem(export.EXPORTERS, "export", unsupported)
    out = tmp_path / "model.pt2"
    assert export.main(["-r", str(demo_checkpoint), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "error: export: torch cannot export this model (RuntimeError: an operator the exporter "
        f"lacks); {out} not written\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("format_name", "suffix"), FORMATS)
def test_the_exported_file_is_the_eager_model_on_any_batch(
    demo_checkpoint, tmp_path, format_name, suffix
):
    """Exported at batch 8: the file's logits are the eager model's (load_inference_model's,
    in evaluation mode: its dropout off, its BatchNorm's running statistics) within TOLERANCE,
    for any batch size, inputs of any scale and either memory format (channels_last), none of
    which the parity check ran."""
    out = tmp_path / f"model{suffix}"
    export_file(demo_checkpoint, format_name, out)
    model, _, _ = load_inference_model(demo_checkpoint)
    run_file = {
        "export": lambda: torch.export.load(out).module(),
        "torchscript": lambda: torch.jit.load(out, map_location="cpu"),
        "onnx": lambda: onnx_runner(out),
    }[format_name]()

    @settings(max_examples=20, deadline=None)
    @given(
        batch=st.integers(1, 19),
        scale=st.floats(0.01, 100),
        seed=st.integers(0, 2**16),
        channels_last=st.booleans(),
    )
    def check(batch: int, scale: float, seed: int, channels_last: bool) -> None:
        images = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
        images *= scale
        if channels_last:  # what a run with trainer.channels_last feeds its model
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            expected, found = model(images), run_file(images)
        # Relative to the logits' size: inputs 100 times larger make logits that large.
        assert (found - expected).abs().max() <= export.TOLERANCE * max(1, expected.abs().max())

    check()


def onnx_runner(path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    """The .onnx file as a function of a batch, through onnxruntime."""
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda images: torch.from_numpy(session.run(None, {"images": images.numpy()})[0])


@settings(max_examples=25, deadline=None)
@given(
    means=st.lists(st.floats(-1e4, 1e4), min_size=10, max_size=10),
    stds=st.lists(st.floats(1e-2, 1e3), min_size=10, max_size=10),
)
def test_a_tables_example_inputs_are_spread_as_its_training_rows(means, stds):
    """export.py checks a TabularMLP on rows as its standardisation sees training rows (about
    mean 0, std 1 each), not on standard normal rows, which a column of years (mean 2000, std
    10) standardises to -200: a check of values the model never meets."""
    model = TabularMLP(in_features=10)
    model.input_mean.copy_(torch.tensor(means))
    model.input_std.copy_(torch.tensor(stds))
    rows = TabularDataLoader.example_inputs({}, model, 8)
    assert rows.shape == (8, 10) and rows.dtype == torch.float32
    standardised = (rows.double() - model.input_mean) / model.input_std  # (8, 10)
    assert standardised.mean().abs() < 0.5 and 0.5 < standardised.std() < 1.5


def test_a_column_of_years_is_checked_near_its_years():
    model = TabularMLP(in_features=10)
    model.input_mean.fill_(2000.0)
    model.input_std.fill_(10.0)
    rows = TabularDataLoader.example_inputs({}, model, 8)
    assert rows.min() > 1950 and rows.max() < 2050


def test_a_run_with_test_time_augmentation_exports_the_average_test_py_scores(
    demo_checkpoint, tmp_path
):
    """trainer.tta_flip and tta_translate: test.py scores the model averaged over 6 views of
    each image (base/evaluation.py's averaged_over_views); the file held the plain model."""
    state = torch.load(demo_checkpoint, weights_only=True)
    state["config"]["trainer"].update(tta_flip=True, tta_translate=1)
    checkpoint = tmp_path / "tta.pth"
    torch.save(state, checkpoint)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "model.pt2"
    export_file(checkpoint, "export", out)
    model, config, _ = load_inference_model(checkpoint)
    trainer = SimpleNamespace(options=config["trainer"], model=model)
    images = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), averaged_over_views(trainer, model):
        expected = trainer.model(images)  # (5, 10), test.py's
        plain = model(images)
    with torch.inference_mode():
        found = torch.export.load(out).module()(images)
    assert (found - expected).abs().max() <= export.TOLERANCE < (plain - expected).abs().max()


class ReadsIn(torch.nn.Module):
    """A tiny model whose forward is `read`: each reads the input's values in Python."""

    def __init__(self, read: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.read = read

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.read(inputs)


# BatchNorm's forward reads the size of the rows a mask kept: torch's code, not the model's.
MASKED_NORM = torch.nn.BatchNorm1d(3).eval()
READS = {  # each read on its own line: value_reads names it
    "tolist": lambda x: x * x.sum().tolist(),
    "tolist of a vector": lambda x: x * x[0].tolist()[1],
    "item": lambda x: x * x.sum().item(),
    "int": lambda x: x * int(x.sum()),
    "float": lambda x: x * float(x.sum()),
    "bool": lambda x: x * 2 if bool(x.sum() > 0) else x,
    "if": lambda x: x * 2 if x.sum() > 0 else x,
    "numpy": lambda x: x * float(x.sum().numpy()),
    "numpy's asarray": lambda x: x * np.asarray(x).sum(),
    "len of nonzero": lambda x: x * len(x.nonzero()),
    "shape of a masked tensor": lambda x: x * x[x > 0].shape[0],
    "size of nonzero": lambda x: x * x.nonzero().size(0),
    "numel of unique": lambda x: x * torch.unique(x.round()).numel(),
}
NOT_READS = {  # shapes that are not the data's, and sizes only torch's own code reads
    "a shape": lambda x: x * x.shape[0],
    "an integer index": lambda x: x * len(x[torch.tensor([0, 1])]),
    "a masked sum": lambda x: x + x[x > 0].sum(),
    "a module on a masked tensor": lambda x: MASKED_NORM(x[(x > -100).all(dim=1)]).sum() + x,
}


@pytest.mark.parametrize("name", list(READS))
def test_every_read_of_a_tensors_value_in_python_is_found(name):
    """Before: .tolist(), .numpy(), numpy's asarray and a size the data decides (len of
    nonzero) were not found, and TorchScript traced the example inputs' value into the file."""
    read = READS[name]
    line = f"{Path(__file__)}:{read.__code__.co_firstlineno}"
    assert value_reads(ReadsIn(read).eval(), torch.randn(4, 3)) == [line]


@pytest.mark.parametrize("name", list(NOT_READS))
def test_shapes_that_are_not_the_datas_are_not_reads(name):
    assert value_reads(ReadsIn(NOT_READS[name]).eval(), torch.randn(4, 3)) == []


class TolistCNN(CifarCNN):
    """The demo CNN scaled by a Python float of its input's mean: TorchScript kept the example
    inputs' mean for every input."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return super().forward(images) * images.mean().tolist()


def test_a_model_that_reads_tolist_is_refused_in_one_line(
    demo_checkpoint, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(arch_module, "TolistCNN", TolistCNN, raising=False)
    monkeypatch.setattr(arch_module, "__all__", [*arch_module.__all__, "TolistCNN"])
    state = torch.load(demo_checkpoint, weights_only=True)
    state["config"]["arch"]["type"] = "TolistCNN"
    checkpoint = tmp_path / "tolist.pth"
    torch.save(state, checkpoint)
    out = tmp_path / "model.pt"
    assert export.main(["-r", str(checkpoint), "--format", "torchscript", "--out", str(out)]) == 2
    line = f"{Path(__file__)}:{TolistCNN.forward.__code__.co_firstlineno + 1}"
    assert f"reads a tensor's value in Python at {line} " in capsys.readouterr().err
    assert not out.exists()
