"""Export a checkpoint's model to a file that runs without this repository, and check it.

python export.py -r saved/models/<name>/<run_id>/model_best.pth --format export --out model.pt2

Formats: torch.export (.pt2, recommended), TorchScript, ONNX (needs onnx and onnxscript). The
batch dim stays dynamic, and so do those the data loader declares (dynamic_dims). The file is
written to a temporary name, loaded back and run on the run's example inputs, also cut and
repeated along each dynamic dim; it takes the name --out only if its logits match the eager
model's to within TOLERANCE (relative, for logits above 1) on all of them.
"""

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

# The file name ending each format is loaded by (torch.export.load refuses other names).
SUFFIXES = {"export": ".pt2", "torchscript": ".pt", "onnx": ".onnx"}
# The largest |logit difference| from the eager model allowed, in fp32: times the largest |logit|
# when that is above 1 (a regression in its target's units: float32 rounds 3e5 to 0.03).
TOLERANCE = 1e-4


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
    from utils.distributed.process_group import one_process
    from utils.evaluation.predictions import writable_file

    try:
        one_process("export.py", "write --out")
        if Path(args.out).suffix != SUFFIXES[args.format]:
            raise UserError(
                f"--out {args.out}: a --format {args.format} file must end in "
                f"{SUFFIXES[args.format]}"
            )
        # Before the work, not at its end: a folder, or one missing or read-only, is refused.
        out = writable_file("--out", args.out)
        if out.exists() and not args.force:
            raise UserError(f"--out {out}: already exists; pass --force to replace it")
        if out.exists() and Path(args.resume).is_file() and out.samefile(args.resume):
            raise UserError(f"--out {out}: is the checkpoint to export (-r); name another file")
        if args.format == "onnx":
            require_onnx()
        export_checkpoint(args, out)
    except (UserError, ParityError) as error:  # 2: a bad input; 1: the file computes otherwise
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, UserError) else 1
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


class Signature(NamedTuple):
    """What the run's data loader declares of the file (build.export_signature): its input and
    output names, and the input dims besides the batch that may vary, {dim: name}."""

    input_name: str
    output_name: str
    dynamic_dims: dict[int, str]

    def dynamic_shapes(self) -> tuple[dict]:
        """torch.export's dynamic_shapes of the one input: the batch, and each declared dim as
        Dim.AUTO, which finds what the model needs of it (a U-Net's multiple of 16)."""
        import torch

        dims = {dim: torch.export.Dim.AUTO for dim in self.dynamic_dims}
        return ({0: torch.export.Dim("batch", min=1), **dims},)


def export_checkpoint(args: argparse.Namespace, out: Path) -> None:
    import torch

    from build import example_inputs, export_signature, load_inference_model, weights_note
    from utils import UserError, describe_error
    from utils.evaluation.tracing import torch_notes_hidden, value_reads
    from utils.evaluation.tta import as_evaluated

    model, config, state = load_inference_model(Path(args.resume), weights=args.weights)
    if state.get("ema"):  # a choice was made: say which
        print(f"{args.resume}: {weights_note(state)}")
    signature = Signature(*export_signature(config))  # the loader's; refused in one line
    # Inputs of the exact shape and value range the model sees, on the CPU: random images
    # through the run's evaluation transform, or what the data loader says (example_inputs).
    inputs = example_inputs(config, model, args.batch_size)
    # The model test.py scores: averaged over the run's test-time augmentation views (tta_*).
    model = as_evaluated(model, config["trainer"])
    # The batch of the export, batch 1 (the batch dimension must be dynamic), and inputs of
    # other sizes along each dynamic dim, which the export never saw: (what, inputs).
    checks = [(f"batch {len(inputs)}", inputs), ("batch 1", inputs[:1])]
    checks += resized(model, inputs, signature.dynamic_dims)
    with torch.no_grad():
        expected = [model(batch) for _, batch in checks]
    if not isinstance(expected[0], torch.Tensor):  # e.g. a detector's list of dicts per image
        kind = type(expected[0]).__name__
        raise UserError(f"{args.resume}: the model returns a {kind}; export needs a tensor")
    reads = value_reads(model, inputs)
    if reads:  # checked before exporting: TorchScript would trace one branch without a word
        raise UserError(
            f"{args.resume}: the model reads a tensor's value in Python at {reads[0]} (a branch "
            "on the data, .item()); an exported file would take the branch of the example "
            "inputs for every input: write it with tensor operations (e.g. torch.where)"
        )
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        staged = staging / out.name
        try:
            with torch_notes_hidden():
                run_file = EXPORTERS[args.format](model, inputs, staged, signature)
        except Exception as error:  # the eager model ran these inputs: what the format lacks
            raise UserError(
                f"{args.format}: torch cannot export this model ({describe_error(error)}); "
                f"{out} not written"
            ) from None
        difference = 0.0
        for (what, batch), logits in zip(checks, expected, strict=True):
            try:
                with torch_notes_hidden():
                    found = run_file(batch)
            except Exception as error:  # e.g. torch.export's guard on a size it fixed
                raise ParityError(
                    f"{args.format}: the exported model fails on {what} {tuple(batch.shape)} "
                    f"({str(error).strip().splitlines()[0]}); {out} not written"
                ) from None
            if found.shape != logits.shape:  # else the difference broadcasts, e.g. (1, B, K)
                raise ParityError(
                    f"{args.format}: the exported model gives shape {tuple(found.shape)} on "
                    f"{what}, the eager model {tuple(logits.shape)}; {out} not written"
                )
            difference = max(difference, (found - logits).abs().max().item())
        scale = max(logits.abs().max().item() for logits in expected)  # the difference's yardstick
        allowed = TOLERANCE * max(1.0, scale)
        print(
            f"{args.format}: max |logit difference| vs the eager model: {difference:.3g} "
            f"(largest |logit| {scale:.3g}; {', '.join(what for what, _ in checks)})"
        )
        if not difference <= allowed:
            raise ParityError(
                f"{args.format}: the exported model's logits differ from the eager model's by "
                f"{difference:.3g} > {allowed:.3g} ({TOLERANCE:g} x max(1, largest |logit| "
                f"{scale:.3g})); {out} not written"
            )
        os.replace(staged, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    dynamic = " and ".join(["batch", *signature.dynamic_dims.values()])
    print(f"Wrote {out} ({args.format}, dynamic {dynamic}, inputs {tuple(inputs.shape[1:])})")


def resized(
    model: "torch.nn.Module", inputs: "torch.Tensor", dynamic_dims: dict[int, str]
) -> list[tuple[str, "torch.Tensor"]]:
    """For each dynamic dim of size n: the inputs cut to n // 2 and repeated to 2 n along it,
    labelled e.g. "length 8". A size the eager model itself refuses (a U-Net's height that is
    not a multiple of 16) is left out; a dim with no size left is an error."""
    import torch

    from utils import UserError

    found = []
    for dim, name in dynamic_dims.items():
        if dim >= inputs.dim():
            raise UserError(f"dynamic dim {dim} ({name!r}): inputs {tuple(inputs.shape)} lack it")
        size = inputs.shape[dim]
        candidates = [inputs.narrow(dim, 0, size // 2)] if size >= 2 else []
        candidates.append(torch.cat([inputs, inputs], dim=dim))
        runnable = []
        for batch in candidates:
            try:
                with torch.no_grad():
                    model(batch)
            except (RuntimeError, ValueError):  # a size it refuses (the U-Net's ValueError)
                continue
            runnable.append((f"{name} {batch.shape[dim]}", batch))
        if not runnable:
            raise UserError(
                f"dynamic dim {dim} ({name!r}): the eager model runs on no other size than "
                f"{size} of the example inputs ({size // 2} and {2 * size} tried)"
            )
        found += runnable
    return found


def export_program(
    model: "torch.nn.Module", inputs: "torch.Tensor", path: Path, signature: Signature
) -> Callable:
    """torch.export: a graph of ATen operators, saved as .pt2; torch.export.load reads it."""
    import torch

    from utils.evaluation.tracing import rnn_loops

    shapes = signature.dynamic_shapes()
    with rnn_loops(bool(signature.dynamic_dims)):
        program = torch.export.export(model, (inputs,), dynamic_shapes=shapes, strict=False)
    torch.export.save(program, str(path))
    return torch.export.load(str(path)).module()


def export_torchscript(
    model: "torch.nn.Module", inputs: "torch.Tensor", path: Path, signature: Signature
) -> Callable:
    """TorchScript by tracing: the operators one batch runs through, with the sizes read from
    the input (the parity check tries other ones); torch.jit.load reads it. No names."""
    import warnings

    import torch

    # Newer torch warns that TorchScript is deprecated at every call; the docs say it once.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.trace(model, inputs), str(path))
        loaded = torch.jit.load(str(path), map_location="cpu")
    return loaded


def export_onnx(
    model: "torch.nn.Module", inputs: "torch.Tensor", path: Path, signature: Signature
) -> Callable:
    """ONNX with torch's torch.export-based exporter; run back with onnxruntime when it is
    installed, else with onnx's reference evaluator (slow, pure numpy)."""
    import importlib.util

    import torch

    # external_data=False: the weights inside the one file (models under 2 GB).
    torch.onnx.export(
        model, (inputs,), str(path), dynamo=True, dynamic_shapes=signature.dynamic_shapes(),
        verbose=False, input_names=[signature.input_name], output_names=[signature.output_name],
        external_data=False,
    )  # fmt: skip
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        run = session.run
    else:
        from onnx.reference import ReferenceEvaluator

        run = ReferenceEvaluator(str(path)).run
    name = signature.input_name
    return lambda inputs: torch.from_numpy(run(None, {name: inputs.numpy()})[0])


EXPORTERS = {"export": export_program, "torchscript": export_torchscript, "onnx": export_onnx}

if __name__ == "__main__":
    sys.exit(main())
