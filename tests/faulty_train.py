"""train.py with faults injected, for tests that need them in a subprocess (torchrun included):
python tests/faulty_train.py <train.py arguments>, with any of

FAULT_SLOW_SAVE=SECONDS   every checkpoint write pauses halfway for SECONDS (a kill can land
                          inside it, leaving its temporary file)
FAULT_FULL_DISK=N         the N-th checkpoint save of this process fails halfway with ENOSPC
FAULT_SLOW_PREPARE=SECONDS  rank 0's prepare_data of the synthetic data takes SECONDS
"""

import errno
import io
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import train
from data_loader.data_loaders import SyntheticDataLoader

real_save = torch.save
num_saves = 0


def faulty_save(state: object, file: object, *args: object, **kwargs: object) -> None:
    """torch.save into a file object: half of the bytes, a pause or a full disk, the rest."""
    global num_saves
    if not hasattr(file, "write") or isinstance(file, io.BytesIO):  # not a file: e.g. what
        return real_save(state, file, *args, **kwargs)  # torch.distributed sends as bytes
    num_saves += 1
    buffer = io.BytesIO()
    real_save(state, buffer, *args, **kwargs)
    data = buffer.getvalue()
    file.write(data[: len(data) // 2])
    file.flush()
    if num_saves == int(os.environ.get("FAULT_FULL_DISK", "0")):
        raise OSError(errno.ENOSPC, "No space left on device")
    time.sleep(float(os.environ.get("FAULT_SLOW_SAVE", "0")))
    file.write(data[len(data) // 2 :])
    return None


def slow_prepare(self: SyntheticDataLoader) -> None:
    if self.rank == 0:
        time.sleep(float(os.environ["FAULT_SLOW_PREPARE"]))


if __name__ == "__main__":
    torch.save = faulty_save
    if "FAULT_SLOW_PREPARE" in os.environ:
        SyntheticDataLoader.prepare_data = slow_prepare
    sys.exit(train.main())
