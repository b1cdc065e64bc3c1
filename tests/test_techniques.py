"""The training techniques of the ImageNet-grade recipes, each against its definition: warmup and
derived schedule lengths, label smoothing, MixUp / CutMix, the weight average (EMA), no weight
decay on normalisation layers and biases, the scaled learning rate, a parameter group that trains
for its first epochs only, the augmentation presets and the top-k checkpoints."""

import itertools
import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchvision
from conftest import ROOT, assert_stopped_run_resumes_bit_exact, run_main, run_script, shrink
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torchvision.transforms import v2

from build import build_loss, build_trainer
from data_loader.transforms import batch_mixing, cifar_transform, imagenet_transform
from model.model import CifarCNN
from parse_config import ConfigError, ConfigParser
from utils import UserError
from utils.distributed.process_group import ProcessInfo
from utils.evaluation.monitor import Monitor
from utils.optim.group_epochs import epoch_limits
from utils.optim.optimizer import NORM_LAYERS, build_optimizer
from utils.optim.schedule import build_scheduler


def demo_config(tmp_path, **sections) -> ConfigParser:
    """The shrunk demo config with whole sections or trainer options replaced."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update(tensorboard=False, **sections.pop("trainer", {}))
    config.update(sections)
    return ConfigParser(config, source="test.json")


def learning_rates(config: ConfigParser, steps_per_epoch: int, num_steps: int) -> list[float]:
    """The learning rate of steps 0..num_steps-1 under config's schedule, stepped per step."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler = build_scheduler(config, optimizer, steps_per_epoch)
    rates = []
    for _ in range(num_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


# --- schedules ---------------------------------------------------------------------------------


def test_linear_warmup_then_cosine_per_step(tmp_path):
    schedule = {
        "type": "CosineAnnealingLR", "args": {}, "interval": "step",
        "warmup_steps": 4, "warmup_start_factor": 0.1,
    }  # fmt: skip
    config = demo_config(tmp_path, lr_scheduler=schedule, trainer={"epochs": 2})
    rates = learning_rates(config, steps_per_epoch=10, num_steps=20)
    for step in range(5):  # 0.1 x (0.1 -> 1) over 4 steps
        assert rates[step] == pytest.approx(0.1 * (0.1 + 0.9 * step / 4))
    # Then the cosine over the rest of the run: T_max = 2 x 10 - 4 steps, derived.
    for step in range(4, 20):
        assert rates[step] == pytest.approx(0.1 * (1 + math.cos(math.pi * (step - 4) / 16)) / 2)


def test_warmup_in_epochs_for_a_per_epoch_schedule(tmp_path):
    schedule = {"type": "CosineAnnealingLR", "args": {}, "interval": "epoch", "warmup_epochs": 2}
    config = demo_config(tmp_path, lr_scheduler=schedule, trainer={"epochs": 6})
    rates = learning_rates(config, steps_per_epoch=10, num_steps=6)  # one "step" per epoch
    assert rates[:3] == pytest.approx([0.001, 0.1 * (0.01 + 0.99 / 2), 0.1])
    assert rates[3:] == pytest.approx(
        [0.1 * (1 + math.cos(math.pi * k / 4)) / 2 for k in (1, 2, 3)]
    )


@pytest.mark.parametrize(
    ("schedule", "attribute"),
    [({"type": "CosineAnnealingLR", "args": {}}, "T_max"),
     ({"type": "OneCycleLR", "args": {"max_lr": 0.1}}, "total_steps"),
     ({"type": "PolynomialLR", "args": {}}, "total_iters"),
     ({"type": "LinearLR", "args": {"start_factor": 1.0, "end_factor": 0.0}}, "total_iters")],
)  # fmt: skip
@pytest.mark.parametrize("epochs", [3, 30])
def test_schedule_length_follows_the_run(tmp_path, schedule, attribute, epochs):
    config = demo_config(
        tmp_path, lr_scheduler={**schedule, "interval": "step"}, trainer={"epochs": epochs}
    )
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    assert getattr(build_scheduler(config, optimizer, 7), attribute) == epochs * 7


def test_a_length_in_the_config_is_kept(tmp_path):
    schedule = {"type": "CosineAnnealingLR", "args": {"T_max": 5}, "interval": "epoch"}
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    config = demo_config(tmp_path, lr_scheduler=schedule, trainer={"epochs": 30})
    assert build_scheduler(config, optimizer, 7).T_max == 5


@pytest.mark.parametrize(
    ("schedule", "message"),
    [({"interval": "epoch", "warmup_steps": 3}, 'needs "interval": "step"'),
     ({"interval": "epoch", "warmup_epochs": 0.5}, "must be a whole number of epochs"),
     ({"interval": "step", "warmup_epochs": 1, "warmup_steps": 3}, "not both"),
     ({"interval": "step", "warmup_start_factor": 0}, "must be a number in (0, 1]")],
)  # fmt: skip
def test_bad_warmup_is_a_config_error(tmp_path, schedule, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        demo_config(tmp_path, lr_scheduler={"type": "CosineAnnealingLR", "args": {}, **schedule})


def test_warmup_before_reduce_on_plateau_is_refused(tmp_path):
    schedule = {"type": "ReduceLROnPlateau", "args": {}, "warmup_epochs": 1}
    with pytest.raises(ConfigError, match="cannot follow a warmup"):
        demo_config(tmp_path, lr_scheduler=schedule)


def test_a_warmup_as_long_as_the_run_is_refused(tmp_path):
    schedule = {"type": "CosineAnnealingLR", "args": {}, "interval": "epoch", "warmup_epochs": 2}
    config = demo_config(tmp_path, lr_scheduler=schedule, trainer={"epochs": 2})
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(UserError, match="leaves nothing of the run"):
        build_scheduler(config, optimizer, 10)


# --- loss ------------------------------------------------------------------------------------


def test_label_smoothing_mixes_in_the_uniform_distribution(tmp_path):
    config = demo_config(tmp_path, loss={"type": "cross_entropy", "args": {"label_smoothing": 0.1}})
    criterion = build_loss(config)
    logits, labels = torch.randn(8, 10), torch.randint(0, 10, (8,))
    log_probs = logits.log_softmax(dim=1)
    # (1 - e) x the usual loss + e x the cross-entropy with the uniform distribution.
    expected = 0.9 * F.nll_loss(log_probs, labels) + 0.1 * -log_probs.mean(dim=1).mean()
    assert criterion(logits, labels) == pytest.approx(expected.item())


@pytest.mark.parametrize(
    ("loss", "message"),
    [({"type": "cross_entropy", "args": {"label_smoothing": 1.5}}, "must be a number in [0, 1)"),
     ({"type": "cross_entropy", "args": {"smoothing": 0.1}}, "loss.args: "),
     ({"type": "nope"}, "unknown name 'nope'")],
)  # fmt: skip
def test_bad_loss_arguments_are_config_errors(tmp_path, loss, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_loss(demo_config(tmp_path, loss=loss))


# --- batch mixing ------------------------------------------------------------------------------


def labelled_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Eight constant images, image i filled with the value i + 1, labels 0..7."""
    images = torch.arange(1, 9, dtype=torch.float32).view(8, 1, 1, 1).expand(8, 3, 16, 16)
    return images.clone(), torch.arange(8)


def test_mixup_targets_sum_to_one_and_match_the_mixing_factor():
    images, labels = labelled_batch()
    mixed, targets = batch_mixing(10, mixup_alpha=0.4)(images, labels)
    assert targets.shape == (8, 10) and torch.allclose(targets.sum(dim=1), torch.ones(8))
    # MixUp blends each image with the previous one of the batch: lam x own + (1 - lam) x rolled.
    lam = targets[0, 0]
    assert torch.allclose(targets[torch.arange(8), labels], lam.expand(8))
    assert torch.allclose(targets[torch.arange(8), labels.roll(1)], (1 - lam).expand(8))
    assert torch.allclose(mixed, lam * images + (1 - lam) * images.roll(1, dims=0))


def test_cutmix_targets_match_the_pasted_area():
    images, labels = labelled_batch()
    mixed, targets = batch_mixing(10, cutmix_alpha=1.0)(images, labels)
    assert torch.allclose(targets.sum(dim=1), torch.ones(8))
    # CutMix pastes a box of the previous image: the label weight is the share of pixels kept.
    kept = (mixed == images).float().mean(dim=(1, 2, 3))
    assert torch.allclose(targets[torch.arange(8), labels], kept)
    assert torch.equal(
        (mixed == images) | (mixed == images.roll(1, dims=0)),
        torch.ones_like(mixed, dtype=torch.bool),
    )


def test_mixing_choice_and_probability_come_from_config():
    assert isinstance(batch_mixing(10, mixup_alpha=0.2), v2.MixUp)
    both = batch_mixing(10, mixup_alpha=0.2, cutmix_alpha=1.0, cutmix_prob=0.25)
    assert isinstance(both, v2.RandomChoice) and both.p == pytest.approx([0.75, 0.25])
    sometimes = batch_mixing(10, cutmix_alpha=1.0, prob=0.5)
    assert isinstance(sometimes, v2.RandomApply) and sometimes.p == 0.5
    images, labels = labelled_batch()
    assert batch_mixing(10)(images, labels) == (images, labels)  # off: the batch as it is


def test_the_training_step_learns_from_mixed_targets_and_scores_the_labels(tmp_path):
    config = demo_config(tmp_path, batch_mixing={"mixup_alpha": 0.2})
    trainer = build_trainer(config, ProcessInfo(), torch.device("cpu"), logging.getLogger("t"))
    seen = []
    trainer.criterion = lambda output, target: seen.append(target) or output.sum()
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    result = trainer.training_step((images, labels))
    assert seen[0].shape == (4, 10)  # soft targets reached the loss
    assert torch.equal(result.target, labels)  # the metrics read the labels
    trainer.validation_step((images, labels))
    assert torch.equal(seen[1], labels)  # validation is not mixed


# --- the weight average (EMA) ------------------------------------------------------------------


@pytest.mark.parametrize("period", [1, 2])
def test_ema_equals_the_closed_form_average(tmp_path, period):
    config = demo_config(tmp_path, trainer={"ema_decay": 0.5, "ema_period": period})
    trainer = build_trainer(config, ProcessInfo(), torch.device("cpu"), logging.getLogger("t"))
    snapshots = []  # the trained model's state after each optimizer step
    for _ in range(4):
        trainer.model(torch.randn(8, 3, 32, 32)).square().mean().backward()
        trainer.optimizer_step()
        snapshots.append({key: value.clone() for key, value in trainer.model.state_dict().items()})
    # The first update copies; each later one is ema = 0.5 ema + 0.5 weights.
    updates = snapshots[period - 1 :: period]
    expected = updates[0]
    for snapshot in updates[1:]:
        expected = {key: 0.5 * expected[key] + 0.5 * snapshot[key] for key in expected}
    averaged = trainer.ema.module.state_dict()
    for key, value in expected.items():
        if snapshots[0][key].is_floating_point():  # weights and BatchNorm statistics alike
            assert torch.allclose(averaged[key], value), key
    assert int(trainer.ema.n_averaged) == len(updates)


# --- Lookahead ----------------------------------------------------------------------------------


def run_lookahead(period: int, decay: float, ramp: float, total_steps: int) -> None:
    """Trains a tiny model `total_steps` SGD steps with Lookahead and checks every step against
    the definition: every `period` steps and after the last one, slow = share * slow + (1 -
    share) * fast with share = decay * (step / total_steps) ** ramp, and training goes on from
    slow. So the run ends on slow weights that hold every step, also those after the last full
    period (the slow weights of a run shorter than the period are not its initial ones)."""
    from utils.optim.lookahead import Lookahead

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    lookahead = Lookahead(model, period=period, decay=decay, ramp=ramp)
    slow = {key: value.clone() for key, value in model.state_dict().items()}
    for step in range(1, total_steps + 1):
        model(torch.randn(8, 3)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        fast = {key: value.clone() for key, value in model.state_dict().items()}
        lookahead.step(model, step, total_steps=total_steps)
        synchronised = step % period == 0 or step == total_steps
        if synchronised:
            share = decay * (step / total_steps) ** ramp
            for key, value in fast.items():
                if value.is_floating_point():  # weights and BatchNorm statistics
                    slow[key] = share * slow[key] + (1 - share) * value
        expected = slow if synchronised else fast
        for key, value in model.state_dict().items():
            if value.is_floating_point():
                assert torch.allclose(value, expected[key], atol=1e-6), (step, key)
            else:  # the counter of batches BatchNorm saw is the model's own
                assert value == step, key
    # The trainer calls finish() again at the last epoch's end: nothing changes then.
    lookahead.finish(model)
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            assert torch.allclose(value, slow[key], atol=1e-6), key
    assert lookahead.state_dict().keys() == {k for k, v in slow.items() if v.is_floating_point()}


@settings(max_examples=30, deadline=None)
@given(
    period=st.integers(1, 6),
    decay=st.floats(0.0, 0.95),
    ramp=st.sampled_from([0.0, 1.0, 3.0]),
    total_steps=st.integers(1, 13),
)
def test_lookahead_equals_its_definition(
    period: int, decay: float, ramp: float, total_steps: int
) -> None:
    run_lookahead(period, decay, ramp, total_steps)


def test_a_run_shorter_than_the_lookahead_period_does_not_end_on_its_initial_weights() -> None:
    """config.json's Lookahead (period 5) over a 3-step run, as benchmarks/cifar_recipe.py's
    short runs had: it ended on the initial weights, and reported their accuracy."""
    run_lookahead(period=5, decay=0.7738, ramp=3.0, total_steps=3)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("lookahead_period", 0, "a positive integer"),
        ("lookahead_decay", 1.0, "a number in [0, 1)"),
        ("lookahead_ramp", -1, "a number >= 0"),
    ],
)
def test_bad_lookahead_settings_are_config_errors(tmp_path, key, value, message) -> None:
    with pytest.raises(
        ConfigError, match=re.escape(f"trainer.{key}: ") + ".*" + re.escape(message)
    ):
        demo_config(tmp_path, trainer={"lookahead_period": 5, key: value})


# --- weight decay groups and the learning rate ---------------------------------------------------


@pytest.mark.parametrize("network", ["cifar", "resnet18"])
def test_no_decay_group_holds_exactly_the_norm_and_bias_parameters(tmp_path, network):
    optimizer_section = {
        "type": "SGD", "args": {"lr": 0.1, "weight_decay": 5e-4}, "norm_bias_weight_decay": 0.0,
    }  # fmt: skip
    config = demo_config(tmp_path, optimizer=optimizer_section)
    model = CifarCNN(widths=[8, 16]) if network == "cifar" else torchvision.models.resnet18()
    optimizer = build_optimizer(config, model, torch.device("cpu"))
    exempt = {
        id(param)
        for module in model.modules()
        for name, param in module.named_parameters(recurse=False)
        if isinstance(module, NORM_LAYERS) or name == "bias"
    }
    assert exempt  # BatchNorm weights and biases, the head's bias
    decayed, not_decayed = optimizer.param_groups
    assert decayed["weight_decay"] == 5e-4 and not_decayed["weight_decay"] == 0.0
    assert {id(param) for param in not_decayed["params"]} == exempt
    assert all(param.dim() > 1 for param in decayed["params"])  # convolution and linear weights
    assert len(decayed["params"]) + len(not_decayed["params"]) == len(list(model.parameters()))


def test_learning_rates_scale_with_the_global_batch(tmp_path):
    optimizer_section = {
        "type": "SGD", "args": {"lr": 0.1}, "reference_batch_size": 256,
        "param_groups": [{"params": "head", "lr": 0.01}],
    }  # fmt: skip
    config = demo_config(tmp_path, optimizer=optimizer_section, trainer={"grad_accum_steps": 2})
    model = CifarCNN(widths=[8, 16])
    # 32 per process x 8 processes x 2 accumulated = 512: twice the reference batch.
    optimizer = build_optimizer(config, model, torch.device("cpu"), world_size=8)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.2, 0.02])


# --- a group that trains for its first epochs only (param_groups[].train_epochs) -------------------

# The hard cases: momentum and weight decay would keep moving a parameter that gets no gradient
# if the optimizer still touched it (SGD's coupled decay, AdamW's decoupled one).
MOMENTUM_SGD = {
    "type": "SGD", "args": {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-3},
}  # fmt: skip
DECOUPLED_ADAMW = {"type": "AdamW", "args": {"lr": 0.003, "weight_decay": 0.05}}
DEMO_RUNS = Path("saved") / "models" / "Demo_CifarCNN"


def first_epochs_only(optimizer: dict, train_epochs: object) -> dict:
    """`optimizer` with features.0 (the first convolution and its BatchNorm) in a group of its
    own that trains for the first `train_epochs` epochs."""
    return {**optimizer, "param_groups": [{"params": "features.0", "train_epochs": train_epochs}]}


@pytest.fixture
def recorded_steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, dict[str, torch.Tensor]]]:
    """trainer.type "Recording": the demo's Trainer, which records (epoch, a copy of every
    parameter) once built (epoch 0) and after each optimizer step."""
    import trainer as trainer_module

    steps = []

    def record(trainer: trainer_module.Trainer, epoch: int) -> None:
        steps.append((epoch, {k: v.detach().clone() for k, v in trainer.model.named_parameters()}))

    class Recording(trainer_module.Trainer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            record(self, 0)
            # state.epoch counts the epochs done: a step belongs to the one after them.
            self.optimizer.register_step_post_hook(lambda *_: record(self, self.state.epoch + 1))

    monkeypatch.setattr(trainer_module, "Recording", Recording, raising=False)
    monkeypatch.setattr(trainer_module, "__all__", [*trainer_module.__all__, "Recording"])
    return steps


@pytest.mark.parametrize(
    ("optimizer", "trainer"),
    [
        (MOMENTUM_SGD, {}),
        (MOMENTUM_SGD, {"grad_accum_steps": 2}),
        (MOMENTUM_SGD, {"amp": "fp16", "grad_clip": 1.0}),  # GradScaler unscales, then clips
        (DECOUPLED_ADAMW, {}),
    ],
    ids=["sgd", "sgd-accumulated", "sgd-fp16-clipped", "adamw"],
)
def test_a_group_trains_in_epochs_1_to_n_and_then_stays_bit_for_bit(
    make_config, recorded_steps, optimizer, trainer
):
    """train_epochs 2 of 4: every optimizer step of epochs 1 and 2 moves the group's parameters;
    from epoch 3 on they stay exactly what epoch 2 left (no step, no momentum, no weight decay),
    while every other parameter still moves at every step."""
    options = {"type": "Recording", "tensorboard": False, "epochs": 4, **trainer}
    config = make_config(
        optimizer=first_epochs_only(optimizer, 2),
        **{f"trainer.{key}": value for key, value in options.items()},
    )
    result = run_main("train.py", "-c", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    epochs = [epoch for epoch, _ in recorded_steps]
    assert epochs == sorted(epochs) and set(epochs) == {0, 1, 2, 3, 4}
    group = {name for name in recorded_steps[0][1] if name.startswith("features.0.")}
    rest = set(recorded_steps[0][1]) - group
    assert len(group) == 3 and rest  # the convolution's weight, BatchNorm's weight and bias
    for (_, before), (epoch, after) in itertools.pairwise(recorded_steps):
        moved = {name for name in before if not torch.equal(before[name], after[name])}
        assert moved == (group | rest if epoch <= 2 else rest), epoch


@pytest.mark.parametrize("stop_at_step", [12, 20], ids=["inside-epoch-n", "inside-epoch-n+1"])
def test_a_run_stopped_around_epoch_n_resumes_bit_exact(
    make_config, stop_at, tmp_path, stop_at_step
):
    """train_epochs 2 of 3 at 8 steps an epoch, stopped inside epoch 2 (the resumed run crosses
    into the epochs without the group) or inside epoch 3 (it starts past them) and resumed: the
    weights and metrics of the uninterrupted run, bit for bit."""
    config = make_config(**{
        "optimizer": first_epochs_only(MOMENTUM_SGD, 2), "trainer.epochs": 3,
        "trainer.type": "StopAt", "trainer.deterministic": True, "trainer.tensorboard": False,
    })  # fmt: skip
    assert_stopped_run_resumes_bit_exact(config, tmp_path / DEMO_RUNS, stop_at_step, epochs=3)


def test_train_epochs_selects_the_groups_parameters_and_is_no_optimizer_option(tmp_path):
    config = demo_config(tmp_path, optimizer=first_epochs_only(MOMENTUM_SGD, 1))
    model = CifarCNN(widths=[8, 16])
    optimizer = build_optimizer(config, model, torch.device("cpu"))
    assert not any("train_epochs" in group for group in optimizer.param_groups)
    ((last_epoch, params),) = epoch_limits(config, model)
    assert last_epoch == 1 and params == list(model.features[0].parameters())
    assert any(param is params[0] for param in optimizer.param_groups[1]["params"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be a positive integer, got 0"),
        (1.5, "must be a positive integer, got 1.5"),
        (True, "must be a positive integer, got true"),
    ],
)
def test_bad_train_epochs_are_config_errors(tmp_path, value, message):
    with pytest.raises(ConfigError, match=re.escape(f"param_groups[0].train_epochs: {message}")):
        demo_config(tmp_path, optimizer=first_epochs_only(MOMENTUM_SGD, value))  # 2 epochs


def test_train_py_refuses_a_bad_train_epochs_in_one_line_and_runs_one_beyond_the_run(
    make_config, tmp_path
):
    config = make_config(**{"optimizer": first_epochs_only(MOMENTUM_SGD, 0)})
    result = run_script("train.py", "-c", str(config))
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"error: {config}: optimizer.param_groups[0].train_epochs: must be a positive integer, "
        "got 0"
    ]
    assert not (tmp_path / "saved").exists()  # refused before anything was written
    # A recipe's 3 epochs of a group in a run of 2 (--epochs 2): it trains throughout.
    config = make_config(**{"optimizer": first_epochs_only(MOMENTUM_SGD, 3)})
    result = run_script("train.py", "-c", str(config), "--epochs", "2")
    assert result.returncode == 0, result.stderr[-3000:]


# --- augmentation presets ----------------------------------------------------------------------


def test_augmentation_policies_and_random_erasing_are_in_the_training_transform():
    transform = cifar_transform(True, auto_augment="trivialaugment", random_erasing=0.25)
    kinds = [type(step) for step in transform.transforms]
    assert v2.TrivialAugmentWide in kinds and kinds[-1] is v2.RandomErasing
    assert transform.transforms[-1].p == 0.25
    plain = [type(step) for step in cifar_transform(False, auto_augment="randaugment").transforms]
    assert v2.RandAugment not in plain and v2.RandomErasing not in plain
    policy = imagenet_transform(True, auto_augment="autoaugment").transforms[3]
    assert policy.policy == v2.AutoAugmentPolicy.IMAGENET


def test_train_and_eval_sizes_are_set_separately():
    image = Image.new("RGB", (400, 300))
    sizes = {"image_size": 176, "eval_image_size": 224, "eval_resize_size": 232}
    assert imagenet_transform(True, **sizes)(image).shape == (3, 176, 176)
    evaluation = imagenet_transform(False, **sizes)
    assert evaluation.transforms[1].size == [232] and evaluation(image).shape == (3, 224, 224)


# --- top-k checkpoints -----------------------------------------------------------------------


def test_top_k_keeps_the_best_epochs_and_says_which_left():
    monitor = Monitor("max", "val/accuracy", early_stop=0, top_k=2)
    values = [0.5, 0.7, 0.6, 0.7, 0.9, 0.7]
    ranked = [
        monitor.rank_top_k({"val/accuracy": value}, epoch)
        for epoch, value in enumerate(values, start=1)
    ]
    assert ranked == [(True, []), (True, []), (True, [1]), (True, [3]), (True, [4]), (False, [])]
    assert monitor.top == [(0.9, 5), (0.7, 2)]  # epoch 6 tied with epoch 2, which stays
    restored = Monitor("max", "val/accuracy", early_stop=0, top_k=2)
    assert restored.load_state_dict(monitor.state_dict()) and restored.top == monitor.top


@settings(max_examples=30, deadline=None)
@given(
    mode=st.sampled_from(["min", "max"]),
    top_k=st.integers(1, 4),
    values=st.lists(st.sampled_from([0.1, 0.5, 0.9, math.nan]), min_size=1, max_size=8),
)
def test_top_k_are_the_best_numbers_whatever_nan_came_between(
    mode: str, top_k: int, values: list[float]
) -> None:
    """The epochs kept (and the checkpoints on disk: every epoch that entered and never left)
    are the top_k best numbers, earliest first on ties; a nan epoch only fills a free place."""
    monitor = Monitor(mode, "val/f1", early_stop=0, top_k=top_k)
    on_disk: set[int] = set()
    for epoch, value in enumerate(values, start=1):
        entered, dropped = monitor.rank_top_k({"val/f1": value}, epoch)
        on_disk = (on_disk | ({epoch} if entered else set())) - set(dropped)
    numbers = [(value, epoch) for epoch, value in enumerate(values, start=1) if value == value]
    numbers.sort(key=lambda item: item[0], reverse=mode == "max")  # stable: ties stay in order
    nans = [epoch for epoch, value in enumerate(values, start=1) if value != value]
    expected = ([epoch for _, epoch in numbers] + nans)[:top_k]
    assert [epoch for _, epoch in monitor.top] == expected
    assert on_disk == set(expected)


def test_a_nan_epoch_does_not_push_out_a_kept_one():
    monitor = Monitor("max", "val/f1", early_stop=0, top_k=2)
    ranked = [monitor.rank_top_k({"val/f1": v}, e) for e, v in enumerate([math.nan, 0.5, 0.7], 1)]
    assert ranked == [(True, []), (True, []), (True, [1])]  # before: epoch 2 (0.5) was dropped
    assert monitor.top == [(0.7, 3), (0.5, 2)]
