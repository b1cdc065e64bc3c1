"""CIFAR-10 files in torchvision's format, made up: 5 x 20 training and 10 test images with
labels index % 10, and one planted bright pixel to check the layout by."""

import hashlib
import pickle

import numpy as np

CLASSES = [f"kind{index}" for index in range(10)]
NUM_PER_BATCH = 20
NUM_TEST = 10
# A bright pixel in an otherwise black training image: (image index, channel, row, column).
PLANTED = (44, 2, 7, 21)


def archive_files() -> dict[str, bytes]:
    """{file name: bytes} of the folder cifar-10-batches-py, the same on every call."""
    rng = np.random.default_rng(0)
    files = {}
    # Python 3 pickles with str keys: CIFAR10 reads them with pickle.load(encoding="latin1").
    for batch in range(5):
        data = rng.integers(0, 256, size=(NUM_PER_BATCH, 3072), dtype=np.uint8)
        first = batch * NUM_PER_BATCH
        index, channel, row, column = PLANTED
        if first <= index < first + NUM_PER_BATCH:
            # Rows are 3 planes of 32x32 (R, G, B), each row-major.
            data[index - first] = 0
            data[index - first, channel * 1024 + row * 32 + column] = 251
        files[f"data_batch_{batch + 1}"] = pickle.dumps(
            {
                "batch_label": f"training batch {batch + 1} of 5",
                "labels": [(first + offset) % 10 for offset in range(NUM_PER_BATCH)],
                "data": data,
                "filenames": [f"image_{first + offset}.png" for offset in range(NUM_PER_BATCH)],
            },
            protocol=2,
        )
    files["test_batch"] = pickle.dumps(
        {
            "batch_label": "testing batch 1 of 1",
            "labels": [offset % 10 for offset in range(NUM_TEST)],
            "data": rng.integers(0, 256, size=(NUM_TEST, 3072), dtype=np.uint8),
            "filenames": [f"test_{offset}.png" for offset in range(NUM_TEST)],
        },
        protocol=2,
    )
    files["batches.meta"] = pickle.dumps(
        {"num_cases_per_batch": NUM_PER_BATCH, "label_names": CLASSES, "num_vis": 3072},
        protocol=2,
    )
    return files


def md5_attributes(files: dict[str, bytes], meta: dict) -> dict:
    """The CIFAR10 class attributes (train_list, test_list, meta) that make torchvision accept
    `files`: it checks every file's md5 against them. `meta` is CIFAR10.meta."""

    def md5(name: str) -> str:
        return hashlib.md5(files[name]).hexdigest()

    return {
        "train_list": [
            [f"data_batch_{batch}", md5(f"data_batch_{batch}")] for batch in range(1, 6)
        ],
        "test_list": [["test_batch", md5("test_batch")]],
        "meta": {**meta, "md5": md5("batches.meta")},
    }
