"""Tables (data_loader/tabular.py) as a user's CSV file holds them: class labels that are any
numbers, columns in any order beside others the model never saw, and rows edited between a
run and its resume (issue 31, items 3 to 5).

The properties (hypothesis) check the loader and predict.py's reader on many tables; one plain
run per item trains, predicts or resumes through the entry points, in-process (run_main)."""

import argparse
import csv
import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import NUM_EXAMPLES, ROOT, run_main
from hypothesis import given, settings
from hypothesis import strategies as st

import predict
from data_loader.tabular import TabularDataLoader
from model.model import TabularMLP
from utils.evaluation.row_stream import predict_rows
from utils.util import DataError


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def csv_config(tmp_path: Path, table: Path, *, num_classes: int | None = None) -> Path:
    """configs/tabular.json on the CSV file `table` (a classification with num_classes), 2
    epochs of a small MLP, its outputs under tmp_path/saved."""
    config = json.loads((ROOT / "configs/tabular.json").read_text())
    task = "regression" if num_classes is None else "classification"
    config["data_loader"]["args"] = {
        "csv": str(table),
        "task": task,
        "test_split": 0.2,
        "validation_split": 0.2,
        "batch_size": 16,
    }
    config["arch"]["args"] = {"in_features": 3, "hidden": [16], "num_classes": num_classes}
    if num_classes is not None:
        config.update(loss="cross_entropy", metrics=["accuracy"])
        config["trainer"]["monitor"] = "max val/accuracy"
    config["trainer"].update(epochs=2, save_dir=str(tmp_path / "saved"), save_period=1)
    path = tmp_path / f"{table.stem}.json"
    path.write_text(json.dumps(config))
    return path


def features(num_rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(num_rows, 3)).round(4)


# --- item 3: class labels are any numbers --------------------------------------------------------


def classes_of(path: Path) -> tuple[TabularDataLoader, dict[str, list[int]]]:
    """The loader of a classification CSV whose first feature is the row's number, and per split
    the class index of each of its samples, by row number."""
    data = TabularDataLoader(csv=str(path), task="classification", batch_size=4, seed=0)
    labels = {}
    for split in data.splits:
        dataset = data.dataset(split)
        by_row = {int(row[0]): int(label) for row, label in dataset}
        labels[split] = [by_row[row] for row in sorted(by_row)]
    return data, labels


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_class_labels_are_invariant_to_an_offset_of_the_label_values(tmp_path, num_examples):
    @settings(max_examples=num_examples)
    @given(
        labels=st.lists(st.integers(-5, 20), min_size=5, max_size=40),
        offset=st.integers(-1000, 1000),
    )
    def check(labels: list[int], offset: int) -> None:
        tables = []
        for name, shift in (("labels", 0), ("shifted", offset)):
            rows = [[row, 0.5, label + shift] for row, label in enumerate(labels)]
            tables.append(
                classes_of(write_csv(tmp_path / f"{name}.csv", ["row", "x", "target"], rows))
            )
        (data, indices), (shifted_data, shifted_indices) = tables
        values = sorted(set(labels))
        # Classes 0..K-1, one per label value in sorted order, named by the value.
        assert data.class_names() == [str(value) for value in values]
        assert shifted_data.class_names() == [str(value + offset) for value in values]
        assert indices == shifted_indices
        for split in data.splits:
            rows = sorted(int(row[0]) for row, _ in data.dataset(split))
            names = [data.class_names()[index] for index in indices[split]]
            assert names == [str(labels[row]) for row in rows]

    check()


def test_labels_1_to_3_train_3_classes_and_predict_prints_the_labels(tmp_path):
    x = features(120)
    labels = 1 + (x[:, 0] > 0) + (x[:, 1] > 0.5)  # classes 1, 2 and 3
    rows = x[:8].tolist()
    inputs = write_csv(tmp_path / "rows.csv", ["a", "b", "c"], rows)
    predicted = []
    for offset in (0, 10):
        name = f"labels{offset}"
        table = [[*row, int(label) + offset] for row, label in zip(x.tolist(), labels, strict=True)]
        table_path = write_csv(tmp_path / f"{name}.csv", ["a", "b", "c", "target"], table)
        config = csv_config(tmp_path, table_path, num_classes=3)
        trained = run_main("train.py", "-c", str(config), "--run-id", name)
        assert trained.returncode == 0, trained.stderr
        best = tmp_path / "saved" / "models" / "Diabetes_MLP" / name / "model_best.pth"
        out = tmp_path / f"{name}-predicted.json"
        result = run_main("predict.py", "-r", str(best), str(inputs), "--out", str(out))
        assert result.returncode == 0 and not result.stderr, result.stderr
        predicted.append(json.loads(out.read_text()))
    plain, shifted = predicted
    assert all(set(row["labels"]) == {"1", "2", "3"} for row in plain)
    # The same model (the same classes 0..2, seed and rows), named by each file's labels.
    for row, other in zip(plain, shifted, strict=True):
        assert other["labels"] == [str(int(label) + 10) for label in row["labels"]]
        assert other["probabilities"] == row["probabilities"]
    # A checkpoint whose names do not fit its outputs (one trained before the fix with labels
    # 1..3 has 4 outputs, 3 names): class indices and a warning, not an IndexError.
    best = tmp_path / "saved" / "models" / "Diabetes_MLP" / "labels0" / "model_best.pth"
    state = torch.load(best, weights_only=True)
    state["class_names"] = state["class_names"][1:]
    torch.save(state, tmp_path / "older.pth")
    result = run_main("predict.py", "-r", str(tmp_path / "older.pth"), str(inputs))
    assert result.returncode == 0 and "2 class names for 3 outputs" in result.stderr
    assert [line.split()[1] for line in result.stdout.splitlines()] == [
        str(["1", "2", "3"].index(row["labels"][0])) for row in plain
    ]
    # test.py on the file with label 1 renamed 4: its classes 2, 3, 4 would be the model's 1, 2,
    # 3 (a row of class 2 scored right when predicted "1"); refused, not scored.
    assert run_main("test.py", "-r", str(best)).returncode == 0
    table = tmp_path / "labels0.csv"
    table.write_text(table.read_text().replace(",1\n", ",4\n"))
    result = run_main("test.py", "-r", str(best))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    expected = (
        "the data's classes (2, 3, 4) are not the model's, in the order it trained on (1, 2, 3)"
    )
    assert expected in result.stderr


# --- item 4: predict.py reads the features by name ----------------------------------------------

NAMES = st.text(alphabet="abcdefxyz_ ", min_size=1, max_size=6)
NUMBERS = st.floats(allow_nan=False, allow_infinity=False, width=32)  # exact in float32


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_rows_read_for_predict_are_invariant_to_column_order_and_extra_columns(
    tmp_path, num_examples
):
    @settings(max_examples=num_examples)
    @given(
        names=st.lists(NAMES, min_size=2, max_size=8, unique=True),
        num_features=st.integers(1, 5),
        num_rows=st.integers(1, 6),
        data=st.data(),
    )
    def check(names: list[str], num_features: int, num_rows: int, data: st.DataObject) -> None:
        features = names[:num_features]  # the model's columns; the others are extra
        row_values = st.lists(NUMBERS, min_size=len(names), max_size=len(names))
        values = data.draw(st.lists(row_values, min_size=num_rows, max_size=num_rows))
        # Extra columns (an id, a target, notes) need not hold numbers.
        cells = [
            [value if column < num_features or data.draw(st.booleans()) else f"id {row}"
             for column, value in enumerate(values[row])]
            for row in range(num_rows)
        ]  # fmt: skip
        order = data.draw(st.permutations(range(len(names))))
        shuffled = [[row[column] for column in order] for row in cells]
        write_csv(tmp_path / "shuffled.csv", [names[column] for column in order], shuffled)
        write_csv(tmp_path / "plain.csv", features, [row[:num_features] for row in values])
        _, expected = TabularDataLoader.read_inputs(tmp_path / "plain.csv", {}, features)
        assert expected.tolist() == [row[:num_features] for row in values]
        _, inputs = TabularDataLoader.read_inputs(tmp_path / "shuffled.csv", {}, features)
        assert torch.equal(inputs, expected)

    check()


def test_predict_reads_reordered_columns_beside_an_id_and_names_a_missing_one(tmp_path):
    x = features(120)
    table = write_csv(tmp_path / "table.csv", ["a", "b", "c", "target"],
                      [[*row, row[0] + 2 * row[1] - row[2] + 3] for row in x.tolist()])  # fmt: skip
    trained = run_main("train.py", "-c", str(csv_config(tmp_path, table)), "--run-id", "r")
    assert trained.returncode == 0, trained.stderr
    best = tmp_path / "saved" / "models" / "Diabetes_MLP" / "r" / "model_best.pth"
    assert torch.load(best, weights_only=True)["feature_names"] == ["a", "b", "c"]
    rows = x[:4].tolist()
    plain = write_csv(tmp_path / "plain.csv", ["a", "b", "c"], rows)
    # The columns in another order, an id of text and a target column the model never reads.
    other = write_csv(tmp_path / "other.csv", ["id", "c", "target", "a", "b"],
                      [[f"p{i}", c, 0, a, b] for i, (a, b, c) in enumerate(rows)])  # fmt: skip
    printed = []
    for sheet in (plain, other):
        result = run_main("predict.py", "-r", str(best), str(sheet))
        assert result.returncode == 0 and not result.stderr, result.stderr
        printed.append([line.split()[1] for line in result.stdout.splitlines()])
    assert printed[0] == printed[1] and len(printed[0]) == 4
    # --out never replaces an input (the user's data), not even with --force.
    before = plain.read_bytes()
    result = run_main("predict.py", "-r", str(best), str(plain), "--out", str(plain), "--force")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"--out {plain}: is an input" in result.stderr and plain.read_bytes() == before
    missing = write_csv(tmp_path / "missing.csv", ["a", "c"], [[a, c] for a, _, c in rows])
    result = run_main("predict.py", "-r", str(best), str(missing))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"{missing}: no column named 'b': the model reads its 3 feature columns by name" in (
        result.stderr
    )
    # A checkpoint from before the names were kept reads by position, and says so.
    state = torch.load(best, weights_only=True)
    del state["feature_names"]
    torch.save(state, tmp_path / "older.pth")
    result = run_main("predict.py", "-r", str(tmp_path / "older.pth"), str(plain))
    assert "no feature names (an older checkpoint): columns are read by position" in result.stderr
    assert [line.split()[1] for line in result.stdout.splitlines()] == printed[0]
    # test.py reads the run's own file: its columns reordered are refused, not misread.
    lines = table.read_text().splitlines()
    swapped = [[cells[i] for i in (2, 1, 0, 3)] for cells in (line.split(",") for line in lines)]
    table.write_text("".join(",".join(cells) + "\n" for cells in swapped))
    result = run_main("test.py", "-r", str(best))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    expected = "feature columns (c, b, a) are not the model's, in the order it trained on (a, b, c)"
    assert expected in result.stderr


def test_a_csv_file_with_a_byte_order_mark_reads_as_one_without(tmp_path):
    """Excel's "CSV UTF-8" starts the file with a byte order mark: not part of the first name."""
    rows = features(6).tolist()
    for header in (["a", "b", "c", "target"], ["target", "a", "b", "c"]):
        table = [[*row, 1.5] if header[0] == "a" else [1.5, *row] for row in rows]
        plain = write_csv(tmp_path / "plain.csv", header, table)
        marked = tmp_path / "marked.csv"
        marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
        expected = TabularDataLoader(csv=str(plain), batch_size=2, seed=0)
        data = TabularDataLoader(csv=str(marked), batch_size=2, seed=0)
        assert data.feature_names() == expected.feature_names() == ["a", "b", "c"]
        (inputs, targets), (plain_inputs, plain_targets) = data.table(), expected.table()
        assert np.array_equal(inputs, plain_inputs) and np.array_equal(targets, plain_targets)
        # predict.py: the columns by the model's names
        _, inputs = TabularDataLoader.read_inputs(marked, {}, ["a", "b", "c"])
        _, plain_inputs = TabularDataLoader.read_inputs(plain, {}, ["a", "b", "c"])
        assert torch.equal(inputs, plain_inputs)


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_predict_prints_a_regression_s_values_in_full(capsys, num_examples):
    """predict.py printed each value to 6 significant digits: a predicted 1234567 was
    "1.23457e+06", 123456.78 "123457". Each printed value now reads back as the float32 output."""

    @settings(max_examples=num_examples)
    @given(
        values=st.lists(
            st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1,
                     max_size=3).map(tuple), min_size=1, max_size=5
        ).filter(lambda rows: len({len(row) for row in rows}) == 1),
    )  # fmt: skip
    def check(values):
        outputs = torch.tensor(values, dtype=torch.float32)  # (N, K)
        names = [f"rows.csv:{line}" for line in range(2, len(values) + 2)]
        args = argparse.Namespace(batch_size=2, top_k=5, inputs=["rows.csv"], resume="m.pth")
        model = {index: output for index, output in enumerate(outputs)}
        read = [(names, torch.arange(len(values)))]  # each input is the index of its output

        def forward(indices: torch.Tensor) -> torch.Tensor:
            return torch.stack([model[int(index)] for index in indices])

        capsys.readouterr()
        predict_rows(args, forward, {}, [read])
        printed = [line.split("  ") for line in capsys.readouterr().out.splitlines()]
        assert [row[0] for row in printed] == names
        assert torch.equal(torch.tensor([[float(cell) for cell in row[1:]] for row in printed]),
                           outputs)  # fmt: skip

    check()


def test_predict_prints_1234567_as_itself(capsys):
    args = argparse.Namespace(batch_size=2, top_k=5, inputs=["rows.csv"], resume="m.pth")
    read = [(["rows.csv:2", "rows.csv:3"], torch.zeros(2, 3))]
    outputs = torch.tensor([[1234567.0], [123456.78]])
    predict_rows(args, lambda rows: outputs, {}, [read])
    printed = [line.split("  ")[1] for line in capsys.readouterr().out.splitlines()]
    # read back as float32, as the model gave them
    assert torch.equal(torch.tensor([[float(value)] for value in printed]), outputs), printed


def test_a_csv_file_not_in_utf_8_is_refused_in_one_line(tmp_path):
    """Excel's plain "CSV" is in the system's code page (Windows-1252 on Western systems)."""
    path = tmp_path / "table.csv"
    path.write_bytes("größe,b,target\n1,2,3\n4,5,6\n".encode("cp1252"))
    expected = f"{path}: not UTF-8 text (byte 0xf6): save it as CSV UTF-8"
    with pytest.raises(DataError, match=re.escape(expected)):
        TabularDataLoader(csv=str(path), batch_size=2, seed=0).table()
    with pytest.raises(DataError, match=re.escape(expected)):
        TabularDataLoader.read_inputs(path, {}, ["b"])


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_a_csv_file_of_other_separators_is_refused_naming_them(tmp_path, num_examples):
    """Excel where the decimal mark is a comma saves "CSV" with semicolons: the header read as one
    column said "2 values, but the header has 1" for training, "no column named 'a', 'b', 'c'"
    for predict.py; the error names the separator, for both."""

    @settings(max_examples=num_examples)
    @given(
        separator=st.sampled_from([(";", "semicolons"), ("\t", "tabs"), ("|", "vertical bars")]),
        num_rows=st.integers(1, 6),
        decimal_comma=st.booleans(),
    )
    def check(separator, num_rows, decimal_comma):
        mark, name = separator
        rows = [[f"{value:.2f}" for value in row] for row in features(num_rows).tolist()]
        rows = [[cell.replace(".", ",") if decimal_comma else cell for cell in row] for row in rows]
        path = tmp_path / "table.csv"
        lines = [["a", "b", "target"], *rows]
        path.write_text("".join(mark.join(cells) + "\n" for cells in lines))
        expected = f"{path}: its cells are separated by {name}, not commas: save it as CSV with "
        with pytest.raises(DataError, match=re.escape(expected)):
            TabularDataLoader(csv=str(path), batch_size=2, seed=0).table()
        with pytest.raises(DataError, match=re.escape(expected)):
            TabularDataLoader.read_inputs(path, {}, ["a", "b"])

    check()


def test_train_py_refuses_a_semicolon_separated_file_in_one_line(tmp_path):
    table = tmp_path / "table.csv"
    table.write_text("a;b;c;target\n1,5;2;3;4\n2;3;4;5\n")
    result = run_main("train.py", "-c", str(csv_config(tmp_path, table)))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"{table}: its cells are separated by semicolons, not commas" in result.stderr
    assert not (tmp_path / "saved").exists()


@pytest.mark.parametrize("cell", ["nan", "NaN", "inf", "-Infinity"])
@pytest.mark.parametrize("column", ["b", "target"])
def test_a_missing_or_infinite_value_is_refused_with_its_line_and_column(tmp_path, cell, column):
    """float() reads "nan" and "inf": a NaN feature would make every output NaN, a NaN label a
    class of its own. Refused like an empty cell, for training and for predict.py."""
    header = ["a", "b", "c", "target"]
    table = [[*row, index % 2] for index, row in enumerate(features(6).tolist())]
    table[3][header.index(column)] = cell
    path = write_csv(tmp_path / "table.csv", header, table)
    expected = f"{path}:5: column {column!r}: {cell!r} is not a finite number"
    for task in ("regression", "classification"):
        data = TabularDataLoader(csv=str(path), task=task, batch_size=2, seed=0)
        with pytest.raises(DataError, match=re.escape(expected)):
            data.table()
    if column != "target":
        with pytest.raises(DataError, match=re.escape(expected)):
            TabularDataLoader.read_inputs(path, {}, ["a", "b", "c"])


def test_predict_names_each_row_by_the_line_it_starts_on_after_a_cell_of_several_lines(tmp_path):
    """A spreadsheet's notes may hold line breaks (a quoted cell): the rows are named, and a bad
    value reported, by the line of the file they start on, not by their number."""
    path = write_csv(
        tmp_path / "rows.csv",
        ["notes", "a", "b", "c"],
        [["one line", 1, 2, 3], ["two\nlines", 4, 5, 6], ["", 7, 8, 9], ["", 1, 1, 1]],
    )
    names, inputs = TabularDataLoader.read_inputs(path, {}, ["a", "b", "c"])
    assert names == [f"{path}:{line}" for line in (2, 3, 5, 6)]
    assert inputs[:, 0].tolist() == [1, 4, 7, 1]
    lines = path.read_text().splitlines()
    assert [lines[line - 1] for line in (2, 3, 5, 6)] == [
        "one line,1,2,3",
        '"two',
        ",7,8,9",
        ",1,1,1",
    ]
    path.write_text(path.read_text().replace(",7,8,9", ",seven,8,9"))
    with pytest.raises(DataError, match=re.escape(f"{path}:5: column 'a': 'seven' is not a")):
        TabularDataLoader.read_inputs(path, {}, ["a", "b", "c"])


@pytest.mark.parametrize(
    ("arch_args", "message"),
    [
        # One output: a classifier of one class, whose targets are left unstandardised.
        ({"num_classes": 1}, "num_classes must be at least 2 (a classifier), or null for a"),
        ({"num_classes": 0}, "num_classes must be at least 2 (a classifier), or null for a"),
        ({"hidden": 64}, "hidden must be a list of positive integers (the hidden layers' widths)"),
        ({"hidden": [0]}, "hidden must be a list of positive integers"),  # a constant model
        ({"hidden": [-4]}, "hidden must be a list of positive integers"),
        ({"dropout": 1.5}, "dropout must be a fraction in [0, 1), got 1.5"),
    ],
)
def test_model_arguments_that_cannot_work_are_refused_in_one_line(tmp_path, arch_args, message):
    x = features(40)
    table = write_csv(tmp_path / "table.csv", ["a", "b", "c", "target"],
                      [[*row, row[0] + 2 * row[1]] for row in x.tolist()])  # fmt: skip
    config = json.loads(csv_config(tmp_path, table).read_text())
    config["arch"]["args"].update(arch_args)
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run_main("train.py", "-c", str(tmp_path / "config.json"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr


class Rows:
    """What TabularMLP.fit_data reads of a data loader: the training share's (features, target)."""

    def __init__(self, features: np.ndarray, targets: np.ndarray) -> None:
        self.samples = list(
            zip(torch.from_numpy(features), torch.from_numpy(targets).unsqueeze(1), strict=True)
        )

    def training_samples(self) -> list:
        return self.samples


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_model_standardises_its_inputs_as_the_float64_statistics_of_the_training_rows(
    num_examples,
):
    """Each feature minus its mean over the training rows, over their standard deviation; a
    feature constant there is left unscaled (scikit-learn's StandardScaler does the same), so a
    new row that differs in it is not multiplied by a million."""

    @settings(max_examples=num_examples)
    @given(
        num_rows=st.integers(2, 60),
        columns=st.lists(
            st.tuples(
                st.floats(-6, 6).map(lambda power: math.copysign(10 ** abs(power), power)),
                st.sampled_from([0.0, 1e-2, 1.0, 1e3]),  # spread 0: a constant column
            ),
            min_size=1,
            max_size=4,
        ),
        seed=st.integers(0, 2**16),
    )
    def check(num_rows: int, columns: list[tuple[float, float]], seed: int) -> None:
        rng = np.random.default_rng(seed)
        means, spreads = np.array(columns).T
        features = (means + spreads * rng.normal(size=(num_rows, len(columns)))).astype(np.float32)
        targets = rng.normal(size=num_rows).astype(np.float32)
        model = TabularMLP(in_features=len(columns), hidden=[4])
        model.fit_data(Rows(features, targets))
        exact = features.astype(np.float64)
        std = exact.std(axis=0, ddof=1)
        constant = (exact == exact[0]).all(axis=0)
        assert np.allclose(model.input_mean.numpy(), exact.mean(axis=0), rtol=1e-6, atol=0)
        expected = np.where(constant, 1.0, std)
        assert np.allclose(model.input_std.numpy(), expected, rtol=1e-5, atol=0), (
            model.input_std,
            expected,
        )

    check()


# --- item 5: a resume refuses rows re-sorted or edited ------------------------------------------


def held_rows(path: Path) -> tuple[list, list]:
    """The loader of a regression CSV, and the rows (features and target) its training share,
    its validation share and its test split hold, in order."""
    data = TabularDataLoader(csv=str(path), batch_size=4, seed=0, validation_split=0.25)
    inputs, targets = data.dataset("train").tensors
    rows = torch.cat([inputs, targets], dim=1)
    test = torch.cat(data.dataset("test").tensors, dim=1).tolist()
    return data, [*(rows[indices].tolist() for indices in data.split_indices()), test]


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_fingerprint_changes_exactly_when_the_rows_of_a_split_do(tmp_path, num_examples):
    @settings(max_examples=num_examples)
    @given(
        num_rows=st.integers(4, 30),
        num_columns=st.integers(2, 4),
        edit=st.sampled_from(["sort", "permute", "value"]),
        data=st.data(),
    )
    def check(num_rows: int, num_columns: int, edit: str, data: st.DataObject) -> None:
        cell = st.integers(-3, 3)  # few values: equal rows and no-op edits come up too
        row = st.lists(cell, min_size=num_columns, max_size=num_columns)
        table = data.draw(st.lists(row, min_size=num_rows, max_size=num_rows))
        header = [*(f"x{i}" for i in range(num_columns - 1)), "target"]
        before = held_rows(write_csv(tmp_path / "before.csv", header, table))
        if edit == "sort":
            edited = sorted(table)
        elif edit == "permute":
            edited = [table[i] for i in data.draw(st.permutations(range(num_rows)))]
        else:
            edited = [list(values) for values in table]
            edited[data.draw(st.integers(0, num_rows - 1))][
                data.draw(st.integers(0, num_columns - 1))
            ] = data.draw(cell)
        after = held_rows(write_csv(tmp_path / "after.csv", header, edited))
        same_data = before[1] == after[1]
        assert (before[0].fingerprint() == after[0].fingerprint()) == same_data

    check()


def test_a_resume_refuses_rows_re_sorted_or_one_value_changed_unless_allowed(tmp_path):
    x = features(120)
    lines = [",".join(map(str, [*row, row[0] - row[2]])) for row in x.tolist()]
    table = tmp_path / "table.csv"
    table.write_text("".join(f"{line}\n" for line in ["a,b,c,target", *lines]))
    config = csv_config(tmp_path, table)
    assert run_main("train.py", "-c", str(config), "--run-id", "r").returncode == 0
    run_dir = tmp_path / "saved" / "models" / "Diabetes_MLP" / "r"
    data = TabularDataLoader(csv=str(table), batch_size=16, seed=0, validation_split=0.2)
    training_features = data.dataset("train").tensors[0][data.split_indices()[0][0]].numpy()
    first_training_row = int(np.abs(x - training_features).sum(axis=1).argmin())
    edited = list(lines)
    cells = edited[first_training_row].split(",")
    edited[first_training_row] = ",".join([cells[0], "7.5", *cells[2:]])
    test_val = ["-r", str(run_dir / "model_best.pth"), "--split", "val"]
    both = "training split: other samples (77); validation split: other samples (19)"
    for rows, change, val_changed in (
        (sorted(lines), both, True),
        (edited, "training split: other samples (77)", False),
    ):
        table.write_text("".join(f"{line}\n" for line in ["a,b,c,target", *rows]))
        result = run_main("train.py", "-r", str(run_dir), "--epochs", "3")
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert f"the data changed since this checkpoint ({change}); resume on" in result.stderr
        # test.py --split val checks the validation rows alone.
        assert run_main("test.py", *test_val).returncode == (2 if val_changed else 0)
    resumed = run_main("train.py", "-r", str(run_dir), "--epochs", "3", "--allow-data-change")
    assert resumed.returncode == 0 and "The data changed since" in resumed.stdout + resumed.stderr


def test_test_py_refuses_a_test_split_reshuffled_by_rows_added_since_training(tmp_path):
    x = features(130)
    lines = [",".join(map(str, [*row, row[0] - row[2]])) for row in x.tolist()]
    table = tmp_path / "table.csv"
    table.write_text("".join(f"{line}\n" for line in ["a,b,c,target", *lines[:120]]))
    assert (
        run_main("train.py", "-c", str(csv_config(tmp_path, table)), "--run-id", "r").returncode
        == 0
    )
    best = tmp_path / "saved" / "models" / "Diabetes_MLP" / "r" / "model_best.pth"
    assert run_main("test.py", "-r", str(best)).returncode == 0
    data = TabularDataLoader(csv=str(table), batch_size=16, seed=0, validation_split=0.2)
    trained = set(data.sample_ids("train"))  # the rows that trained or validated
    # Ten rows more: the test split is drawn anew from 130 rows, and holds rows that trained.
    table.write_text("".join(f"{line}\n" for line in ["a,b,c,target", *lines]))
    after = TabularDataLoader(csv=str(table), batch_size=16, seed=0, validation_split=0.2)
    assert set(after.sample_ids("test")) & trained
    result = run_main("test.py", "-r", str(best))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "--split test: the data changed since this checkpoint (test split: 26 samples, 24 " in (
        result.stderr
    )
    allowed = run_main("test.py", "-r", str(best), "--allow-data-change")
    assert allowed.returncode == 0 and "the data changed since" in allowed.stdout + allowed.stderr


def test_a_table_without_a_test_split_trains_and_test_py_says_there_is_nothing_to_score(tmp_path):
    """test_split 0 (an integer in JSON too): every row trains or validates. test.py's test split
    is then empty: refused in one line, not a nan loss over 0 samples and exit 0."""
    x = features(60)
    table = write_csv(tmp_path / "table.csv", ["a", "b", "c", "target"],
                      [[*row, row[0] - row[2]] for row in x.tolist()])  # fmt: skip
    config = csv_config(tmp_path, table)
    settings = json.loads(config.read_text())
    settings["data_loader"]["args"]["test_split"] = 0
    config.write_text(json.dumps(settings))
    assert run_main("train.py", "-c", str(config), "--run-id", "r").returncode == 0
    best = tmp_path / "saved" / "models" / "Diabetes_MLP" / "r" / "model_best.pth"
    result = run_main("test.py", "-r", str(best))
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: {best}: --split test: the data has no samples in that split\n"
    assert run_main("test.py", "-r", str(best), "--split", "val").returncode == 0


# --- predict.py holds a chunk of a long file, not the file --------------------------------------


def trained_checkpoint(tmp_path: Path, num_classes: int | None) -> Path:
    """model_best.pth of a 2-epoch run on 120 rows of columns a, b, c (a classification of
    num_classes classes, or a regression)."""
    x = features(120)
    labels = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5) if num_classes else x @ [1, 2, -1]
    table = [[*row, label] for row, label in zip(x.tolist(), labels.tolist(), strict=True)]
    table_path = write_csv(tmp_path / "table.csv", ["a", "b", "c", "target"], table)
    config = csv_config(tmp_path, table_path, num_classes=num_classes)
    trained = run_main("train.py", "-c", str(config), "--run-id", "r")
    assert trained.returncode == 0, trained.stderr
    return tmp_path / "saved" / "models" / "Diabetes_MLP" / "r" / "model_best.pth"


@pytest.mark.parametrize("num_classes", [None, 3])
def test_predict_writes_the_same_bytes_for_any_chunk_size_and_column_order(
    tmp_path, monkeypatch, num_classes
):
    """predict.py reads a CSV file CHUNK_ROWS rows at a time and streams --out: its output (and
    what it prints) is that of the file read whole, in the batches of it, whatever the chunk
    size, the batch size or the order of the columns (an id column, some of whose cells hold a
    line break, moves the line each row starts on)."""
    best = trained_checkpoint(tmp_path, num_classes)
    inputs, out = tmp_path / "rows.csv", tmp_path / "out"

    def predicted(chunk_rows: int, batch_size: int, suffix: str) -> tuple[str, bytes]:
        monkeypatch.setattr(predict, "CHUNK_ROWS", chunk_rows)
        path = out.with_suffix(suffix)
        arguments = ["-r", str(best), str(inputs), "--out", str(path), "--force"]
        result = run_main("predict.py", *arguments, "--batch-size", str(batch_size), "--top-k", "2")
        assert result.returncode == 0 and not result.stderr, result.stderr
        return result.stdout, path.read_bytes()

    @settings(max_examples=25, deadline=None)
    @given(
        num_rows=st.integers(1, 40),
        chunk_rows=st.integers(1, 45),
        batch_size=st.integers(1, 45),
        suffix=st.sampled_from([".csv", ".json"]),
        order=st.permutations(range(4)),
        breaks=st.lists(st.booleans(), min_size=40, max_size=40),
    )
    def check(num_rows, chunk_rows, batch_size, suffix, order, breaks) -> None:
        x = features(num_rows, seed=num_rows).tolist()
        cells = [["two\nlines" if breaks[i] else f"p{i}", *row] for i, row in enumerate(x)]
        write_csv(inputs, ["id", "a", "b", "c"], cells)
        whole = predicted(10**9, batch_size, suffix)  # one chunk: the file read whole
        assert whole[0].count("\n") == num_rows
        write_csv(inputs, [["id", "a", "b", "c"][i] for i in order],
                  [[row[i] for i in order] for row in cells])  # fmt: skip
        assert predicted(chunk_rows, batch_size, suffix) == whole

    check()


def test_predict_holds_a_chunk_of_a_long_file_not_the_file(tmp_path, monkeypatch):
    """predict.py held every row of its CSV files (as lists of cells, then every output row) in
    memory: millions of rows were the machine's RAM. Read CHUNK_ROWS at a time and --out
    streamed, its peak of Python allocations (tracemalloc: numpy's arrays too) is the same for
    4 times the rows."""
    import tracemalloc

    best = trained_checkpoint(tmp_path, None)

    def peak(num_rows: int) -> int:
        inputs = write_csv(tmp_path / "rows.csv", ["a", "b", "c"], features(num_rows).tolist())
        out = tmp_path / "out.csv"
        arguments = ["-r", str(best), str(inputs), "--out", str(out), "--force"]
        # stdout to nowhere: a capture would hold every printed row
        with open(os.devnull, "w") as devnull:
            monkeypatch.setattr(sys, "stdout", devnull)
            monkeypatch.setattr(predict, "CHUNK_ROWS", 200, raising=False)
            tracemalloc.start()
            try:
                assert predict.main(arguments) == 0
                return tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
                monkeypatch.undo()
                assert out.read_text().count("\n") == num_rows + 1

    peak(1000)  # imports and caches, once
    small, large = peak(2000), peak(8000)
    # before: 1.45 MB for 2000 rows, 5.42 MB for 8000; now 0.42 MB for both
    assert large < 1.2 * small, (small, large)


@settings(max_examples=25, deadline=None)
@given(
    num_rows=st.integers(1, 30),
    chunk_rows=st.integers(1, 35),
    bad=st.sampled_from(["", "nan", "x", "cells"]),
    data=st.data(),
)
def test_read_in_chunks_the_rows_and_a_bad_one_are_those_of_the_file_read_whole(
    tmp_path_factory, num_rows, chunk_rows, bad, data
):
    """read_input_chunks (predict.py's reader) gives the rows, names and one-line errors (a bad
    value, a row of too few cells: its line) that read_inputs gives for the file read whole."""
    path = tmp_path_factory.mktemp("chunks") / "rows.csv"
    cells = [["p", *row] for row in features(num_rows).tolist()]
    if bad:
        row = data.draw(st.integers(0, num_rows - 1))
        cells[row] = cells[row][:2] if bad == "cells" else [*cells[row][:2], bad, cells[row][3]]
    write_csv(path, ["id", "c", "a", "b"], cells)
    names = ["a", "b", "c"]
    try:
        expected = TabularDataLoader.read_inputs(path, {}, names)
    except DataError as error:
        with pytest.raises(DataError) as raised:
            list(TabularDataLoader.read_input_chunks(path, {}, names, chunk_rows))
        assert str(raised.value) == str(error) and bad
        return
    chunks = list(TabularDataLoader.read_input_chunks(path, {}, names, chunk_rows))
    assert all(0 < len(inputs) <= chunk_rows for _, inputs in chunks)
    assert [name for chunk_names, _ in chunks for name in chunk_names] == expected[0]
    assert torch.equal(torch.cat([inputs for _, inputs in chunks]), expected[1])


def test_a_bad_row_in_the_last_chunk_is_refused_before_a_row_is_printed_or_out_replaced(
    tmp_path, monkeypatch
):
    best = trained_checkpoint(tmp_path, None)
    monkeypatch.setattr(predict, "CHUNK_ROWS", 4)
    inputs = write_csv(tmp_path / "rows.csv", ["a", "b", "c"], features(10).tolist())
    out = tmp_path / "out.json"
    arguments = ["-r", str(best), str(inputs), "--out", str(out), "--force"]
    assert run_main("predict.py", *arguments).returncode == 0
    before = out.read_bytes()
    rows = [*features(9).tolist(), [1.0, "", 2.0]]  # line 11, the third chunk's second row
    write_csv(inputs, ["a", "b", "c"], rows)
    result = run_main("predict.py", *arguments)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr == f"error: {inputs}:11: column 'b': '' is not a finite number\n"
    assert out.read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(".")) == []


@settings(max_examples=25, deadline=None)
@given(
    values=st.lists(st.lists(NUMBERS, min_size=2, max_size=2), max_size=12),
    classes=st.booleans(),
    cuts=st.lists(st.integers(0, 12)),
    suffix=st.sampled_from([".csv", ".json"]),
)
def test_out_written_a_batch_at_a_time_is_format_rows_of_every_row(values, classes, cuts, suffix):
    """RowStream (predict.py's --out, streamed) writes the bytes format_rows gives for all the
    rows at once, however they are cut into batches, none included."""
    import io

    from utils.evaluation.predictions import format_rows
    from utils.evaluation.row_stream import RowStream

    if classes:
        rows = [{"path": f"r{i}", "labels": ["x", "y"], "probabilities": v} for i, v in
                enumerate(values)]  # fmt: skip
    else:
        rows = [{"path": f"r{i}", "values": v} for i, v in enumerate(values)]
    file = io.BytesIO()
    stream = RowStream(file, suffix)
    bounds = [0, *sorted(min(cut, len(rows)) for cut in cuts), len(rows)]
    for start, end in itertools.pairwise(bounds):
        stream.write(rows[start:end])
    stream.finish()
    assert file.getvalue().decode("utf-8") == format_rows(rows, suffix)


@pytest.mark.skipif(not Path("/dev/stdin").exists(), reason="no /dev/stdin on this system")
def test_predict_reads_rows_from_a_pipe_as_from_a_file(tmp_path):
    """A file is read twice (checked, then predicted a chunk at a time); a pipe
    (`zcat rows.csv.gz | python predict.py -r CKPT /dev/stdin`) would be empty the second time,
    so it is read once, whole. The real process: its stdin is the pipe."""
    best = trained_checkpoint(tmp_path, None)
    plain = write_csv(tmp_path / "rows.csv", ["a", "b", "c"], features(5).tolist())
    expected = run_main("predict.py", "-r", str(best), str(plain))
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "predict.py", "-r", str(best), "/dev/stdin"],
        cwd=ROOT, env=environment, input=plain.read_text(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected.stdout.replace(str(plain), "/dev/stdin")
