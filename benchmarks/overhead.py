"""Overhead of the template's Trainer over a minimal hand-written training loop.

What is measured: wall time of one training epoch (`Trainer.train_epoch`, called directly) against
the same epoch written by hand, in one process. Both sides get

- the demo CNN (`CifarCNN` with configs/demo.json's arch args) from the same initial weights,
- the same in-memory batches in the same order: synthetic images generated once, passed through
  the evaluation transform (no augmentation) and kept as tensors; the Trainer reads them through
  a small `BaseDataLoader` subclass with shuffle off, the hand loop through a plain `DataLoader`
  over the very same tensors (so the per-sample fetch and collate cost is the same on both sides),
- the optimizer of configs/demo.json (Adam), built fresh for each run,
- the same metric work: loss * batch size and the number of correct predictions summed on the
  device and read once per epoch (the Trainer also reads them every `log_step` batches),
- `seed_everything(derive_seed(seed, epoch, 0))` before each epoch, as BaseTrainer does.

Runs alternate (ABAB..., the first of each pair alternating) after one untimed warm-up pair, so
load from other processes hits both sides alike. Printed: steps/s per run, the median of the
per-pair time ratios (Trainer / hand loop; goal <= 1.02), both final losses and whether the final
weights are bit-for-bit equal.

python benchmarks/overhead.py [--pairs 10] [--num-train 3200] [--threads 1] [--widths 4]
"""

import argparse
import contextlib
import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as `python benchmarks/overhead.py`: import the project

import model.loss as loss_module  # noqa: E402
import model.metric as metric_module  # noqa: E402
from base import BaseDataLoader  # noqa: E402
from data_loader.synthetic import CLASS_NAMES, generate  # noqa: E402
from data_loader.transforms import cifar_transform  # noqa: E402
from model.model import CifarCNN  # noqa: E402
from parse_config import ConfigParser  # noqa: E402
from trainer import Trainer  # noqa: E402
from utils import derive_seed, seed_everything  # noqa: E402


class InMemoryDataLoader(BaseDataLoader):
    """Ready-made (image, label) tensors as the "train" split; the transform is the identity."""

    splits = ("train",)

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.image_tensor = images  # (N, 3, 32, 32), already normalised
        self.label_tensor = labels  # (N,)

    def load_split(self, split: str) -> Dataset:
        return TensorDataset(self.image_tensor, self.label_tensor)

    def transform(self, augment: bool) -> Callable:
        return identity

    def class_names(self) -> list[str]:
        return list(CLASS_NAMES)


def identity(image: torch.Tensor) -> torch.Tensor:
    return image


@dataclass
class Run:
    """One timed run: seconds spent in the training epochs, its last loss, the trained model."""

    wall_seconds: float = 0.0
    # This process's CPU time: unlike wall time it does not grow while another process holds
    # the core, so comparing both ratios shows how much of their spread is waiting for a core.
    cpu_seconds: float = 0.0
    loss: float = float("nan")
    model: nn.Module | None = None


@contextlib.contextmanager
def timed(run: Run) -> Iterator[None]:
    """Add the wall and process CPU time of a `with` block to `run`."""
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    run.wall_seconds += time.perf_counter() - wall
    run.cpu_seconds += time.process_time() - cpu


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    # fmt: off
    add("--pairs", type=int, default=10, help="timed A/B pairs (default 10)")
    add("--num-train", type=int, default=3200, help="samples per epoch (default 3200)")
    add("--batch-size", type=int, default=64, help="default 64, as the demo")
    add("--epochs", type=int, default=1, help="epochs per run (default 1)")
    add("--log-step", type=int, default=50, help="Trainer's log_step (default 50)")
    add("--threads", type=int, default=1, help="torch threads (default 1)")
    add("--device", default="cpu", help="cpu (default) or cuda")
    add("--seed", type=int, default=0)
    add("--widths", type=lambda text: [int(width) for width in text.split(",")],
        help="CifarCNN widths instead of the demo's, e.g. 4: a tiny model whose step is short "
        "enough for the Trainer's fixed cost per step to stand out of the noise")
    # fmt: on
    return parser.parse_args()


def make_data(num_samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (N, 3, 32, 32) float, labels (N,) int64): synthetic shapes, evaluation transform."""
    images, labels = generate(num_samples, [seed, 0])
    transform = cifar_transform(augment=False)
    return torch.stack([transform(image) for image in images]), torch.from_numpy(labels)


def shrunk_demo_config(args: argparse.Namespace, save_dir: Path) -> dict:
    """configs/demo.json for one in-memory epoch: no validation, monitor, scheduler or TensorBoard."""
    config = json.loads((ROOT / "configs" / "demo.json").read_text())
    config["n_gpu"] = 0 if args.device == "cpu" else 1
    config["seed"] = args.seed
    if args.widths:
        config["arch"]["args"]["widths"] = args.widths
    config["metrics"] = ["accuracy"]  # the hand loop counts correct predictions, nothing more
    config["lr_scheduler"] = None  # train_epoch alone never steps an epoch scheduler anyway
    config["data_loader"]["args"].update(
        batch_size=args.batch_size, shuffle=False, validation_split=0.0, num_workers=0
    )
    options = {"epochs": args.epochs, "save_dir": str(save_dir), "log_step": args.log_step}
    config["trainer"].update(options, verbosity=0, monitor="off", tensorboard=False)
    return config


def run_trainer(
    parser: ConfigParser,
    data: InMemoryDataLoader,
    initial: nn.Module,
    device: torch.device,
    num_epochs: int,
) -> Run:
    """Time train_epoch of the template's Trainer."""
    model = copy.deepcopy(initial).to(device)
    optimizer = parser.init_obj("optimizer", torch.optim, list(model.parameters()))
    criterion = parser.lookup(loss_module, parser["loss"], "loss")
    metric_fns = {
        name: parser.lookup(metric_module, name, f"metrics[{index}]")
        for index, name in enumerate(parser["metrics"])
    }
    trainer = Trainer(
        model, criterion, metric_fns, optimizer, config=parser, device=device, data=data
    )
    run = Run(model=model)
    for epoch in range(1, num_epochs + 1):
        seed_everything(derive_seed(parser["seed"], epoch, 0))
        with timed(run):
            metrics = trainer.train_epoch(epoch)  # ends with a read of its totals: a device sync
        run.loss = metrics["train/loss"]
    return run


def hand_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
) -> tuple[float, float]:
    """One epoch of a careful hand-written loop: (mean loss, accuracy), read once at the end."""
    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    num_correct = torch.zeros((), dtype=torch.int64, device=device)
    num_samples = 0
    for images, targets in batches:
        images = images.to(device, non_blocking=True)  # (B, C, H, W)
        targets = targets.to(device, non_blocking=True)  # (B,)
        output = model(images)  # (B, num_classes)
        loss = nn.functional.cross_entropy(output, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            loss_sum += loss.detach().double() * targets.shape[0]
            num_correct += (output.argmax(dim=1) == targets).sum()
        num_samples += targets.shape[0]
    return loss_sum.item() / num_samples, num_correct.item() / num_samples


def run_hand_loop(
    optimizer_args: dict,
    loader: DataLoader,
    initial: nn.Module,
    device: torch.device,
    *,
    num_epochs: int,
    seed: int,
) -> Run:
    """Time the hand-written loop."""
    model = copy.deepcopy(initial).to(device)
    optimizer = torch.optim.Adam(model.parameters(), **optimizer_args)
    run = Run(model=model)
    for epoch in range(1, num_epochs + 1):
        seed_everything(derive_seed(seed, epoch, 0))
        with timed(run):
            run.loss, _ = hand_epoch(model, optimizer, loader, device)
    return run


def same_weights(first: nn.Module, second: nn.Module) -> bool:
    """Whether every parameter and buffer (BatchNorm statistics too) is bit-for-bit equal."""
    first_state, second_state = first.state_dict(), second.state_dict()
    return first_state.keys() == second_state.keys() and all(
        torch.equal(first_state[key], second_state[key]) for key in first_state
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    images, labels = make_data(args.num_train, args.seed)
    num_steps = -(-args.num_train // args.batch_size) * args.epochs

    with tempfile.TemporaryDirectory() as temp_dir:
        config = shrunk_demo_config(args, Path(temp_dir))
        if config["optimizer"]["type"] != "Adam":
            raise SystemExit("configs/demo.json no longer uses Adam: update run_hand_loop")
        parser = ConfigParser(config, source="configs/demo.json (shrunk)")
        data = InMemoryDataLoader(
            images,
            labels,
            batch_size=args.batch_size,
            seed=args.seed,
            shuffle=False,
        )
        loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size)
        seed_everything(args.seed)
        initial = CifarCNN(**config["arch"]["args"])

        optimizer_args = config["optimizer"]["args"]
        runs_of = {
            "trainer": lambda: run_trainer(parser, data, initial, device, args.epochs),
            "hand": lambda: run_hand_loop(
                optimizer_args, loader, initial, device, num_epochs=args.epochs, seed=args.seed
            ),
        }

        print(
            f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s); "
            f"{num_steps} steps of batch {args.batch_size} per run "
            f"(CifarCNN {config['arch']['args']['widths']}, Adam)"
        )
        runs_of["trainer"](), runs_of["hand"]()  # warm-up: allocator, thread pools, lazy init
        print(
            f"{'pair':>4}  {'first':<7}  {'Trainer steps/s':>15}  {'hand steps/s':>12}  "
            f"{'wall ratio':>10}  {'CPU-time ratio':>14}"
        )
        wall_ratios, cpu_ratios, differences = [], [], []
        runs: dict[str, Run] = {}
        for pair in range(args.pairs):
            order = ("trainer", "hand") if pair % 2 == 0 else ("hand", "trainer")
            for name in order:
                runs[name] = runs_of[name]()
            trainer, hand = runs["trainer"], runs["hand"]
            wall_ratios.append(trainer.wall_seconds / hand.wall_seconds)
            cpu_ratios.append(trainer.cpu_seconds / hand.cpu_seconds)
            differences.append((trainer.wall_seconds - hand.wall_seconds) / num_steps)
            print(
                f"{pair + 1:>4}  {order[0]:<7}  {num_steps / trainer.wall_seconds:>15.2f}  "
                f"{num_steps / hand.wall_seconds:>12.2f}  {wall_ratios[-1]:>10.4f}  "
                f"{cpu_ratios[-1]:>14.4f}"
            )

    print(
        f"median ratio Trainer / hand loop (wall time): {statistics.median(wall_ratios):.4f} "
        f"(min {min(wall_ratios):.4f}, max {max(wall_ratios):.4f}; goal <= 1.02)"
    )
    print(f"median ratio Trainer / hand loop (CPU time):  {statistics.median(cpu_ratios):.4f}")
    print(
        f"median extra wall time of the Trainer per step: "
        f"{statistics.median(differences) * 1e6:.0f} us"
    )
    trainer, hand = runs["trainer"], runs["hand"]
    print(f"final loss: Trainer {trainer.loss!r}, hand loop {hand.loss!r}")
    print(f"final losses equal: {trainer.loss == hand.loss}")
    assert trainer.model is not None and hand.model is not None
    print(f"final weights bit-for-bit equal: {same_weights(trainer.model, hand.model)}")


if __name__ == "__main__":
    main()
