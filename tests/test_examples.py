"""The two worked examples of "any task": denoising (a model, a loss, a metric, a data loader and
a config, nothing else) and knowledge distillation (a Trainer subclass with its own training
step). Each trains through train.py, resumes bit-exact on the CPU and runs under torchrun.

train.py and test.py run in-process (conftest's run_main): what is checked is what they write,
not the process. torchrun's two processes are real ones."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import run_main, torchrun, write_shrunk
from hypothesis import given, settings
from hypothesis import strategies as st

import train as train_script
from build import build_trainer
from data_loader.data_loaders import NoisyShapesDataLoader
from model.metric import psnr
from parse_config import ConfigParser
from trainer.distillation import DistillationTrainer
from utils.distributed.process_group import ProcessInfo

DENOISE = {
    "data_loader.args.num_train": 640,
    "data_loader.args.num_test": 64,
    "data_loader.args.validation_split": 0.2,
    "arch.args.width": 16,
    "arch.args.depth": 2,
    "trainer.tensorboard": False,
    "trainer.deterministic": True,
}


def config_file(tmp_path: Path, shipped: str, name: str, **overrides) -> Path:
    return write_shrunk(shipped, tmp_path / name, tmp_path / "saved", **overrides)


def run_dir(config: Path, run_id: str) -> Path:
    name = json.loads(config.read_text())["name"]
    return config.parent / "saved" / "models" / name / run_id


def train(config: Path, run_id: str, *args: str) -> dict:
    result = run_main("train.py", "-c", str(config), "--run-id", run_id, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(run_dir(config, run_id) / "checkpoint-epoch2.pth", weights_only=True)


def assert_resume_is_bit_exact(config: Path) -> None:
    """Two epochs straight, and one epoch then -r for the second: the same weights, bit for bit."""
    straight = train(config, "straight")
    one = run_main("train.py", "-c", str(config), "--run-id", "halves", "--epochs", "1")
    assert one.returncode == 0, one.stderr[-3000:]
    first = run_dir(config, "halves") / "checkpoint-epoch1.pth"
    resumed = run_main("train.py", "-r", str(first), "--epochs", "2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = torch.load(run_dir(config, "halves") / "checkpoint-epoch2.pth", weights_only=True)
    for key, value in straight["model"].items():
        assert torch.equal(value, final["model"][key]), key
    assert final["metrics"] == {**straight["metrics"], **timing(final["metrics"])}


def timing(metrics: dict) -> dict:
    return {key: value for key, value in metrics.items() if key.startswith("time/")}


def torchrun_two_processes(config: Path) -> str:
    result = torchrun(
        "-c", str(config), "--run-id", "ddp", "--epochs", "1", "--set", "trainer.verbosity=2"
    )
    assert "[rank 1] epoch 1/1" in result.stdout
    return result.stdout


# --- denoising: a new task without touching base/, train.py or the trainer --------------------


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_denoising_learns_to_remove_noise(tmp_path):
    # The shipped network on 1,152 training images: 2 epochs of 36 steps.
    learn = {"data_loader.args.num_train": 1280, "data_loader.args.validation_split": 0.1}
    learn.update({"lr_scheduler.args.T_max": 2, "trainer.tensorboard": False})
    config = config_file(tmp_path, "configs/denoise.json", "denoise.json", **learn)
    state = train(config, "denoise")
    # The noisy inputs themselves, scored as if they were the output: what doing nothing gets.
    data = NoisyShapesDataLoader(
        **{**json.loads(config.read_text())["data_loader"]["args"], "seed": 0}
    )
    noisy, clean = next(
        iter(torch.utils.data.DataLoader(data.view("train", False), batch_size=640))
    )
    baseline = (psnr(noisy, clean) / len(clean)).item()
    assert 13 < baseline < 15  # noise_std 0.2: 10 log10(1 / 0.04) = 14 dB
    assert state["metrics"]["val/psnr"] > baseline + 3, state["metrics"]
    assert "val/accuracy" not in state["metrics"]

    # test.py scores the same validation data the same way; no classes, so no per-class table.
    report_path = tmp_path / "report.json"
    best = run_dir(config, "denoise") / "model_best.pth"
    result = run_main("test.py", "-r", str(best), "--split", "val", "--json", str(report_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    recorded = torch.load(best, weights_only=True)["metrics"]
    assert report["metrics"]["val/psnr"] == pytest.approx(recorded["val/psnr"], rel=1e-9)
    assert report["per_class_accuracy"] == {}


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_denoising_resumes_bit_exact(tmp_path):
    assert_resume_is_bit_exact(config_file(tmp_path, "configs/denoise.json", "d.json", **DENOISE))


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_denoising_under_torchrun(tmp_path):
    config = config_file(tmp_path, "configs/denoise.json", "d.json", **DENOISE)
    output = torchrun_two_processes(config)
    assert "val/psnr" in output


# --- distillation: a custom training step in a Trainer subclass --------------------------------


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A demo CNN trained for 2 epochs: the teacher."""
    tmp_path = tmp_path_factory.mktemp("teacher")
    config = config_file(tmp_path, "configs/demo.json", "teacher.json")
    train(config, "teacher")
    return run_dir(config, "teacher") / "checkpoint-epoch2.pth"


def distill_config(tmp_path: Path, teacher: Path, **args) -> Path:
    return config_file(
        tmp_path, "configs/distill.json", "distill.json",
        **{"trainer.args": {"teacher": str(teacher), **args}, "trainer.tensorboard": False,
           "trainer.deterministic": True, "arch.args.widths": [4, 8]},
    )  # fmt: skip


@pytest.mark.parametrize("alpha", [0.0, 0.7])
def test_distillation_step_computes_its_loss(tmp_path, teacher, alpha):
    config = ConfigParser(
        json.loads(distill_config(tmp_path, teacher, alpha=alpha).read_text()), source="t"
    )
    trainer = build_trainer(
        config, ProcessInfo(), torch.device("cpu"), __import__("logging").getLogger("t")
    )
    images, labels = next(iter(trainer.train_loader))
    result = trainer.training_step((images, labels))
    student, teacher_output = trainer.model(images), trainer.teacher(images)
    temperature = 4.0
    soft = F.kl_div(
        F.log_softmax(student / temperature, 1), F.softmax(teacher_output / temperature, 1),
        reduction="batchmean",
    ) * temperature**2  # fmt: skip
    expected = alpha * soft + (1 - alpha) * F.cross_entropy(student, labels)
    torch.testing.assert_close(result.loss, expected)
    # The teacher is frozen: it is not among the parameters being trained, nor the optimizer's.
    assert not any(param.requires_grad for param in trainer.teacher.parameters())
    optimized = {id(param) for group in trainer.optimizer.param_groups for param in group["params"]}
    assert not optimized & {id(param) for param in trainer.teacher.parameters()}
    assert not trainer.teacher.training


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(2, 8),
    st.floats(0.25, 20.0),
    st.floats(0.0, 1.0),
    st.integers(0, 2**16),
    st.floats(0.1, 30.0),
)
def test_the_distillation_loss_is_the_documented_formula(
    batch_size, num_classes, temperature, alpha, seed, scale
):
    """loss = alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE(student, labels), the
    KL per sample (batchmean), by hand from the softmaxes, over any logits, T and alpha."""
    generator = torch.Generator().manual_seed(seed)
    student = scale * torch.randn(batch_size, num_classes, generator=generator, dtype=torch.float64)
    teacher = scale * torch.randn(batch_size, num_classes, generator=generator, dtype=torch.float64)
    labels = torch.randint(num_classes, (batch_size,), generator=generator)
    trainer = type("Step", (), {})()  # what training_step reads of the trainer
    trainer.mix = lambda images, labels: (images, labels)
    trainer.model, trainer.teacher = (lambda _: student), (lambda _: teacher)
    trainer.criterion, trainer.temperature, trainer.alpha = F.cross_entropy, temperature, alpha
    result = DistillationTrainer.training_step(trainer, (torch.zeros(batch_size, 1), labels))
    p_teacher = torch.softmax(teacher / temperature, 1)
    # xlogy: 0 log 0 = 0 where a teacher probability underflows
    log_student = torch.log_softmax(student / temperature, 1)
    kl = (torch.special.xlogy(p_teacher, p_teacher) - p_teacher * log_student).sum(1)
    soft = kl.mean() * temperature**2
    expected = alpha * soft + (1 - alpha) * F.cross_entropy(student, labels)
    torch.testing.assert_close(result.loss, expected, rtol=1e-9, atol=1e-9)
    assert result.output is student and result.target is labels


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_distillation_trains_resumes_and_runs_under_torchrun(tmp_path, teacher):
    config = distill_config(tmp_path, teacher)
    assert_resume_is_bit_exact(config)
    torchrun_two_processes(config)


def test_a_missing_teacher_is_a_one_line_error(tmp_path, capsys):
    config = distill_config(tmp_path, tmp_path / "nowhere.pth")
    assert train_script.main(["-c", str(config)]) == 2  # in-process: a subprocess imports torch
    stderr = capsys.readouterr().err
    assert stderr.startswith(f"error: {config}: trainer.args: teacher: ")
    assert "Traceback" not in stderr and stderr.count("\n") == 1
