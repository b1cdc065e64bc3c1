"""benchmarks/cifar_recipe.py end to end on a few dozen made-up JPEGs: seeds, the final model with
and without test-time augmentation, --compare and --full. train.py and test.py are the real
entry points, called in this process (run_main) where the script would start them."""

import csv
import json
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, run_main, without_muon
from PIL import Image

from benchmarks import cifar_recipe

# Any CIFAR-10 config made tiny. The arch is replaced whole, so this holds whichever network
# config.json trains; TTA is set, its weight too (the run without TTA must reset it to 1).
TINY = [
    *("--set", "n_gpu=0"),
    *("--set", 'arch={"type": "FastCifarCNN", "args": {"widths": [8, 16, 16], "whiten_samples": 20}}'),
    *("--set", "data_loader.args.batch_size=16"),
    *("--set", "data_loader.args.num_workers=0"),
    *("--set", "trainer.amp=null"),
    *("--set", "trainer.tta_flip=true"),
    *("--set", "trainer.tta_translate=1"),
    *("--set", "trainer.tta_translate_weight=0.5"),
]  # fmt: skip
# On a torch without torch.optim.Muon (CI's floor job), config.json's filters on optimizer.type.
_recipe = json.loads((ROOT / "config.json").read_text())
if not hasattr(torch.optim, "Muon"):
    _recipe = without_muon(_recipe)
    TINY += [
        *("--set", f"optimizer.param_groups={json.dumps(_recipe['optimizer']['param_groups'])}"),
        *("--set", f"lr_scheduler.args.max_lr={json.dumps(_recipe['lr_scheduler']['args']['max_lr'])}"),
    ]  # fmt: skip


def image_folder(root: Path, per_class: int, seed: int = 0) -> Path:
    """root/<class k>/<n>.jpg: 32x32 JPEGs, 10 classes, each a colour of its own plus noise."""
    rng = np.random.default_rng(seed)
    for label in range(10):
        folder = root / f"class{label}"
        folder.mkdir(parents=True)
        for index in range(per_class):
            pixels = rng.normal(25 * label, 40, size=(32, 32, 3)).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{index}.jpg")
    return root


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The script's train.py and test.py commands, as it makes them, each run by run_main."""
    made = []

    def run_python(arguments: list[str]) -> int:
        made.append(arguments)
        result = run_main(*arguments)
        if result.returncode != 0:
            print(result.stderr[-3000:])
        return result.returncode

    monkeypatch.setattr(cifar_recipe, "run_python", run_python)
    return made


def table_row(output: str, config: str) -> list[str]:
    """The cells of the summary table's row of `config`."""
    (line,) = [line for line in output.splitlines() if line.startswith(f"| {config} |")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def spread(values: list[float]) -> str:
    """Two or more seeds' figure as the table writes it, computed here from the seeds'."""
    return (
        f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f} "
        f"({min(values):.4f}-{max(values):.4f})"
    )


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    (metrics,) = run_dir.glob("log/*/*/metrics.csv")
    with metrics.open() as file:
        return list(csv.DictReader(file))


def final_val_accuracy(run_dir: Path) -> float:
    """The last epoch's val/accuracy in the run's metrics.csv: validation's, with its TTA."""
    return float(metrics_rows(run_dir)[-1]["val/accuracy"])


def test_seeds_are_summarised_by_their_mean_and_the_model_is_scored_again_without_tta(
    tmp_path, commands, capsys
):
    data = tmp_path / "cifar"
    image_folder(data / "train", per_class=6)  # 60 images: 40 to train, 20 to validate on
    other = tmp_path / "other.json"  # --compare: config.json at half its learning rate
    config = json.loads((ROOT / "config.json").read_text())
    config["optimizer"]["args"]["lr"] /= 2
    other.write_text(json.dumps(config))
    out = tmp_path / "out"
    split = ["--set", "data_loader.args.validation_split=20"]
    arguments = ["--seeds", "2", "--seed", "3", "--epochs", "1", "--compare", str(other)]
    # Above any accuracy: exit 1 after the whole report, the figure last.
    code = cifar_recipe.main(
        [*arguments, "--data", str(data), "--out", str(out), "--min-accuracy", "1.01", *TINY, *split]
    )  # fmt: skip
    output = capsys.readouterr().out
    assert code == 1, output
    trains = [command for command in commands if command[0] == "train.py"]
    assert [command[command.index("--run-id") + 1] for command in trains] == ["seed3", "seed4"] * 2
    tests = [command for command in commands if command[0] == "test.py"]
    for name in ("config", "other"):
        runs = [out / name / f"seed{seed}" for seed in (3, 4)]
        assert [json.loads((run / "config.json").read_text())["seed"] for run in runs] == [3, 4]
        # Without TTA: test.py on each run's final checkpoint, TTA turned off, its own figure.
        for run in runs:
            (command,) = [c for c in tests if c[c.index("--json") + 1] == str(run / "no_tta.json")]
            assert command[command.index("-r") + 1].startswith(str(run / "models"))
            assert command[command.index("--split") + 1] == "val"
            assert command[-len(cifar_recipe.NO_TTA) :] == cifar_recipe.NO_TTA
        with_tta = [final_val_accuracy(run) for run in runs]
        without_tta = [
            json.loads((run / "no_tta.json").read_text())["metrics"]["val/accuracy"] for run in runs
        ]
        row = table_row(output, str(other) if name == "other" else "config.json")
        assert row[1:3] == ["1", "3, 4"]  # epochs, seeds
        assert row[3] == spread(with_tta)
        assert row[4] == spread(without_tta)
        epochs = [float(r["time/epoch_seconds"]) for run in runs for r in metrics_rows(run)]
        assert row[5] == f"{statistics.mean(epochs):.1f}" and float(row[6]) >= 0  # train.py's s
    mean = statistics.mean(final_val_accuracy(out / "config" / f"seed{s}") for s in (3, 4))
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"figure: val/accuracy {mean:.4f} (mean of 2 seeds) after 1 epochs")


def test_full_trains_on_every_image_and_scores_the_test_folder_with_and_without_tta(
    tmp_path, commands, capsys
):
    data = tmp_path / "cifar"
    image_folder(data / "train", per_class=4)
    test_data = image_folder(tmp_path / "test_images", per_class=2, seed=1)
    common = ["--epochs", "1", "--data", str(data), "--full", *TINY]
    # Without test images nothing is left to score: refused in one line, nothing run.
    assert cifar_recipe.main(common) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not commands
    out = tmp_path / "out"
    assert cifar_recipe.main([*common, "--test-data", str(test_data), "--out", str(out)]) == 0
    output = capsys.readouterr().out
    seed = json.loads((ROOT / "config.json").read_text()).get("seed", 0)  # no --seed: the config's
    run = out / "config" / f"seed{seed}"
    config = json.loads((run / "config.json").read_text())
    assert config["data_loader"]["args"]["validation_split"] == 0
    assert config["trainer"]["monitor"] == "off"  # else refused: nothing to validate on
    results = {}
    for name in ("test.json", "no_tta.json"):
        scored = json.loads((run / name).read_text())
        assert scored["split"] == "test" and scored["num_samples"] == 20  # the test folder's
        results[name] = scored["metrics"]["test/accuracy"]
    tests = [command for command in commands if command[0] == "test.py"]
    assert [command[-6:] == cifar_recipe.NO_TTA for command in tests] == [False, True]
    scratch = f"data_loader.args.data_dir={out / 'test_data'}"  # train/ and test/ linked there
    assert all(scratch in command for command in tests)
    assert all(command[command.index("--split") + 1] == "test" for command in tests)
    row = table_row(output, "config.json")
    assert row[3:5] == [f"{results['test.json']:.4f}", f"{results['no_tta.json']:.4f}"]


def test_the_reference_loop_applies_lookahead_as_train_py_does(monkeypatch, tmp_path):
    """benchmarks/baselines/cifar_reference.py is train.py's accuracy baseline: its Lookahead
    must be the recipe's (every 5 steps, and at the run's last step), training going on from
    the trained weights at an epoch's end. It loaded the slow weights at every epoch's end, so
    with 2 steps an epoch its epoch 1 ended on the initial weights, and each later epoch
    started over from the slow ones."""
    from benchmarks.baselines import cifar_reference
    from model.fast_cifar import FastCifarCNN
    from utils.optim.lookahead import Lookahead

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5000 + 2048, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (len(images),), generator=generator)
    monkeypatch.setattr(cifar_reference, "load_images", lambda folder: (images, labels))
    monkeypatch.setattr(cifar_reference, "unpack", lambda archive, folder: folder)
    # The weights each training step starts from, each optimizer step's result (before
    # Lookahead) and each epoch's evaluated weights.
    starts, ends, evaluated = [], [], []
    made = []

    def small_model() -> FastCifarCNN:
        made.append(FastCifarCNN(widths=[4, 8, 8], whiten_samples=20))
        made[0].register_forward_pre_hook(lambda model, _: starts.append(copy_state(model)))
        return made[-1]

    monkeypatch.setattr(cifar_reference, "FastCifarCNN", small_model)
    monkeypatch.setattr(
        cifar_reference,
        "evaluate",
        lambda model, *_: evaluated.append(copy_state(model)) or {"plain": 0.0},
    )
    sgd_step = torch.optim.SGD.step

    def step(self, *args, **kwargs):
        result = sgd_step(self, *args, **kwargs)
        ends.append(copy_state(made[0]))
        return result

    monkeypatch.setattr(torch.optim.SGD, "step", step)
    assert cifar_reference.main(["--epochs", "3", "--data", str(tmp_path)]) == 0
    assert len(starts) == len(ends) == 6 and len(evaluated) == 3  # 2048 // 1024 steps an epoch
    # An epoch is evaluated on the weights the next one starts from.
    assert_same_state(evaluated[0], starts[2])
    assert_same_state(evaluated[1], starts[4])
    # The template's Lookahead (tests/test_techniques.py checks it against its definition)
    # replayed over the run's steps: it turns each step's result into the next one's start.
    model = FastCifarCNN(widths=[4, 8, 8], whiten_samples=20)
    model.load_state_dict(starts[0])
    lookahead = Lookahead(model, period=5, decay=0.95**5, ramp=3)
    for index, trained in enumerate(ends, start=1):
        model.load_state_dict(trained)
        lookahead.step(model, index, total_steps=6)
        assert_same_state(copy_state(model), [*starts, evaluated[-1]][index])


def copy_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def assert_same_state(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for key, value in expected.items():
        assert torch.allclose(got[key].float(), value.float(), atol=1e-5), key
