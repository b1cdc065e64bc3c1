"""The fast CIFAR-10 recipe as one hand-written loop: the accuracy baseline for the engine.

benchmarks/cifar_recipe.py measures config.json through train.py. This script
trains the same network (model.fast_cifar.FastCifarCNN) with the same published recipe written
out by hand, with nothing of the template but the model class: its own JPEG decoding, hold-out
split, alternating flips, 2-pixel reflect translations, optimizer groups, warmup-then-linear
schedule, Lookahead and test-time augmentation. If train.py's figure falls clearly below this
one on the same data and epochs, the engine loses accuracy somewhere; if they agree, the gap to
the published records is the data or the recipe, not the engine. It is the recipe before Muon
and the wider blocks (FastCifarCNN's default widths 64, 256, 256, airbench94's): compare it with
train.py given those (docs/recipes.md, "Measured on the real images").

python benchmarks/baselines/cifar_reference.py [--epochs 10] [--seed 0] [--data ../cifar10]
    [--no-lookahead]
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torchvision
from torch import nn
from torch.nn import functional
from torchvision.io import ImageReadMode

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.cifar_recipe import ARCHIVE, unpack  # noqa: E402
from model.fast_cifar import FastCifarCNN  # noqa: E402

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "cifar10", help="unpacked here")
    parser.add_argument("--archive", type=Path, default=ARCHIVE)
    parser.add_argument("--no-lookahead", dest="lookahead", action="store_false")
    return parser.parse_args(argv)


def load_images(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 3, 32, 32) uint8 images and (N,) labels of folder/<class>/*.jpg or *.png (e.g. the
    copy benchmarks/reencode_jpeg.py writes), classes sorted."""
    images, labels = [], []
    for label, class_folder in enumerate(sorted(p for p in folder.iterdir() if p.is_dir())):
        for path in sorted(p for p in class_folder.iterdir() if p.suffix in {".jpg", ".png"}):
            images.append(torchvision.io.decode_image(str(path), mode=ImageReadMode.RGB))
            labels.append(label)
    return torch.stack(images), torch.tensor(labels)


def normalise(images: torch.Tensor) -> torch.Tensor:
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std


def translate(images: torch.Tensor, shift: int, generator: torch.Generator) -> torch.Tensor:
    """Each image moved by its own random (dy, dx) in [-shift, shift]^2, edges mirrored."""
    padded = functional.pad(images, (shift,) * 4, mode="reflect")
    size = images.shape[-1]
    offsets = torch.randint(0, 2 * shift + 1, (len(images), 2), generator=generator)
    out = torch.empty_like(images)
    for dy in range(2 * shift + 1):
        for dx in range(2 * shift + 1):
            chosen = (offsets[:, 0] == dy) & (offsets[:, 1] == dx)
            out[chosen] = padded[chosen, :, dy : dy + size, dx : dx + size]
    return out


def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy without test-time augmentation ("plain"), and with the mirror image and 1-pixel
    shifts (reflect) averaged as logits: six views weighing the same ("equal"), or the unshifted
    pair weighing as much as the four shifted views together ("airbench")."""
    model.eval()
    correct = {"plain": 0, "equal": 0, "airbench": 0}
    with torch.no_grad():
        for batch, target in zip(images.split(1000), labels.split(1000), strict=True):
            padded = functional.pad(batch, (1,) * 4, mode="reflect")
            views = [batch, padded[..., :32, :32], padded[..., 2:, 2:]]
            logits = [model(view) + model(view.flip(-1)) for view in views]  # (B, 10) each
            plain = model(batch)
            for name, total in [
                ("plain", plain),
                ("equal", sum(logits)),
                ("airbench", 2 * logits[0] + logits[1] + logits[2]),
            ]:
                correct[name] += int((total.argmax(1) == target).sum())
    model.train()
    return {name: count / len(labels) for name, count in correct.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    unpack(args.archive, args.data)
    start = time.perf_counter()
    images, labels = load_images(args.data / "train")
    order = torch.randperm(len(images), generator=generator)
    val, train = order[:5000], order[5000:]
    train_images, train_labels = normalise(images[train]), labels[train]
    val_images, val_labels = normalise(images[val]), labels[val]
    print(f"decoded {len(images)} images in {time.perf_counter() - start:.0f} s", flush=True)

    model = FastCifarCNN()
    # The whitening filters from 5,000 training images (the model's own fitting code, fed a
    # stand-in for the data loader that hands it the first 5,000 training images).
    model.fit_data(_Samples(train_images[:5000]))
    model.to(memory_format=torch.channels_last)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.weight.requires_grad_(False)  # frozen scale
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    norm_biases = [p for name, p in named if _is_norm_bias(model, name)]
    others = [p for name, p in named if not _is_norm_bias(model, name)]
    batch_size, lr, decay = 1024, 1.5, 1.9957e-3  # decay: shrink per step at the peak rate
    optimizer = torch.optim.SGD(
        [
            {"params": norm_biases, "lr": 64 * lr, "weight_decay": decay / (64 * lr)},
            {"params": others, "lr": lr, "weight_decay": decay / lr},
        ],
        momentum=0.85,
        nesterov=True,
    )
    steps_per_epoch = len(train) // batch_size
    total = steps_per_epoch * args.epochs
    peak = int(0.23 * total)

    def factor(step: int) -> float:  # 0.2 -> 1 at 23 % of the steps -> 0.07 at the end
        if step < peak:
            return 0.2 + 0.8 * step / peak
        return 1.0 - 0.93 * (step - peak) / (total - peak)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    flips = torch.rand(len(train), generator=generator) < 0.5  # flipped in even epochs
    slow = {k: v.detach().clone() for k, v in model.state_dict().items()}
    step = 0
    for epoch in range(args.epochs):
        tic = time.perf_counter()
        flipped = flips if epoch % 2 == 0 else ~flips
        epoch_images = torch.where(flipped.view(-1, 1, 1, 1), train_images.flip(-1), train_images)
        epoch_images = translate(epoch_images, 2, generator)
        permutation = torch.randperm(len(train), generator=generator)
        for index in range(steps_per_epoch):
            chosen = permutation[index * batch_size : (index + 1) * batch_size]
            inputs = epoch_images[chosen].contiguous(memory_format=torch.channels_last)
            loss = functional.cross_entropy(
                model(inputs), train_labels[chosen], label_smoothing=0.2
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            # Lookahead every 5 steps and after the last one, as train.py's (the run ends on
            # the slow weights); an epoch's end is none of its business.
            if args.lookahead and (step % 5 == 0 or step == total):
                share = 0.95**5 * (step / total) ** 3
                for key, value in model.state_dict().items():
                    if value.is_floating_point():
                        slow[key].lerp_(value, 1 - share)
                        value.copy_(slow[key])
        seconds = time.perf_counter() - tic
        accuracy = evaluate(model, val_images, val_labels)
        shown = ", ".join(f"{name} {100 * value:.2f} %" for name, value in accuracy.items())
        print(f"epoch {epoch + 1}: val accuracy {shown}; {seconds:.0f} s", flush=True)
    return 0


class _Samples:
    """What FastCifarCNN.fit_data reads: training_samples(limit, transformed=True) pairs."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def training_samples(self, limit: int, *, transformed: bool) -> list:
        return [(image, 0) for image in self.images[:limit]]


def _is_norm_bias(model: nn.Module, name: str) -> bool:
    module_name, _, leaf = name.rpartition(".")
    return leaf == "bias" and isinstance(model.get_submodule(module_name), nn.BatchNorm2d)


if __name__ == "__main__":
    sys.exit(main())
