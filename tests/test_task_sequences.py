"""The sequence worked example (docs/extending.md#worked-example-sequences): token sequences of
unequal length in JSONL files, padded by the loader's collate hook, classified by a GRU that
padding does not change; trained, tested, predicted and exported through the entry points.

The fast tests check the hooks, the padding invariance, the bad inputs and a tiny run end to
end in this process; the slow ones measure the figures: test accuracy against the majority
class, 1 against 2 processes, a mid-epoch resume, and exports run on lengths they never saw."""

import contextlib
import json
import re
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    NUM_EXAMPLES,
    ROOT,
    assert_stopped_run_resumes_bit_exact,
    run_main,
    run_script,
    torchrun,
    validated_in_one_process,
    write_shrunk,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_model import assert_refuses_numbers_of_classes_that_are_no_count

import export
from build import load_inference_model
from data_loader.data_loaders import SequenceDataLoader, SyntheticDataLoader
from data_loader.tasks.sequences import PAD, pad_batch, write_sequences
from model.sequence import GRUClassifier
from utils.evaluation import tracing
from utils.util import DataError

RUN = Path("models") / "Sequences_GRU"
TINY = {"train": 96, "val": 32, "test": 32}


def sequence_config(tmp_path: Path, sizes: dict[str, int] = TINY, **overrides: object) -> Path:
    """configs/sequences.json shrunk (2 epochs, batch 32), on write_sequences' files of `sizes`."""
    write_sequences(tmp_path / "data", sizes=sizes)
    overrides = {"data_loader.args.data_dir": str(tmp_path / "data"), **overrides}
    return write_shrunk(
        "configs/sequences.json", tmp_path / "config.json", tmp_path / "saved", **overrides
    )


def loader(data_dir: Path, **args: object) -> SequenceDataLoader:
    return SequenceDataLoader(data_dir=str(data_dir), batch_size=8, seed=0, **args)


# --- the hooks ----------------------------------------------------------------------------------


def test_collate_defaults_to_torchs_and_the_loaders_use_the_hook(tmp_path):
    """BaseDataLoader.collate: None (default_collate) unless a loader says; SequenceDataLoader's
    batches are the sequences padded with PAD to the longest of the batch, labels (B,)."""
    images = SyntheticDataLoader(num_train=8, num_test=8, batch_size=4, seed=0)
    assert images.collate("train") is None
    assert images.train_loader().collate_fn is torch.utils.data.default_collate
    write_sequences(tmp_path, sizes={"train": 40, "test": 8})
    data = loader(tmp_path)
    assert data.splits == ("train", "test") and data.class_names() == ["a", "b", "c"]
    train = data.train_loader()
    assert train.collate_fn is pad_batch and data.eval_loader("test").collate_fn is pad_batch
    dataset = data.dataset("train")
    for tokens, labels in train:
        lengths = (tokens != PAD).sum(dim=1)
        assert tokens.shape == (len(labels), int(lengths.max())) and labels.dtype == torch.int64
    # Each row: the sequence, then only padding.
    batch = pad_batch([dataset[0], dataset[1]])
    for row, (sequence, label) in enumerate([dataset[0], dataset[1]]):
        assert torch.equal(batch[0][row, : len(sequence)], sequence)
        assert not batch[0][row, len(sequence) :].any() and batch[1][row] == label


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_a_sequences_logits_depend_neither_on_padding_nor_on_its_batch(num_examples):
    model = GRUClassifier(vocab_size=20, num_classes=4, embedding_dim=8, hidden_size=12).eval()
    sequence = st.lists(st.integers(1, 19), min_size=1, max_size=24)

    @settings(max_examples=num_examples)
    @given(st.lists(sequence, min_size=1, max_size=6), st.integers(0, 7), st.randoms())
    def check(sequences, extra, random):
        order = list(range(len(sequences)))
        random.shuffle(order)
        tokens = [torch.tensor(sequences[index]) for index in order]
        batch = pad_batch([(sequence, 0) for sequence in tokens])[0]
        batch = torch.nn.functional.pad(batch, (0, extra), value=PAD)  # more padding after all
        with torch.no_grad():
            together = model(batch)  # (B, 4)
            for row, sequence in enumerate(tokens):
                alone = model(sequence.unsqueeze(0))[0]  # unpadded, batch of one
                torch.testing.assert_close(together[row], alone, rtol=1e-5, atol=1e-6)

    check()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"train\.jsonl:2: not JSON"),
        (
            '{"tokens": [3, 0, 4], "label": "a"}',
            r'train\.jsonl:2: "tokens" must be a non-empty list',
        ),
        ('{"tokens": [], "label": "a"}', r'train\.jsonl:2: "tokens" must be a non-empty list'),
        (
            '{"tokens": [3, 40], "label": "a"}',
            r"train\.jsonl:2: token 40 is outside the vocabulary",
        ),
        ('{"tokens": [3, 4], "label": 1}', r'train\.jsonl: every "label" must be a class name'),
        # Several labels (multi-label data) or an object: was "unhashable type" from a set.
        ('{"tokens": [3, 4], "label": ["a", "b"]}', r'train\.jsonl: every "label" must be a'),
        ('{"tokens": [3, 4], "label": {"name": "a"}}', r'train\.jsonl: every "label" must be a'),
    ],
)
def test_a_bad_line_is_one_error_naming_it(tmp_path, line, message):
    write_sequences(tmp_path, sizes={"train": 1})
    with (tmp_path / "train.jsonl").open("a") as file:
        file.write(line + "\n")
    with pytest.raises(DataError, match=message):
        loader(tmp_path, vocab_size=32).train_loader()


@pytest.mark.parametrize(
    ("data_vocab_size", "message"),
    [
        (None, "{data}/train.jsonl: token 63 is outside the vocabulary of arch.args.vocab_size "
         "32 (the model's embedding: tokens 1 to 31)"),
        (64, "arch.args.vocab_size is 32, but data_loader.args.vocab_size is 64: the embedding "
         "has no row for tokens 32 to 63; set arch.args.vocab_size to 64"),
    ],
)  # fmt: skip
def test_tokens_outside_the_models_vocabulary_are_one_line(tmp_path, data_vocab_size, message):
    """Data of 64 tokens for the model's 32, the loader's vocab_size left out or set to the
    data's: refused before anything is written (it was the embedding's IndexError traceback,
    'index out of range in self', or a device-side assert on a GPU)."""
    message = message.format(data=tmp_path / "data")
    write_sequences(tmp_path / "data", sizes=TINY, vocab_size=64)
    overrides = {
        "data_loader.args.data_dir": str(tmp_path / "data"),
        "data_loader.args.vocab_size": data_vocab_size,
    }
    config = write_shrunk(
        "configs/sequences.json", tmp_path / "config.json", tmp_path / "saved", **overrides
    )
    result = run_main("train.py", "-c", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == f"error: {message}"
    assert not (tmp_path / "saved").exists()


def test_check_inputs_refuses_exactly_what_the_embedding_cannot_take():
    """GRUClassifier.check_inputs (what train.py, test.py and predict.py call) refuses a batch
    if and only if the model's forward pass would fail on it with the embedding's IndexError,
    and names the largest token."""
    model = GRUClassifier(vocab_size=12, num_classes=2, embedding_dim=4, hidden_size=4).eval()

    @settings(max_examples=30, deadline=None)
    @given(st.lists(st.lists(st.integers(1, 15), min_size=1, max_size=8), min_size=1, max_size=5))
    def check(sequences):
        batch = pad_batch([(torch.tensor(sequence), 0) for sequence in sequences])[0]  # (B, T)
        largest = max(max(sequence) for sequence in sequences)
        try:
            with torch.no_grad():
                model(batch)
            fails = False
        except IndexError:
            fails = True
        assert fails == (largest >= 12)
        if not fails:
            model.check_inputs(batch, "new.jsonl")
            return
        with pytest.raises(DataError, match=rf"^new\.jsonl: token {largest} is outside"):
            model.check_inputs(batch, "new.jsonl")

    check()


def test_train_py_refuses_a_validation_token_outside_the_models_vocabulary(tmp_path):
    """Without data_loader.args.vocab_size, train.py checked the training share alone: token 40
    in val.jsonl was the embedding's IndexError at the first validation, an epoch in."""
    config = sequence_config(tmp_path, **{"data_loader.args.vocab_size": None})
    with (tmp_path / "data" / "val.jsonl").open("a") as file:
        file.write('{"tokens": [3, 40, 5], "label": "a"}\n')
    result = run_main("train.py", "-c", str(config))
    assert (result.returncode, result.stderr) == (
        2,
        f"error: {tmp_path / 'data' / 'val.jsonl'}: token 40 is outside the vocabulary of "
        "arch.args.vocab_size 32 (the model's embedding: tokens 1 to 31)\n",
    )
    assert not (tmp_path / "saved").exists()


def test_test_and_predict_refuse_a_token_outside_the_models_vocabulary(tmp_path):
    """A run without data_loader.args.vocab_size (the model's 32 checked the training files),
    then a test file and a file to predict holding token 40: both were the embedding's
    IndexError traceback from inside the model; now the one line train.py gives, exit 2, and
    predict.py checks every file before predicting the first."""
    overrides = {"trainer.epochs": 1, "data_loader.args.vocab_size": None}
    config = sequence_config(tmp_path, **overrides)
    assert run_main("train.py", "-c", str(config), "--run-id", "x").returncode == 0
    checkpoint = tmp_path / "saved" / RUN / "x" / "checkpoint-epoch1.pth"
    bad_line = '{"tokens": [3, 40, 5], "label": "a"}\n'
    with (tmp_path / "data" / "test.jsonl").open("a") as file:
        file.write(bad_line)
    good, bad = tmp_path / "good.jsonl", tmp_path / "new.jsonl"
    good.write_text('{"tokens": [4, 2]}\n')
    bad.write_text('{"tokens": [4, 2]}\n' + bad_line)
    report, out = tmp_path / "report.json", tmp_path / "rows.json"
    tested = run_main("test.py", "-r", str(checkpoint), "--json", str(report))
    predicted = run_main(
        "predict.py", "-r", str(checkpoint), str(good), str(bad), "--out", str(out)
    )
    refusal = (
        "token 40 is outside the vocabulary of arch.args.vocab_size 32 (the model's embedding: "
        "tokens 1 to 31)"
    )
    test_file = tmp_path / "data" / "test.jsonl"
    assert (tested.returncode, tested.stderr) == (2, f"error: {test_file}: {refusal}\n")
    assert (predicted.returncode, predicted.stderr) == (2, f"error: {bad}: {refusal}\n")
    assert predicted.stdout == "" and not report.exists() and not out.exists()


@pytest.mark.parametrize("dropout", [1.5, -0.1, 1, "0.1"])
def test_a_dropout_outside_0_to_1_is_one_line(tmp_path, dropout):
    """It was nn.Dropout's ValueError (or a TypeError for a string) as a traceback from inside
    GRUClassifier; 1 would have zeroed every feature the head reads, without a word."""
    config = sequence_config(tmp_path, **{"arch.args.dropout": dropout})
    result = run_main("train.py", "-c", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"error: {config}: arch.args: dropout must be a number in [0, 1), got {dropout!r}"
    )


def test_a_file_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Windows Notepad's UTF-8 starts with a byte order mark: line 1 was refused as "not JSON
    (Unexpected UTF-8 BOM)"."""
    write_sequences(tmp_path, sizes={"train": 20, "val": 4})
    before = loader(tmp_path).fingerprint()
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert loader(tmp_path).fingerprint() == before


def test_a_label_outside_the_classes_names_its_file_and_line(tmp_path):
    write_sequences(tmp_path, sizes={"train": 20, "val": 1})
    with (tmp_path / "val.jsonl").open("a") as file:
        file.write('{"tokens": [5], "label": "z"}\n')
    with pytest.raises(DataError, match=r"val\.jsonl:2: label 'z' is not one of the classes"):
        loader(tmp_path).val_loader()


def test_a_list_of_labels_with_class_names_given_names_its_file_and_line(tmp_path):
    """With data_loader.args.class_names, a label that is a list was looked up in a dict:
    TypeError "unhashable type: 'list'", naming neither the file nor the line."""
    write_sequences(tmp_path, sizes={"train": 20})
    with (tmp_path / "train.jsonl").open("a") as file:
        file.write('{"tokens": [5], "label": ["a", "b"]}\n')
    with pytest.raises(
        DataError, match=r"train\.jsonl:21: label \['a', 'b'\] is not one of the classes"
    ):
        loader(tmp_path, class_names=["a", "b", "c"]).train_loader()


def test_the_fingerprint_changes_when_a_sequence_does(tmp_path):
    write_sequences(tmp_path, sizes={"train": 20, "val": 4})
    before = loader(tmp_path).fingerprint()
    lines = (tmp_path / "train.jsonl").read_text().splitlines()
    record = json.loads(lines[3])
    record["tokens"][0] += 1  # one token of one sequence, its label kept
    lines[3] = json.dumps(record)
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    after = loader(tmp_path).fingerprint()
    assert after["train"] != before["train"] and after["val"] == before["val"]


# --- end to end ---------------------------------------------------------------------------------


def test_train_test_predict_end_to_end_on_jsonl_files(tmp_path):
    """A tiny run in this process: train.py on sequences (no image grid, no crash), test.py
    on the test file, predict.py on a JSONL file without labels."""
    config = sequence_config(tmp_path)
    result = run_main("train.py", "-c", str(config), "--run-id", "tiny")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "No TensorBoard input grid: the inputs are not images of one shape." in result.stdout
    assert "Data: 96 training samples, 32 validation samples, 3 classes" in result.stdout
    checkpoint = tmp_path / "saved" / RUN / "tiny" / "model_best.pth"
    report_path = tmp_path / "report.json"
    result = run_main("test.py", "-r", str(checkpoint), "--json", str(report_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["num_samples"] == 32 and set(report["per_class_accuracy"]) == {"a", "b", "c"}
    lines = (tmp_path / "data" / "test.jsonl").read_text().splitlines()[:3]
    unlabelled = tmp_path / "new.jsonl"
    unlabelled.write_text(
        "".join(json.dumps({"tokens": json.loads(line)["tokens"]}) + "\n" for line in lines)
    )
    out = tmp_path / "predictions.json"
    result = run_main("predict.py", "-r", str(checkpoint), str(unlabelled), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [row["path"] for row in rows] == [f"{unlabelled}:{number}" for number in (1, 2, 3)]
    assert all(sorted(row["labels"]) == ["a", "b", "c"] for row in rows)


def test_test_py_refuses_data_whose_classes_are_not_the_models(tmp_path):
    """The classes are train.jsonl's labels, sorted: another data folder whose train.jsonl has
    no "a" makes "b" class 0 and "c" class 1, and test.py scored the model's "a" output against
    the "b" sequences (test accuracy 0.09 where the model is right on 0.84 of them). Refused,
    as the checkpoint's class names are not the data's."""
    config = sequence_config(tmp_path, **{"trainer.epochs": 1})
    assert run_main("train.py", "-c", str(config), "--run-id", "x").returncode == 0
    checkpoint = tmp_path / "saved" / RUN / "x" / "checkpoint-epoch1.pth"
    (tmp_path / "other").mkdir()
    for split in ("train", "test"):
        lines = (tmp_path / "data" / f"{split}.jsonl").read_text().splitlines()
        kept = [line for line in lines if json.loads(line)["label"] != "a"]
        (tmp_path / "other" / f"{split}.jsonl").write_text("\n".join(kept) + "\n")
    other = f"data_loader.args.data_dir={tmp_path / 'other'}"
    report = tmp_path / "report.json"
    result = run_main("test.py", "-r", str(checkpoint), "--set", other, "--json", str(report))
    assert result.returncode == 2 and not report.exists()
    assert result.stderr == (
        f"error: {checkpoint}: the data's classes (b, c) are not the model's, in the order it "
        "trained on (a, b, c)\n"
    )
    # The data it trained on is evaluated as before.
    assert run_main("test.py", "-r", str(checkpoint), "--json", str(report)).returncode == 0


@pytest.mark.slow
def test_learns_well_above_the_majority_class(tmp_path):
    """The figure of docs/extending.md: its commands, real processes, the shipped config's 8
    epochs (batch 32 as shipped) on the generated 1200 training sequences; test accuracy
    against always answering the most common class of the test file."""
    written = run_script("-m", "data_loader.tasks.sequences", str(tmp_path / "data"))
    assert written.returncode == 0, written.stderr[-3000:]
    assert [
        len((tmp_path / "data" / f"{split}.jsonl").read_text().splitlines())
        for split in ("train", "val", "test")
    ] == [1200, 300, 300]
    overrides = {"data_loader.args.data_dir": str(tmp_path / "data"), "trainer.epochs": 8}
    config = write_shrunk(
        "configs/sequences.json", tmp_path / "config.json", tmp_path / "saved", **overrides
    )
    started = time.monotonic()
    result = run_script("train.py", "-c", str(config), "--run-id", "learn")
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    report_path = tmp_path / "report.json"
    best = tmp_path / "saved" / RUN / "learn" / "model_best.pth"
    assert run_main("test.py", "-r", str(best), "--json", str(report_path)).returncode == 0
    accuracy = json.loads(report_path.read_text())["metrics"]["test/accuracy"]
    labels = [json.loads(line)["label"] for line in (tmp_path / "data" / "test.jsonl").open()]
    majority = max(labels.count(name) for name in set(labels)) / len(labels)
    print(f"test accuracy {accuracy:.4f}, majority class {majority:.4f}; train.py {seconds:.1f} s")
    assert majority < 0.4 and accuracy > majority + 0.4


@pytest.mark.slow
@pytest.mark.parametrize("format_name", ["export", "onnx", "torchscript"])
def test_the_exported_model_runs_on_lengths_it_never_saw(tmp_path, format_name):
    """export.py with the loader's dynamic length: its parity check covers lengths 8 and 32 of
    an export made at 16; here the file is also run on lengths 3 and 45, and batch 5."""
    if format_name == "onnx" and not _has_onnxruntime():
        pytest.skip("optional onnx, onnxscript, onnxruntime not installed")
    config = sequence_config(tmp_path, **{"trainer.epochs": 1})
    assert run_main("train.py", "-c", str(config), "--run-id", "x").returncode == 0
    checkpoint = tmp_path / "saved" / RUN / "x" / "checkpoint-epoch1.pth"
    suffix = export.SUFFIXES[format_name]
    out = tmp_path / f"model{suffix}"
    # The recommended format as a real process; the others in this one.
    run = run_script if format_name == "export" else run_main
    result = run("export.py", "-r", str(checkpoint), "--format", format_name, "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "batch 8, batch 1, length 8, length 32)" in result.stdout, result.stdout
    assert "dynamic batch and length, inputs (16,)" in result.stdout
    model, _, _ = load_inference_model(checkpoint)
    run_file = load_exported(format_name, out)
    generator = torch.Generator().manual_seed(1)
    differences = []
    for length in (3, 45):
        tokens = torch.randint(1, 32, (5, length), generator=generator)
        tokens[1:, length // 2 :] = PAD  # padded rows too
        with torch.no_grad():
            differences.append((run_file(tokens) - model(tokens)).abs().max().item())
    print(f"{format_name}: max |logit difference| on lengths 3 and 45: {max(differences):.3g}")
    assert max(differences) <= export.TOLERANCE


@pytest.fixture
def untrained_checkpoint(tmp_path: Path) -> Path:
    """configs/sequences.json's model, randomly initialised, saved as train.py saves it: all
    export.py reads (its data folder does not exist)."""
    config = json.loads((ROOT / "configs" / "sequences.json").read_text())
    config["data_loader"]["args"]["data_dir"] = str(tmp_path / "nowhere")
    torch.manual_seed(0)
    model = GRUClassifier(**config["arch"]["args"])
    path = tmp_path / "checkpoint-epoch1.pth"
    torch.save({"model": model.state_dict(), "config": config, "epoch": 1}, path)
    return path


def test_an_export_that_fixes_the_length_fails_the_parity_check(
    untrained_checkpoint, tmp_path, capsys, monkeypatch
):
    """Without the while_loop decomposition, torch.export unrolls the GRU over the 16 steps of
    the example: the check on another length catches it, and nothing is written."""
    monkeypatch.setattr(tracing, "rnn_loops", lambda dynamic: contextlib.nullcontext())
    out = tmp_path / "model.pt2"
    assert export.main(["-r", str(untrained_checkpoint), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: export: the exported model fails on length 8 (8, 8) (")
    assert err.endswith(f"; {out} not written\n") and len(err.splitlines()) == 1
    assert not out.exists() and sorted(path.name for path in tmp_path.iterdir()) == [
        "checkpoint-epoch1.pth"
    ]


def test_a_bad_export_declaration_is_one_line(untrained_checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(SequenceDataLoader, "dynamic_dims", {0: "batch"})
    assert export.main(["-r", str(untrained_checkpoint), "--out", str(tmp_path / "m.pt2")]) == 2
    assert capsys.readouterr().err == (
        "error: SequenceDataLoader.dynamic_dims: must map input dims > 0 (0 is the batch) to "
        "names, e.g. {1: \"length\"}, got {0: 'batch'}\n"
    )


def _has_onnxruntime() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) for name in ("onnx", "onnxscript", "onnxruntime"))


def load_exported(format_name: str, path: Path):
    """The file loaded back in plain torch (or onnxruntime): tokens (B, T) -> logits (B, K)."""
    if format_name == "export":
        return torch.export.load(str(path)).module()
    if format_name == "torchscript":
        return torch.jit.load(str(path))
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [item.name for item in session.get_inputs()] == ["tokens"]
    assert [item.name for item in session.get_outputs()] == ["logits"]
    return lambda tokens: torch.from_numpy(session.run(None, {"tokens": tokens.numpy()})[0])


# --- resume and processes -----------------------------------------------------------------------


def test_a_mid_epoch_resume_is_bit_exact(stop_at, tmp_path):
    """128 training sequences at batch 32 (4 steps an epoch), with dropout, stopped after step 6
    (mid epoch 2) and resumed: the weights and metrics of the uninterrupted run, bit for bit."""
    config = sequence_config(
        tmp_path,
        {"train": 160, "test": 8},
        **{"trainer.type": "StopAt", "trainer.deterministic": True, "trainer.tensorboard": False},
        **{"data_loader.args.validation_split": 32, "arch.args.dropout": 0.2},
    )
    assert_stopped_run_resumes_bit_exact(config, tmp_path / "saved" / RUN, stop_at_step=6)


@pytest.mark.slow
def test_two_processes_validate_as_one_does(tmp_path):
    """torchrun, 2 gloo processes: both ranks log the same metrics, and test.py in one process
    scores the validation data as the 2 ranks together did (each rank pads its own batches)."""
    config = sequence_config(tmp_path, {"train": 320, "val": 70}, **{"trainer.epochs": 1})
    result = torchrun("-c", str(config), "--run-id", "ddp", "--set", "trainer.verbosity=2")
    # {rank: "train/loss ... val/accuracy ..."} of the epoch lines (rank 0's may be untagged).
    lines = dict(re.findall(r"(?:\[rank (\d)\] )?epoch 1/1  (.*?)  \(", result.stdout))
    assert len(lines) == 2 and len(set(lines.values())) == 1, lines
    checkpoint = tmp_path / "saved" / RUN / "ddp" / "checkpoint-epoch1.pth"
    report, recorded = validated_in_one_process(checkpoint, tmp_path / "val.json")
    print(
        f"2 processes: val/accuracy {recorded['val/accuracy']}, val/loss {recorded['val/loss']}; "
        f"1 process: {report['metrics']['val/accuracy']}, {report['metrics']['val/loss']}"
    )
    assert report["num_samples"] == 70
    assert report["metrics"]["val/accuracy"] == recorded["val/accuracy"]
    assert report["metrics"]["val/loss"] == pytest.approx(recorded["val/loss"], rel=1e-6)


def test_gru_classifier_refuses_a_number_of_classes_that_is_no_count():
    assert_refuses_numbers_of_classes_that_are_no_count("GRUClassifier", {"vocab_size": 5})
