"""benchmarks/gpu_check.sh between GPU loans: its plan fits the 7-minute window and names a
threshold for every step, the scripts its steps run exist, and the figures it judges by are
counted right (recompilations by epoch, pytest outcomes, mirrored views) on the CPU."""

import importlib.util
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import NUM_EXAMPLES, ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import ExifTags, Image

from data_loader.data_loaders import ImageFolderDataLoader
from model.fast_cifar import FastCifarCNN
from utils.util import DataError

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
WINDOW = 420  # seconds: 7 minutes of a borrowed GPU, start-up excluded, with room to rerun
VALUE_ORDER = ["gpu_tests", "resume", "fsdp", "compile", "tf32_compile", "knobs"]


def benchmark(name: str):
    """benchmarks/<name>.py (or benchmarks/gpu/<name>.py) as a module (not a package)."""
    path = ROOT / "benchmarks" / f"{name}.py"
    path = path if path.is_file() else ROOT / "benchmarks" / "gpu" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plan(*args: str, env: dict[str, str] | None = None) -> list[list[str]]:
    result = subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [line.split("\t") for line in result.stdout.splitlines()]


@pytest.mark.parametrize("how", ["--plan", "GPU_CHECK_DRY_RUN=1"])
def test_the_plan_fits_the_window_and_every_step_names_a_threshold(how):
    rows = plan("--plan") if how == "--plan" else plan(env={"GPU_CHECK_DRY_RUN": "1"})
    header, *rows = rows
    assert header[:3] == ["step", "limit_s", "passes when"]
    limits = {row[0]: int(row[1]) for row in rows}
    *counted, total = rows
    assert total[0] == "total" and int(total[1]) == sum(int(row[1]) for row in counted)
    assert int(total[1]) <= WINDOW
    steps = [row for row in counted if row[0] not in ("preflight", "wrap_up")]
    assert [row[0] for row in steps][: len(VALUE_ORDER)] == VALUE_ORDER
    assert {"device_pipeline", "device_decode", "device_augment", "cifar_recipe", "lightning"} <= (
        limits.keys()
    )
    for name, limit, threshold, *_ in steps:
        assert threshold.strip(), f"{name} names no threshold"
        assert limit.isdigit() and int(limit) > 5, name  # 5 s: the kill's grace, inside the limit


def test_a_bad_argument_is_one_line_and_exit_2():
    result = subprocess.run(["bash", str(SCRIPT), "--cpu"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


def test_every_script_a_step_runs_exists_and_every_step_is_documented_with_its_limit():
    text = SCRIPT.read_text()
    for path in set(re.findall(r"\b((?:benchmarks|tests)/[\w/]+\.py)\b", text)):
        assert (ROOT / path).is_file(), path
    limits = re.findall(r'^    "(\w+)\|(\d+)\|', text, flags=re.MULTILINE)
    docs = (ROOT / "docs" / "gpu_check.md").read_text()
    assert limits
    for name, limit in limits:  # docs/gpu_check.md's table of the steps, limits as the script's
        assert f"| `{name}` | {limit} s |" in docs, name


# --- recompilations, counted by the epoch they came in -----------------------------------------


def record(name: str, message: str) -> logging.LogRecord:
    return logging.LogRecord(name, logging.INFO, __file__, 1, message, None, None)


RECOMPILE = ("torch._dynamo.guards.__recompiles", "Recompiling function forward in model.py:66")


def progress(epoch: int) -> tuple[str, str]:
    return "train", f"epoch {epoch}/3  batch 10/56  loss 2.1  900 samples/s"


def summary(epoch: int) -> tuple[str, str]:
    return "train", f"epoch {epoch}/3  train/loss 2.1  val/accuracy 0.5  (1.0 s, 900 samples/s)"


def count(events: list[tuple[str, str]]):
    counter = benchmark("gpu_training").RecompilesByEpoch()
    for name, message in events:
        counter.handle(record(name, message))
    return counter


def test_a_recompilation_in_epoch_1_after_a_progress_line_is_epoch_1s():
    """The issue's example: a slow first epoch prints "epoch 1/3 " progress lines before its
    validation compiles; splitting the output there counted those compiles as later ones."""
    counter = count([progress(1), RECOMPILE, summary(1), progress(2), summary(2)])
    assert counter.counts == {1: 1} and counter.after_first_epoch() == 0
    counter = count([summary(1), progress(2), RECOMPILE, summary(2)])
    assert counter.counts == {2: 1} and counter.after_first_epoch() == 1


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_recompilations_are_counted_in_the_epoch_they_came_in(num_examples):
    @settings(max_examples=num_examples)
    @given(st.lists(st.lists(st.sampled_from(["progress", "recompile"]), max_size=6), max_size=4))
    def check(epochs: list[list[str]]) -> None:
        events, expected = [], {}
        for epoch, kinds in enumerate(epochs, start=1):
            for kind in kinds:
                events.append(RECOMPILE if kind == "recompile" else progress(epoch))
            if kinds.count("recompile"):
                expected[epoch] = kinds.count("recompile")
            events.append(summary(epoch))
        counter = count(events)
        assert counter.counts == expected and counter.epochs_done == len(epochs)

    check()


HANGS = """import pathlib, time


def wait_here() -> None:
    pathlib.Path(__file__).with_suffix(".ready").touch()
    time.sleep(600)


wait_here()
"""


def is_running(cmdline: Path, script: Path) -> bool:
    try:
        return str(script).encode() in cmdline.read_bytes().split(b"\0")
    except OSError:  # gone meanwhile
        return False


def test_a_run_the_steps_limit_ends_leaves_where_it_hung_in_its_log(tmp_path):
    """The fsdp step's run that hung on an H200 said nothing of where: ended by the step's
    SIGTERM, gpu_training.torchrun writes each process's Python stack into the run's log and
    leaves no process behind."""
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    code = (
        "import signal, sys; from pathlib import Path; sys.path.insert(0, 'benchmarks/gpu');"
        "import gpu_training as g; signal.signal(signal.SIGTERM, g.stop);"
        f"g.torchrun(Path({str(tmp_path)!r}), 'run', script={str(script)!r})"
    )
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not script.with_suffix(".ready").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)  # what gpu_check.sh's `timeout` sends
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0 and "Stopped: signal 15" in stderr
    log = (tmp_path / "run.log").read_text()
    assert f'File "{script}", line 6 in wait_here' in log, log[-3000:]
    assert "run: still running (signal 15): stacks above (SIGABRT)" in log
    left = [path for path in Path("/proc").glob("[0-9]*/cmdline") if is_running(path, script)]
    assert left == []


# --- pytest outcomes ---------------------------------------------------------------------------

TESTS = """
import pytest

def test_passes():
    pass

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_skipped():
    pass
"""


@pytest.mark.parametrize(
    "allowed, extra, passes",
    [
        ([], "", False),  # a GPU test skipped on a GPU machine fails the check
        (["needs a CUDA device"], "", True),
        (["needs a CUDA device"], "\ndef test_fails():\n    assert False\n", False),
    ],
)
def test_the_tests_step_fails_on_a_failure_or_a_skip_it_does_not_allow(
    tmp_path, allowed, extra, passes
):
    path = tmp_path / "test_sample.py"
    path.write_text(TESTS + extra)
    flags = [item for text in allowed for item in ("--allow-skip", text)]
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu/gpu_tests.py", *flags, str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    figure = result.stdout.splitlines()[-1]
    assert figure.startswith("figure: passed 1, failed ")
    assert result.returncode == (0 if passes else 1), result.stdout[-2000:]


# --- mirrored views ----------------------------------------------------------------------------


@pytest.mark.parametrize("flip, expected", [("alternating", 16), ("none", 0)])
def test_mirrored_views_are_counted_on_the_dataloader_path(tmp_path, flip, expected):
    """The instrument of step "device_augment", on the path that flips (decode "pil")."""
    augment = benchmark("device_augment")
    root = augment.write_half_bright_jpegs(tmp_path / "images", 16)
    data = ImageFolderDataLoader(
        str(root), preset="cifar", crop_padding=0, flip=flip, batch_size=8, seed=3
    )
    assert augment.mirrored_views(data) == expected


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_syncs_are_judged_on_the_first_steady_pass(num_examples):
    """The instrument of step "device_augment"'s syncs: passes run until one has at most the
    threshold per batch (the early ones fill the policy's maps), never past --max-passes; a copy
    per image, the same in every pass, fails."""
    augment = benchmark("device_augment")

    @settings(max_examples=num_examples)
    @given(st.lists(st.integers(0, 100), min_size=1, max_size=8), st.integers(1, 8))
    def check(counts: list[int], max_passes: int) -> None:
        passes = []

        def count_pass(epoch: int) -> int:
            passes.append(epoch)
            return counts[(epoch - 1) % len(counts)]

        per_batch, steady = augment.steady_syncs_per_batch(count_pass, 4, 1.0, max_passes)
        run = [counts[index % len(counts)] / 4 for index in range(max_passes)]
        first = next((index for index, value in enumerate(run) if value <= 1.0), None)
        assert steady == (first is not None)
        assert per_batch == run[: max_passes if first is None else first + 1]
        assert passes == list(range(1, len(per_batch) + 1))  # epochs 1, 2, ...: new orders

    check()
    assert augment.steady_syncs_per_batch(lambda epoch: 32, 1, 1.0, 12) == ([32.0] * 12, False)


# --- decode "device" against PIL, and how it fails (step "device_decode") --------------------


@pytest.fixture(scope="module")
def decode_check(tmp_path_factory):
    """device_decode.py, its JPEGs, and decode "device"'s batches on the CPU's decoder."""
    check = benchmark("device_decode")
    root = tmp_path_factory.mktemp("device_decode")
    return check, check.write_jpegs(root), check.device_batches(root, "cpu")


def test_the_decode_steps_jpegs_are_what_it_checks_and_the_cpus_decoder_passes(
    decode_check, tmp_path, capsys
):
    """Grayscale, CMYK, every EXIF Orientation and a truncated file PIL refuses; the CPU's
    decoder (libjpeg-turbo, as PIL's) equals PIL on every one and refuses the truncated one in
    one line, so the step's first run on a GPU judges nvJPEG, not the script. Without CUDA the
    step says why it did nothing."""
    check, paths, _ = decode_check
    with Image.open(paths["grayscale"]) as gray, Image.open(paths["cmyk"]) as cmyk:
        assert (gray.mode, cmyk.mode) == ("L", "CMYK")
    for orientation in range(1, 9):
        with Image.open(paths[f"orientation-{orientation}"]) as image:
            assert image.getexif()[ExifTags.Base.Orientation] == orientation
    with pytest.raises(OSError), Image.open(paths["truncated"]) as image:
        image.load()
    strict = ["--max-mean", "0.01", "--max-difference", "0"]
    assert check.main(["--work", str(tmp_path / "cpu"), "--device", "cpu", *strict]) == 0
    figure = capsys.readouterr().out.splitlines()[-1]
    assert "10 JPEGs against PIL" in figure and "max 0 levels" in figure, figure
    assert "truncated: one-line DataError naming it" in figure, figure
    if not torch.cuda.is_available():
        assert check.main(["--work", str(tmp_path / "gpu")]) == 0
        assert "figure: skipped: no CUDA device" in capsys.readouterr().out


def damaged(batches, path, damage: str) -> SimpleNamespace:
    """`batches` whose decode gets the image of `path` wrong as a device decoder could."""

    def decode(data, orientations, names):
        images = batches.decode(data, orientations, names)
        return [
            DAMAGES[damage](image) if name == str(path) else image
            for image, name in zip(images, names, strict=True)
        ]

    return SimpleNamespace(decode=decode)


DAMAGES = {
    "not turned": lambda image: image.transpose(-2, -1),  # the tag ignored: 90 degrees off
    "mirrored": lambda image: image.flip(-1),
    "inverted": lambda image: 255 - image,  # Adobe CMYK read without its inversion
    "grey": lambda image: image.float().mean(0, keepdim=True).expand(3, -1, -1).to(torch.uint8),
    "off by 41 at a pixel": lambda image: image.index_put(
        (torch.tensor([0]), torch.tensor([0]), torch.tensor([0])),
        (image[0, 0, 0].int() + 41).remainder(256).to(torch.uint8),
    ),
}


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(["grayscale", "cmyk", *(f"orientation-{n}" for n in range(1, 9))]),
    damage=st.sampled_from(sorted(DAMAGES)),
)
def test_the_pixel_check_fails_when_any_image_decodes_wrong(decode_check, name, damage):
    """One image of the batch decoded wrong (the way nvJPEG could: its tag ignored, mirrored,
    CMYK uninverted, grey, one pixel far off) fails the check, whichever image and however."""
    check, paths, batches = decode_check
    if damage == "grey" and name == "grayscale":
        damage = "inverted"  # a grayscale image is grey already
    ok, text = check.check_pixels(damaged(batches, paths[name], damage), paths, 3.0, 40.0)
    assert not ok and text.endswith(f"off: {name}"), text
    assert check.check_pixels(batches, paths, 3.0, 40.0)[0]


def test_the_truncated_check_wants_the_one_line_dataerror_naming_the_file(decode_check):
    """A decoder that returns an image for a truncated JPEG (no error: trained on as grey), or
    an error in more than one line, fails the check."""
    check, paths, batches = decode_check
    assert check.check_truncated(batches, paths) == (
        True,
        "truncated: one-line DataError naming it",
    )

    def lenient(data, orientations, names):
        return [torch.full((3, 48, 40), 128, dtype=torch.uint8) for _ in names]

    def two_lines(data, orientations, names):
        raise DataError(f"{names[-1]}: unreadable\nsee above")

    ok, text = check.check_truncated(SimpleNamespace(decode=lenient), paths)
    assert not ok and "decoded without an error" in text
    assert not check.check_truncated(SimpleNamespace(decode=two_lines), paths)[0]


@pytest.mark.parametrize(
    "thresholds",
    [
        ["--min-ratio", "1e9"],
        ["--min-ratio", "0", "--jpeg-images", "8", "--min-decode-ratio", "1e9"],
    ],
)
def test_a_pipeline_ratio_below_its_threshold_fails(capsys, thresholds):
    pipeline = benchmark("input_pipeline")
    args = ["--quick", "--device", "cpu", "--num-workers", "1", "--num-images", "256"]
    assert pipeline.main([*args, "--batch-size", "64", *thresholds]) == 1
    figure = capsys.readouterr().out.splitlines()[-1]
    assert figure.startswith("figure: pipeline device ")
    assert ("decode device" in figure) == ("--min-decode-ratio" in thresholds)


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_airbench_ratio_takes_the_recipes_seconds_and_flops_from_its_own_rows(num_examples):
    """Per epoch: the training samples over the logged rate, and those samples times the FLOPs a
    sample (logged FLOP/s over samples/s). The ratio is of seconds per FLOP: k times the work a
    sample at the same FLOP/s (every rate divided by k) is k times the seconds and the FLOPs,
    and the same seconds per FLOP, whatever the epochs' rates."""
    ratio = benchmark("airbench_ratio")
    rows = [
        {"time/train_samples_per_second": "100", "time/flops_per_second": "2e11"},
        {"time/train_samples_per_second": "50", "time/flops_per_second": "1e11"},
    ]
    assert ratio.recipe_training(rows, 1000) == pytest.approx((30.0, 4e12))

    @settings(max_examples=num_examples)
    @given(
        st.lists(st.tuples(st.floats(1, 1e6), st.floats(1e6, 1e15)), min_size=1, max_size=10),
        st.integers(1, 45000),
        st.floats(0.1, 10),
    )
    def check(epochs: list[tuple[float, float]], num_train: int, k: float) -> None:
        def logged(scale: float) -> list[dict[str, str]]:
            return [
                {
                    "time/train_samples_per_second": str(rate / scale),
                    "time/flops_per_second": str(f),
                }
                for rate, f in epochs
            ]

        seconds, flops = ratio.recipe_training(logged(1), num_train)
        wider_seconds, wider_flops = ratio.recipe_training(logged(k), num_train)
        assert (wider_seconds, wider_flops) == pytest.approx((k * seconds, k * flops), rel=1e-9)
        assert wider_seconds / wider_flops == pytest.approx(seconds / flops, rel=1e-9)

    check()


def test_airbench94s_flops_are_counted_as_the_trainer_counts_the_recipes():
    """Three times the forward's FLOPs a sample, on the network make_net94 returns (here the
    template's FastCifarCNN at airbench94's widths, a network of the same shape, on the CPU):
    3 x 236 MFLOPs, the count the trainer logs for those widths (tests/test_flops.py)."""
    ratio = benchmark("airbench_ratio")
    fake = SimpleNamespace(make_net94=lambda: FastCifarCNN(widths=[64, 256, 256]))
    assert ratio.airbench_flops_per_sample(fake) == pytest.approx(3 * 236.29472e6)
