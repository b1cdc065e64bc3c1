"""Export a checkpoint's model to a file that runs without this repository, and check it.

python export.py -r saved/models/<name>/<run_id>/model_best.pth --format export --out model.pt2

Formats: torch.export (.pt2, recommended), TorchScript, ONNX (needs the onnx and onnxscript
packages). The batch dimension stays dynamic. The file is written to a temporary name, loaded
back and run on inputs made by the run's evaluation transform; only when its logits match the
eager model's to within TOLERANCE does it take the name --out.
"""

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The file name ending each format is loaded by (torch.export.load refuses other names).
SUFFIXES = {"export": ".pt2", "torchscript": ".pt", "onnx": ".onnx"}
TOLERANCE = 1e-4  # the largest |logit difference| from the eager model allowed, in fp32


class ParityError(Exception):
    """The exported file does not compute what the eager model computes."""


def batch_size(text: str) -> int:
    value = int(text)
    if value < 2:  # batch 1 would fix the batch dimension at 1 in torch.export
        raise argparse.ArgumentTypeError(f"must be an integer >= 2, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Export a checkpoint's model and check it.")
    add = parser.add_argument
    # fmt: off
    add("-r", "--resume", metavar="CKPT", required=True, help="checkpoint to export")
    add("--format", choices=list(SUFFIXES), default="export",
        help="export: torch.export, .pt2 (the default); torchscript: .pt; onnx: .onnx")
    add("--out", metavar="FILE", required=True, help="the exported file")
    add("--force", action="store_true", help="replace FILE if it exists")
    add("--weights", choices=["auto", "trained", "ema"], default="auto",
        help="trained, ema (the averaged weights) or auto (the default): those the run's "
        "monitor judged")
    add("--ema", dest="weights", action="store_const", const="ema", help="--weights ema")
    add("--batch-size", type=batch_size, default=8, metavar="N",
        help="inputs of the parity check (default: 8; batch 1 is checked too)")
    # fmt: on
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from utils import UserError

    out = Path(args.out)
    try:
        if out.exists() and not args.force:
            raise UserError(f"--out {out}: already exists; pass --force to replace it")
        if out.suffix != SUFFIXES[args.format]:
            raise UserError(
                f"--out {out}: a --format {args.format} file must end in {SUFFIXES[args.format]}"
            )
        if not out.parent.is_dir():
            raise UserError(f"--out {out}: folder {out.parent} not found")
        if args.format == "onnx":
            require_onnx()
        export_checkpoint(args, out)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ParityError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def require_onnx() -> None:
    import importlib.util

    from utils import UserError

    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"--format onnx needs the optional packages onnx and onnxscript ({', '.join(missing)} "
            "not installed): pip install onnx onnxscript onnxruntime (pyproject.toml's onnx extra)"
        )


def export_checkpoint(args: argparse.Namespace, out: Path) -> None:
    import torch

    from build import example_inputs, load_inference_model, weights_note

    model, config, state = load_inference_model(Path(args.resume), weights=args.weights)
    if state.get("ema"):  # a choice was made: say which
        print(f"{args.resume}: {weights_note(state)}")
    # Inputs of the exact shape and value range the model sees, on the CPU: random images
    # through the run's evaluation transform, or what the data loader says (example_inputs).
    inputs = example_inputs(config, model, args.batch_size)
    with torch.no_grad():
        expected = model(inputs)
    if not isinstance(expected, torch.Tensor):  # e.g. a detector's list of dicts per image
        from utils import UserError

        raise UserError(
            f"{args.resume}: the model returns a {type(expected).__name__}, not a tensor; "
            "export.py exports models whose output is one tensor"
        )
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        staged = staging / out.name
        run_file = EXPORTERS[args.format](model, inputs, staged)
        # The batch of the export and batch 1: the batch dimension must be dynamic.
        difference = max(
            (run_file(batch) - expected[: len(batch)]).abs().max().item()
            for batch in (inputs, inputs[:1])
        )
        # The logits' own size says what the difference is small against.
        scale = expected.abs().max().item()
        print(
            f"{args.format}: max |logit difference| vs the eager model: {difference:.3g} "
            f"(largest |logit| {scale:.3g}; batches {len(inputs)} and 1)"
        )
        if not difference <= TOLERANCE:
            raise ParityError(
                f"{args.format}: the exported model's logits differ from the eager model's by "
                f"{difference:.3g} > {TOLERANCE:g}; {out} not written"
            )
        os.replace(staged, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"Wrote {out} ({args.format}, dynamic batch, inputs {tuple(inputs.shape[1:])})")


def export_program(model: "torch.nn.Module", inputs: "torch.Tensor", path: Path) -> Callable:
    """torch.export: a graph of ATen operators, saved as .pt2; torch.export.load reads it."""
    import torch

    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (inputs,), dynamic_shapes=({0: batch},), strict=False)
    torch.export.save(program, str(path))
    return torch.export.load(str(path)).module()


def export_torchscript(model: "torch.nn.Module", inputs: "torch.Tensor", path: Path) -> Callable:
    """TorchScript by tracing: the operators one batch runs through; torch.jit.load reads it."""
    import warnings

    import torch

    # Newer torch warns that TorchScript is deprecated at every call; the docs say it once.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.trace(model, inputs), str(path))
        loaded = torch.jit.load(str(path), map_location="cpu")
    return loaded


def export_onnx(model: "torch.nn.Module", inputs: "torch.Tensor", path: Path) -> Callable:
    """ONNX with torch's torch.export-based exporter; run back with onnxruntime when it is
    installed, else with onnx's reference evaluator (slow, pure numpy)."""
    import importlib.util

    import torch

    batch = torch.export.Dim("batch", min=1)
    # external_data=False: the weights inside the one file (models under 2 GB).
    torch.onnx.export(
        model, (inputs,), str(path), dynamo=True, dynamic_shapes=({0: batch},), verbose=False,
        input_names=["images"], output_names=["logits"], external_data=False,
    )  # fmt: skip
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        run = session.run
    else:
        from onnx.reference import ReferenceEvaluator

        run = ReferenceEvaluator(str(path)).run
    return lambda images: torch.from_numpy(run(None, {"images": images.numpy()})[0])


EXPORTERS = {"export": export_program, "torchscript": export_torchscript, "onnx": export_onnx}

if __name__ == "__main__":
    sys.exit(main())
