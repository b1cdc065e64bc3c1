"""Samplers, k-fold splits and the checks and summary of the data before training, in-process:
samplers and folds are checked on the indices they produce."""

import json
import logging
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import NUM_EXAMPLES, run_main
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data import Dataset

from base import BaseDataLoader
from base.base_data_loader import DataError
from data_loader.data_loaders import ImageFolderDataLoader
from model.loss import cross_entropy
from utils.config.config_checks import CLASS_WEIGHTS
from utils.data.batches import epoch_batches
from utils.data.data_summary import log_data_summary


class LabelSet(Dataset):
    """Sample i is (i, labels[i]): batches show which indices a loader drew."""

    def __init__(self, labels: list[int]) -> None:
        self.targets = labels

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, self.targets[index]


class Toy(BaseDataLoader):
    """A loader over given labels; its transform returns (index, 1.0 if augmented else 0.0)."""

    splits = ("train", "test")

    def __init__(self, labels: list[int], **kwargs) -> None:
        super().__init__(**{"batch_size": 8, "seed": 0, **kwargs})
        self.all_labels = list(labels)

    def load_split(self, split: str) -> Dataset:
        return LabelSet(self.all_labels)

    def transform(self, augment: bool):
        return lambda index: torch.tensor([float(index), float(augment)])

    def class_names(self) -> list[str]:
        return [f"class{label}" for label in range(max(self.all_labels) + 1)]


def drawn(sampler, epoch: int = 1) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


# --- samplers --------------------------------------------------------------------------------

IMBALANCED = [0] * 100 + [1] * 900  # 1:9


def test_weighted_sampler_balances_a_1_to_9_set():
    data = Toy(IMBALANCED, sampler="weighted")
    for epoch in (1, 2):
        labels = np.array(IMBALANCED)[drawn(data.train_sampler(), epoch)]
        assert len(labels) == 1000
        assert 0.4 < np.mean(labels == 0) < 0.6  # near 1:1; 0.1 without weighting
    # Weights from the config are per sample of each class: 9:1 weights undo a 1:9 imbalance,
    # equal weights keep it.
    balanced = np.array(IMBALANCED)[
        drawn(Toy(IMBALANCED, sampler="weighted", class_weights=[9, 1]).train_sampler())
    ]
    assert 0.4 < np.mean(balanced == 0) < 0.6
    kept = np.array(IMBALANCED)[
        drawn(Toy(IMBALANCED, sampler="weighted", class_weights=[1, 1]).train_sampler())
    ]
    assert 0.07 < np.mean(kept == 0) < 0.13


def test_weighted_sampler_draws_only_training_samples_and_keeps_the_balance_over_ranks():
    data = [
        Toy(IMBALANCED, sampler="weighted", validation_split=0.2, num_replicas=2, rank=rank)
        for rank in (0, 1)
    ]
    _, val_indices = data[0].split_indices()
    shares = [drawn(loader.train_sampler()) for loader in data]
    assert not (set(shares[0]) | set(shares[1])) & set(val_indices.tolist())
    labels = np.array(IMBALANCED)
    # Balanced over all ranks together (one global draw, then sharded)...
    assert 0.4 < np.mean(labels[shares[0] + shares[1]] == 0) < 0.6
    # ...and each rank's share is every second draw of it.
    global_order = data[0].train_sampler().global_order(1)
    assert shares[0] == global_order[0::2].tolist() and shares[1] == global_order[1::2].tolist()


SAMPLER_CASES = {
    "random": {},
    "random-replacement": {"replacement": True},
    "random-fewer-samples": {"num_samples": 40},
    "sequential": {"sampler": "sequential"},
    "shuffle-false": {"shuffle": False},
    "subset-random": {"sampler": "subset_random"},
    "weighted": {"sampler": "weighted"},
}


@pytest.mark.parametrize("args", SAMPLER_CASES.values(), ids=SAMPLER_CASES.keys())
def test_samplers_are_disjoint_and_complete_across_two_ranks(args):
    labels = [index % 3 for index in range(60)]
    kwargs = {"validation_split": 10, **args}
    samplers = [Toy(labels, num_replicas=2, rank=rank, **kwargs).train_sampler() for rank in (0, 1)]
    train_indices, _ = Toy(labels, **kwargs).split_indices()
    orders = {}
    for epoch in (1, 2):
        shares = [drawn(sampler, epoch) for sampler in samplers]
        assert [len(share) for share in shares] == [len(sampler) for sampler in samplers]
        # The ranks take alternate positions of one sequence: together exactly that sequence.
        sequence = samplers[0].global_order(epoch).tolist()
        assert shares[0] == sequence[0::2] and shares[1] == sequence[1::2]
        assert set(sequence) <= set(train_indices.tolist())
        assert len(sequence) == args.get("num_samples", len(train_indices))
        if not args.get("replacement") and args.get("sampler") != "weighted":
            # Without replacement: the shares are disjoint and (all of them) cover the data.
            assert not set(shares[0]) & set(shares[1])
            if "num_samples" not in args:
                assert set(sequence) == set(train_indices.tolist())
        orders[epoch] = sequence
    ordered = args.get("sampler") == "sequential" or args.get("shuffle") is False
    assert (orders[1] == orders[2]) == ordered
    assert (orders[1] == sorted(orders[1])) == ordered
    # The order is a function of (seed, epoch): a new sampler draws the same.
    again = Toy(labels, num_replicas=2, rank=1, **kwargs).train_sampler()
    assert drawn(again, 2) == orders[2][1::2]


def test_num_samples_beyond_the_data_takes_whole_permutations():
    sampler = Toy([0, 1] * 5, num_samples=25).train_sampler()
    order = drawn(sampler)
    assert len(order) == len(sampler) == 25
    assert sorted(order[:10]) == sorted(order[10:20]) == list(range(10))


def test_unknown_sampler_is_a_value_error():
    with pytest.raises(ValueError, match="unknown sampler 'balanced'"):
        Toy([0, 1], sampler="balanced")


def test_class_weights_must_match_the_classes():
    with pytest.raises(DataError, match=r"class_weights: 3 weights, but .* has 2 classes"):
        Toy([0, 1], sampler="weighted", class_weights=[1, 1, 1]).train_sampler()
    with pytest.raises(DataError, match="every training sample has weight 0"):
        Toy([0, 1], sampler="weighted", class_weights=[0, 0]).train_sampler()


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_class_weights_the_config_accepts_draw_or_are_refused_in_one_line(num_examples):
    """Any class_weights the config check lets through either draw (only classes of weight > 0)
    or are a one-line DataError naming the key; an infinite weight (JSON's Infinity or 1e400)
    used to pass the check and fail in numpy's draw, "Probabilities contain NaN"."""
    accepts, _ = CLASS_WEIGHTS
    labels = np.array([0] * 3 + [1] * 5 + [2] * 9)
    weight = st.floats(min_value=0) | st.sampled_from([math.inf, 1e308, 1e-300])

    @settings(max_examples=num_examples, deadline=None)
    @given(st.lists(weight, min_size=3, max_size=3))
    def check(weights: list[float]) -> None:
        if not accepts(weights):
            return
        try:
            order = drawn(
                Toy(labels.tolist(), sampler="weighted", class_weights=weights).train_sampler()
            )
        except DataError as error:
            message = str(error)
            assert message.startswith("data_loader.args.class_weights: ") and "\n" not in message
            return
        assert len(order) == len(labels)
        assert all(weights[label] > 0 for label in labels[order])

    check()


def test_an_overflowing_class_weight_is_a_one_line_error(make_config, tmp_path):
    """Weights whose sum over the samples overflows float64 made every draw probability nan:
    numpy's traceback. (JSON's Infinity is refused by the config reader, tests/test_config.py.)"""
    config = json.loads(make_config().read_text())
    config["data_loader"]["args"].update(sampler="weighted", class_weights=[1e308] * 10)
    path = tmp_path / "overflowing.json"
    path.write_text(json.dumps(config))
    result = run_main("train.py", "-c", str(path))
    assert result.returncode == 2, result.stderr[-2000:]
    error = result.stderr.strip()
    assert "\n" not in error and "data_loader.args.class_weights: " in error, error
    assert not (tmp_path / "saved" / "models").exists()


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_weighted_draw_probabilities_are_sklearns_balanced_weights_or_the_given_ones(
    num_examples,
):
    """Without class_weights each training sample is drawn with probability proportional to
    scikit-learn's compute_class_weight("balanced") of its class (inverse class frequency, over
    the training share only); with them, proportional to its class's given weight."""
    sklearn = pytest.importorskip("sklearn.utils.class_weight")

    @settings(max_examples=num_examples, deadline=None)
    @given(
        st.lists(st.integers(0, 3), min_size=2, max_size=40),
        st.integers(0, 20),
        st.lists(st.integers(1, 5), min_size=4, max_size=4),
    )
    def check(labels: list[int], num_val: int, given_weights: list[int]) -> None:
        num_val = min(num_val, len(labels) - 1)
        data = Toy(labels, sampler="weighted", validation_split=num_val)
        sampler = data.train_sampler()
        train_labels = np.array(labels)[sampler.indices]
        present = np.unique(train_labels)
        balanced = sklearn.compute_class_weight("balanced", classes=present, y=train_labels)
        expected = balanced[np.searchsorted(present, train_labels)]
        np.testing.assert_allclose(
            sampler.weights / sampler.weights.sum(), expected / expected.sum(), rtol=1e-12
        )
        num_classes = max(labels) + 1
        weights = given_weights[:num_classes]
        given_sampler = Toy(
            labels, sampler="weighted", validation_split=num_val, class_weights=weights
        ).train_sampler()
        expected = np.array(weights, dtype=float)[train_labels]
        np.testing.assert_allclose(
            given_sampler.weights / given_sampler.weights.sum(), expected / expected.sum()
        )

    check()


def test_class_weights_follow_the_image_folders_sorted_class_order(tmp_path):
    """class_weights are in label order, the class folders sorted by name as ImageFolder sorts
    them (upper case first, "a10" before "a2"), not in the order they were made."""
    folders = ["b", "a", "C", "a2", "a10"]
    root = make_image_folder(tmp_path / "images", folders, num_images=3)
    data = ImageFolderDataLoader(
        str(root), batch_size=2, seed=0, preset="cifar", sampler="weighted",
        class_weights=[0, 0, 1, 0, 0],
    )  # fmt: skip
    assert data.class_names() == ["C", "a", "a10", "a2", "b"]
    samples = data.dataset("train").samples
    assert {Path(samples[index][0]).parent.name for index in drawn(data.train_sampler())} == {"a10"}


def batch_indices(loader, epoch: int, first_batch: int, len_epoch: int, **kwargs) -> list:
    """The sample indices of each batch epoch_batches yields (Toy's inputs carry them)."""
    batches = epoch_batches(loader, epoch, first_batch, len_epoch, lambda: None, **kwargs)
    return [images[:, 0].long().tolist() for images, _ in batches]


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_epoch_order_is_the_seeds_and_epochs_alone_and_a_resume_yields_the_rest(
    num_examples,
):
    """Over dataset sizes, batch sizes, world sizes, drop_last, samplers and epochs spanning
    several passes: the ranks together train the one global order of (seed, epoch, pass)
    (the same for every world size, padded by fewer than world-size repeats of its first
    positions); a resume at any batch yields exactly the batches the epoch had left; and a
    resume in another batch size and world size trains the rest of the order, each sample once."""

    @settings(max_examples=num_examples, deadline=None)
    @given(
        num_samples=st.integers(1, 30),
        batch_size=st.integers(1, 7),
        world=st.integers(1, 4),
        drop_last=st.booleans(),
        sampler=st.sampled_from(["random", "sequential", "weighted"]),
        data=st.data(),
    )
    def check(num_samples, batch_size, world, drop_last, sampler, data) -> None:
        labels = [index % 3 for index in range(num_samples)]

        def loaders(batch_size: int, world: int) -> list:
            return [
                Toy(
                    labels, batch_size=batch_size, sampler=sampler, num_replicas=world, rank=rank
                ).train_loader(drop_last=drop_last)
                for rank in range(world)
            ]

        ranks = loaders(batch_size, world)
        per_pass = len(ranks[0])
        if per_pass == 0:
            return
        len_epoch = data.draw(st.integers(1, 3 * per_pass), label="len_epoch")
        whole = [batch_indices(loader, 2, 0, len_epoch) for loader in ranks]
        assert all(len(batches) == len_epoch for batches in whole)
        # One pass: the ranks take alternate positions of the world-size-free global order.
        order = Toy(labels, sampler=sampler).train_sampler().global_order(2).tolist()
        first_pass = [
            [index for batch in batches[:per_pass] for index in batch] for batches in whole
        ]
        num_padded = -len(order) % world if world > 1 else 0
        padded = order + [order[position % len(order)] for position in range(num_padded)]
        for rank, loader in enumerate(ranks):
            share = padded[rank::world]
            cut = len(share) - len(share) % batch_size if loader.drop_last else len(share)
            expected = share[:cut]
            if len_epoch >= per_pass:  # else the epoch ends inside the pass
                assert first_pass[rank] == expected
            assert first_pass[rank] == expected[: len(first_pass[rank])]
        # A resume at any batch: the rest of each rank's batches, bit for bit.
        resume_at = data.draw(st.integers(0, len_epoch), label="resume_at")
        for rank, loader in enumerate(ranks):
            assert batch_indices(loader, 2, resume_at, len_epoch) == whole[rank][resume_at:]
        # Another geometry, inside the first pass: the rest of the order, every sample once
        # (the new ranks' padding aside).
        done = min(resume_at, per_pass - 1) * batch_size * world
        new = loaders(data.draw(st.integers(1, 7)), data.draw(st.integers(1, 4)))
        rest = [
            index
            for loader in new
            for batch in batch_indices(loader, 2, 0, 10**6, skip_samples=done)
            for index in batch
        ]
        if not drop_last:
            expected_rest = Counter(order[done:])
            assert not expected_rest - Counter(rest)
            assert (Counter(rest) - expected_rest).total() < len(new)

    check()


class RandomToy(Toy):
    """A Toy whose transform also draws a random number: what augmentation draws."""

    def transform(self, augment: bool):
        return lambda index: torch.tensor([float(index), torch.rand(()).item()])


def three_epochs(**kwargs) -> list[torch.Tensor]:
    """The batches of epochs 1 to 3 and of epoch 2 resumed after its seventh batch. Epochs of 8
    batches over passes of 6: each ends inside its second pass (a kept worker pool is reset with
    batches still in flight), and the resume starts inside the second pass."""
    data = RandomToy([index % 3 for index in range(23)], batch_size=4, **kwargs)
    loader = data.train_loader()
    assert len(loader) == 6
    batches = [
        images for epoch in (1, 2, 3) for images, _ in epoch_batches(
            loader, epoch, 0, 8, lambda: None
        )
    ]  # fmt: skip
    resumed = epoch_batches(loader, 2, 7, 8, lambda: None)
    return batches + [images for images, _ in resumed]


@pytest.mark.parametrize(
    "workers",
    [{"num_workers": 1}, {"num_workers": 2}, {"num_workers": 2, "persistent_workers": False}],
    ids=str,
)
def test_order_and_augmentation_do_not_depend_on_the_worker_processes(workers):
    """Each sample and its random draws are the same with 0, 1 or 2 worker processes, kept
    between epochs or not, over epochs and a mid-epoch resume."""
    in_process = three_epochs()
    with_workers = three_epochs(**workers)
    assert len(in_process) == len(with_workers) == 3 * 8 + 1
    for plain, worked in zip(in_process, with_workers, strict=True):
        assert torch.equal(plain, worked)


# --- the loss with ignore_index ---------------------------------------------------------------


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_unlabelled_classifier_samples_add_zero_and_count_as_docs_extending_says(num_examples):
    """cross_entropy with ignore_index on labels (B,): any cut of the split into batches, each
    loss x its size summed over the split / N, is torch's mean over the labelled samples times
    their share; a batch of unlabelled samples alone has loss 0, not nan."""

    @settings(max_examples=num_examples, deadline=None)
    @given(st.integers(1, 12), st.floats(0.0, 1.0), st.sampled_from([0.0, 0.1]), st.integers(0, 99))
    def check(num_samples: int, unlabelled: float, label_smoothing: float, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        logits = torch.randn(num_samples, 4, generator=generator, dtype=torch.float64)
        target = torch.randint(4, (num_samples,), generator=generator)
        target[torch.rand(num_samples, generator=generator) < unlabelled] = 255
        num_labelled = int((target != 255).sum())
        for batch_size in (1, 7, num_samples):
            summed = sum(
                cross_entropy(logits[start : start + batch_size], labels, label_smoothing, 255)
                * len(labels)
                for start in range(0, num_samples, batch_size)
                for labels in [target[start : start + batch_size]]
            )
            if num_labelled == 0:
                assert summed == 0
                continue
            reference = F.cross_entropy(
                logits, target, ignore_index=255, label_smoothing=label_smoothing
            )
            torch.testing.assert_close(summed / num_samples, reference * num_labelled / num_samples)

    check()


def test_test_py_val_loss_and_accuracy_do_not_depend_on_the_batch_size(demo_checkpoint, tmp_path):
    """test.py --split val reports the same val/loss and accuracy with batches of 1, 7 and the
    whole split (64 samples): sample-weighted sums, not a mean of batch means."""
    reports = []
    for batch_size in (1, 7, 64):
        report_path = tmp_path / f"val-{batch_size}.json"
        result = run_main(
            "test.py", "-r", str(demo_checkpoint), "--split", "val", "--json", str(report_path),
            "--set", f"data_loader.args.batch_size={batch_size}",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        reports.append(json.loads(report_path.read_text()))
    assert [report["num_samples"] for report in reports] == [64, 64, 64]
    first = reports[0]["metrics"]
    for report in reports[1:]:
        assert report["metrics"].keys() == first.keys()
        for key, value in report["metrics"].items():
            assert value == pytest.approx(first[key], rel=1e-6, abs=1e-9), key


# --- k-fold splits ---------------------------------------------------------------------------

# Three classes of 50, 31 and 7 samples, shuffled.
FOLD_LABELS = np.random.default_rng(5).permutation([0] * 50 + [1] * 31 + [2] * 7).tolist()


def test_folds_are_disjoint_stratified_and_cover_the_set():
    num_folds = 3
    labels = np.array(FOLD_LABELS)
    counts = np.bincount(labels)
    validations = []
    for fold in range(num_folds):
        train_indices, val_indices = Toy(FOLD_LABELS, folds=num_folds, fold=fold).split_indices()
        assert not set(train_indices.tolist()) & set(val_indices.tolist())
        assert sorted([*train_indices.tolist(), *val_indices.tolist()]) == list(range(88))
        # Stratified: each fold holds each class's share to within one sample.
        per_class = np.bincount(labels[val_indices], minlength=3)
        assert np.all(np.abs(per_class - counts / num_folds) < 1)
        validations.append(set(val_indices.tolist()))
    assert sorted(len(validation) for validation in validations) == [29, 29, 30]
    assert set.union(*validations) == set(range(88))
    assert sum(len(validation) for validation in validations) == 88  # pairwise disjoint
    # Seeded: the same for the same seed, different for another.
    _, again = Toy(FOLD_LABELS, folds=3, fold=0).split_indices()
    _, other = Toy(FOLD_LABELS, folds=3, fold=0, seed=1).split_indices()
    assert set(again.tolist()) == validations[0] != set(other.tolist())


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=2, max_size=120),
    st.integers(2, 9),
    st.integers(0, 2**16),
    st.integers(1, 64),
    st.integers(1, 4),
)
def test_any_folds_partition_the_samples_stratified_whatever_the_batches_and_ranks(
    labels, num_folds, seed, batch_size, num_replicas
):
    """Over any labels, K (sizes that do not divide evenly too), seed, batch size and world
    size: every sample is validated by exactly one fold and trained on by the others, the folds
    differ in size by at most one sample and hold each class's share to within one."""
    num_folds = min(num_folds, len(labels))
    labels_array, rank = np.array(labels), num_replicas - 1
    counts = np.bincount(labels_array, minlength=5)
    validated = np.zeros(len(labels), dtype=int)
    sizes = []
    for fold in range(num_folds):
        split = Toy(labels, folds=num_folds, fold=fold, seed=seed).split_indices()
        sharded = Toy(
            labels, folds=num_folds, fold=fold, seed=seed, batch_size=batch_size,
            num_replicas=num_replicas, rank=rank,
        ).split_indices()  # fmt: skip
        assert all(np.array_equal(a, b) for a, b in zip(split, sharded, strict=True))
        train_indices, val_indices = split
        assert np.array_equal(np.union1d(train_indices, val_indices), np.arange(len(labels)))
        assert len(train_indices) + len(val_indices) == len(labels)  # disjoint
        np.add.at(validated, val_indices, 1)
        per_class = np.bincount(labels_array[val_indices], minlength=5)
        assert np.all(np.abs(per_class - counts / num_folds) < 1)
        sizes.append(len(val_indices))
    assert np.all(validated == 1)
    assert max(sizes) - min(sizes) <= 1


def test_a_fold_validates_without_augmentation_and_trains_on_the_rest():
    data = Toy(FOLD_LABELS, folds=4, fold=2, validation_split=0.5, batch_size=100)
    _, val_indices = data.split_indices()
    assert len(val_indices) == 22  # the fold, not validation_split's half
    (val_batch, _), *rest = list(data.val_loader())
    assert not rest
    assert val_batch[:, 0].long().tolist() == val_indices.tolist()
    assert val_batch[:, 1].tolist() == [0.0] * 22  # never augmented
    assert torch.equal(next(iter(data.eval_loader("val")))[0], val_batch)
    train_batch, _ = next(iter(data.train_loader()))
    assert not set(train_batch[:, 0].long().tolist()) & set(val_indices.tolist())
    assert train_batch[:, 1].tolist() == [1.0] * 66


def test_fold_errors_name_the_key():
    with pytest.raises(DataError, match=r"data_loader\.args\.fold: not set"):
        Toy(FOLD_LABELS, folds=3).split_indices()
    with pytest.raises(DataError, match=r"data_loader\.args\.folds: 5 folds need at least 5"):
        Toy([0, 1, 0], folds=5, fold=0).split_indices()


# --- checks and summary ----------------------------------------------------------------------


def test_summary_logs_sizes_class_counts_sampler_and_drawn_shares(caplog):
    data = Toy(IMBALANCED, sampler="weighted", folds=4, fold=1)
    with caplog.at_level(logging.INFO):
        log_data_summary(data, logging.getLogger("test"), epoch=3)
    text = caplog.text
    assert "Training data: 750 samples; per class: class0 75, class1 675" in text
    assert "Validation data (fold 1 of 4 of the training split, stratified; never " in text
    assert "250 samples; per class: class0 25, class1 225" in text
    assert "Sampler: weighted (inverse class frequency): 750 draws with replacement" in text
    assert "Classes drawn in epoch 3 (one pass, 750 draws over all ranks): class0 " in text
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


class OverlappingToy(Toy):
    """Splits its own (wrong) way: the validation data is also trained on."""

    def split_indices(self) -> tuple[np.ndarray, np.ndarray]:
        everything = np.arange(len(self.all_labels))
        return everything, everything[:5]


def test_summary_warns_about_a_missing_class_and_overlapping_splits(caplog):
    labels = [0] * 20 + [1] * 20 + [2] * 20  # the validation data is of class 0 only
    with caplog.at_level(logging.INFO):
        log_data_summary(OverlappingToy(labels, validation_split=5), logging.getLogger("test"), 1)
    warnings = [
        record.getMessage() for record in caplog.records if record.levelno == logging.WARNING
    ]
    assert len(warnings) == 2
    assert "validation data has no samples of 2 class(es): class1, class2;" in warnings[0]
    assert "Training and validation data share 5 samples (e.g. index 0 " in warnings[1]


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_summary_warns_exactly_about_the_classes_the_training_data_lacks(num_examples):
    """A validation_split may hold every sample of a rare class: the training data then has
    none, which the summary only logged as a count of 0 while the weighted sampler drew the
    other classes alone. It warns, naming exactly the classes of no training sample."""

    @settings(max_examples=num_examples, deadline=None)
    @given(st.lists(st.integers(0, 4), min_size=2, max_size=30), st.integers(1, 29))
    def check(labels: list[int], num_val: int) -> None:
        num_val = min(num_val, len(labels) - 1)
        data = Toy(labels, sampler="weighted", validation_split=num_val)
        train_indices, _ = data.split_indices()
        absent = sorted(set(range(max(labels) + 1)) - set(np.array(labels)[train_indices]))
        logger = logging.getLogger("test_summary_training_classes")
        handler = ListHandler()
        logger.addHandler(handler)
        try:
            log_data_summary(data, logger, epoch=1)
        finally:
            logger.removeHandler(handler)
        warnings = [text for text in handler.messages if text.startswith("The training data")]
        if not absent:
            assert warnings == []
            return
        names = ", ".join(f"class{label}" for label in absent)
        assert warnings == [
            f"The training data has no samples of {len(absent)} class(es): {names}: the model "
            "is never trained on them (no sampler can draw them)."
        ]
        assert not set(absent) & set(np.array(labels)[drawn(data.train_sampler())])

    check()


class ListHandler(logging.Handler):
    """Keeps the messages of the records at WARNING and above (caplog is per test, not per
    hypothesis example)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_labels_outside_the_model_classes_name_the_key_and_the_folder(tmp_path):
    root = make_image_folder(tmp_path / "images", ["a", "b", "c"])
    data = ImageFolderDataLoader(str(root), batch_size=2, seed=0, preset="cifar")
    data.check(3)
    data.check(None)
    with pytest.raises(DataError) as error:
        data.check(2)
    assert str(error.value) == (
        f"{root / 'train'}: 3 classes, but arch.args.num_classes is 2: labels 2 to 2 are outside "
        "the model's outputs; set arch.args.num_classes to 3"
    )


def make_image_folder(root: Path, classes: list[str], *, num_images: int = 2) -> Path:
    """root/train/<class>/<n>.png, 8x8 RGB noise."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / "train" / name).mkdir(parents=True)
        for index in range(num_images):
            pixels = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "train" / name / f"{index}.png")
    return root


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("path", [{}, {"pipeline": "device"}, {"decode": "device"}], ids=str)
def test_an_unreadable_image_is_a_data_error_naming_it(tmp_path, num_workers, path):
    root = make_image_folder(tmp_path / "images", ["a", "b"])
    broken = root / "train" / "b" / "1.png"
    broken.write_bytes(broken.read_bytes()[:40])  # truncated
    data = ImageFolderDataLoader(
        str(root), batch_size=4, seed=0, preset="cifar", num_workers=num_workers, **path
    )
    with pytest.raises(DataError) as error:
        list(data.train_loader())
    # One line, even when it came back from a worker process.
    message = str(error.value)
    assert message.startswith(f"{broken}: unreadable image (") and "\n" not in message
