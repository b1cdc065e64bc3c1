"""The fast CIFAR-10 recipe's training time against airbench94's (the public record's own code,
PyPI package `airbench`) on the same images: gpu_check.sh's step "airbench", after its step
"cifar_recipe". Ends with one `figure: ...` line, exit 0 when the ratio is at most --max-ratio.

The ratio is of seconds per training FLOP, so that it measures overhead, not the work chosen:
the recipe's widths (128, 384, 384) do 2.55 times the FLOPs a sample of airbench94's (64, 256,
256). Both counted as base/checks.py counts the template's: three times the forward's FLOPs
(torch.utils.flop_counter), the recipe's from its metrics.csv, airbench94's on its own network.
The plain ratio of seconds is printed beside it.

The same images: the 45,000 the recipe trained on and the 5,000 it held out (its seed's
validation split of the carried archive), handed to airbench as the train.pt and test.pt it
reads from ./cifar10, so it downloads nothing. Its training loop is about 150 lines: the bar for
the template's overhead. Needs CUDA (airbench trains in fp16 on cuda:0) and airbench importable,
e.g. PYTHONPATH=data/gpu_check/airbench-0.1.8-py3-none-any.whl (a pure-Python wheel imports
from its zip file; nothing is installed).

python benchmarks/gpu/airbench_ratio.py --data DIR --recipe DIR --work DIR [--max-ratio 3]
"""

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as `python benchmarks/gpu/airbench_ratio.py`

from data_loader.data_loaders import ImageFolderDataLoader  # noqa: E402


def recipe_run(recipe_out: Path) -> tuple[dict, list[dict[str, str]]]:
    """(the config, the metrics.csv rows) of the run benchmarks/cifar_recipe.py --out made: one
    config, one seed, as gpu_check.sh runs it (<out>/<config file name>/seed<S>/)."""
    (config_path,) = recipe_out.glob("*/seed*/config.json")
    config = json.loads(config_path.read_text())
    (metrics,) = config_path.parent.glob("log/*/*/metrics.csv")
    with metrics.open() as file:
        return config, list(csv.DictReader(file))


def recipe_training(rows: list[dict[str, str]], num_train: int) -> tuple[float, float]:
    """(seconds, FLOPs) of the recipe's training epochs from its metrics.csv rows: each epoch's
    samples over its rate (validation left out), and its samples times the FLOPs a sample (the
    logged FLOP/s over the logged samples/s)."""
    seconds = flops = 0.0
    for row in rows:
        rate = float(row["time/train_samples_per_second"])
        seconds += num_train / rate
        flops += num_train * float(row["time/flops_per_second"]) / rate
    return seconds, flops


def airbench_flops_per_sample(airbench: object) -> float:
    """airbench94's training FLOPs a sample, counted the template's way: three times the forward
    of its own network (fp16, channels_last, on cuda as make_net94 builds it) on a batch, in
    the dtype and on the device of its parameters."""
    net = airbench.make_net94().eval()  # as base/checks.py counts: evaluation mode
    weight = next(net.parameters())  # its dtype and device: fp16 on cuda from make_net94
    images = torch.zeros(16, 3, 32, 32, dtype=weight.dtype, device=weight.device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        net(images.to(memory_format=torch.channels_last))
    return 3 * counter.get_total_flops() / len(images)


def write_airbench_data(config: dict, data_dir: Path, folder: Path) -> int:
    """folder/train.pt and test.pt as airbench.CifarLoader reads them (uint8 NHWC images, labels,
    class names): the recipe's training and validation samples. Returns the training count."""
    args = config["data_loader"]["args"]
    data = ImageFolderDataLoader(
        str(data_dir), preset="cifar", pipeline="device", device="cpu", seed=config["seed"],
        validation_split=args["validation_split"], batch_size=args["batch_size"],
    )  # fmt: skip
    images, labels = data.uint8_split("train", 32)  # the decoded cache the recipe's run wrote
    train_indices, val_indices = (torch.as_tensor(part) for part in data.split_indices())
    folder.mkdir(parents=True, exist_ok=True)
    for name, indices in (("train.pt", train_indices), ("test.pt", val_indices)):
        part = {
            "images": images[indices].permute(0, 2, 3, 1).contiguous(),
            "labels": labels[indices],
        }
        torch.save({**part, "classes": data.class_names()}, folder / name)
    return len(train_indices)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the unpacked CIFAR-10 JPEGs")
    parser.add_argument("--recipe", type=Path, required=True, help="cifar_recipe.py's --out")
    parser.add_argument("--work", type=Path, required=True, help="airbench's data go here")
    parser.add_argument("--max-ratio", type=float, default=3.0, help="default 3")
    args = parser.parse_args(argv)
    try:
        import airbench
    except ImportError as error:
        print(f"figure: airbench not importable ({error})")
        return 1
    args.work = args.work.resolve()
    config, rows = recipe_run(args.recipe.resolve())
    num_train = write_airbench_data(config, args.data.resolve(), args.work / "cifar10")
    recipe_seconds, recipe_flops = recipe_training(rows, num_train)
    os.chdir(args.work)  # airbench reads ./cifar10/{train,test}.pt
    loader = airbench.CifarLoader(
        "cifar10", train=True, batch_size=1024, aug={"flip": True, "translate": 2}, altflip=True
    )
    airbench.warmup94(train_loader=loader)  # one step: cuDNN's kernel choice, as it does
    torch.cuda.synchronize()
    start = time.perf_counter()
    model = airbench.train94(train_loader=loader, verbose=False)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    test_loader = airbench.CifarLoader("cifar10", train=False, batch_size=2000)
    accuracy = airbench.evaluate(model, test_loader, tta_level=2)
    epochs = airbench.lib_airbench94.hyp["opt"]["train_epochs"]  # 9.9
    airbench_flops = airbench_flops_per_sample(airbench) * num_train * epochs
    ratio = (recipe_seconds / recipe_flops) / (seconds / airbench_flops)
    print(
        f"figure: seconds per training FLOP, recipe / airbench94 = {ratio:.2f} (seconds "
        f"{recipe_seconds:.1f} / {seconds:.1f}, FLOPs {recipe_flops:.3g} / {airbench_flops:.3g}); "
        f"val/accuracy {float(rows[-1]['val/accuracy']):.4f} vs {accuracy:.4f} "
        f"on the same {num_train} + {len(test_loader.labels)} images",
        flush=True,
    )
    return 0 if ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
