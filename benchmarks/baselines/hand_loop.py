"""The work of benchmarks/whole_run.py written by hand, as a user would without the template.

configs/demo.json's CifarCNN, Adam lr 0.003 under a per-epoch cosine, batches of 64 from
torchvision's ImageFolder with the template's "cifar" transforms, validation (accuracy, top-5),
a checkpoint (written to a temporary name, then renamed) and TensorBoard every epoch. Stopwatches
time the phases whole_run.py prints beside train.py's; it runs this as its own process.
"""

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The phases timed in the loop itself (whole_run.py adds start-up, exit and the rest).
PHASES = [
    "build",
    "loggers and data summary",
    "first batch of each epoch",
    "steps",
    "waits for data",
    "validation",
    "saves",
    "other in the loop",
    "closing loggers",
]


def main(data: str, epochs: int, workers: int, out: str, phases_path: str) -> None:
    """The same work written by hand: the loop a user would otherwise write, with stopwatches."""
    import numpy as np
    import torch
    from torch.nn import functional
    from torch.utils.data import DataLoader, Subset
    from torch.utils.tensorboard import SummaryWriter
    from torchvision import datasets

    sys.path.insert(0, str(ROOT))
    from data_loader.transforms import cifar_transform
    from model.model import CifarCNN

    phases = dict.fromkeys(PHASES, 0.0)
    build_start = time.time()
    torch.manual_seed(0)
    train_set = datasets.ImageFolder(f"{data}/train", transform=cifar_transform(True))
    if Path(data, "val").is_dir():
        val_set = datasets.ImageFolder(f"{data}/val", transform=cifar_transform(False))
    else:  # 10 % of train/ held out
        order = np.random.default_rng(0).permutation(len(train_set))
        held_out = len(train_set) // 10
        val_set = Subset(
            datasets.ImageFolder(f"{data}/train", transform=cifar_transform(False)),
            order[:held_out],
        )
        train_set = Subset(train_set, order[held_out:])
    loader = dict(batch_size=64, num_workers=workers, persistent_workers=workers > 0)
    train_loader = DataLoader(train_set, shuffle=True, **loader)
    val_loader = DataLoader(val_set, **loader)
    model = CifarCNN(
        in_shape=[3, 32, 32], num_classes=10, widths=[32, 64, 128], convs_per_block=1, dropout=0.0
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    tick = time.time()
    phases["build"] = tick - build_start
    writer = SummaryWriter(f"{out}/log")
    phases["loggers and data summary"] = time.time() - tick
    first_step, global_step = None, 0
    for epoch in range(1, epochs + 1):
        model.train()
        loss_sum, correct = torch.zeros(()), torch.zeros((), dtype=torch.long)
        tick = time.time()
        for step, (images, labels) in enumerate(train_loader, 1):
            now = time.time()
            phases["first batch of each epoch" if step == 1 else "waits for data"] += now - tick
            first_step = first_step or now
            logits = model(images)
            loss = functional.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            global_step += 1
            loss_sum += loss.detach() * len(labels)
            correct += (logits.argmax(1) == labels).sum()
            if step % 10 == 0:
                writer.add_scalar("train/loss", loss.item(), global_step)
            tick = time.time()
            phases["steps"] += tick - now
        tick = time.time()
        model.eval()
        val_correct, val_top5, val_loss = 0, 0, 0.0
        with torch.no_grad():
            for images, labels in val_loader:
                logits = model(images)
                val_loss += float(functional.cross_entropy(logits, labels, reduction="sum"))
                val_correct += int((logits.argmax(1) == labels).sum())
                val_top5 += int((logits.topk(5, 1).indices == labels[:, None]).any(1).sum())
        phases["validation"] += time.time() - tick
        tick = time.time()
        scheduler.step()
        for name, value in (("accuracy", val_correct), ("top_k_acc", val_top5)):
            writer.add_scalar(f"val/{name}", value / len(val_set), global_step)
        writer.add_scalar("val/loss", val_loss / len(val_set), global_step)
        writer.add_scalar("train/loss_epoch", float(loss_sum) / len(train_set), global_step)
        print(
            f"epoch {epoch}: val/accuracy {val_correct / len(val_set):.4f} ({int(correct)} right in training)"
        )
        phases["other in the loop"] += time.time() - tick
        tick = time.time()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        torch.save(state, f"{out}/checkpoint.tmp")
        os.replace(f"{out}/checkpoint.tmp", f"{out}/checkpoint-epoch{epoch}.pth")
        phases["saves"] += time.time() - tick
    tick = time.time()
    writer.close()
    phases["closing loggers"] = time.time() - tick
    Path(phases_path).write_text(json.dumps({
        "phases": phases, "build start": build_start, "first step": first_step, "main end": time.time(),
    }))  # fmt: skip
