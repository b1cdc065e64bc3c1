"""What tracing a model for export.py does beside the graph: torch's notes for its own
developers, hidden; its while-loop decompositions of nn.GRU and nn.LSTM, which keep a
sequence's length dynamic; and where a model reads tensor values in Python, which no trace keeps."""

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@contextlib.contextmanager
def torch_notes_hidden() -> Iterator[None]:
    """Without the notes for torch's developers that exporting an nn.GRU or nn.LSTM prints (its
    _check_is_size, _flat_weights, a while_loop symbol): the parity check judges the file."""
    import logging
    import warnings

    serializer = logging.getLogger("torch._export.serde.serialize")
    level = serializer.level
    serializer.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "_check_is_size", FutureWarning)
            warnings.filterwarnings("ignore", "The tensor attributes .*_flat_weights", UserWarning)
            yield
    finally:
        serializer.setLevel(level)


@contextlib.contextmanager
def rnn_loops(dynamic: bool) -> Iterator[None]:
    """With dims besides the batch dynamic: torch.export's own while_loop decompositions of
    nn.GRU and nn.LSTM, which keep a sequence's length dynamic (the default one unrolls the
    steps, fixing it); torch.onnx.export uses the same ones. A no-op on a torch without them."""
    with contextlib.ExitStack() as stack:
        try:
            from torch.export import _patches
        except ImportError:  # an older torch: the default decompositions
            dynamic = False
        if dynamic:
            stack.enter_context(_patches.register_gru_while_loop_decomposition())
            stack.enter_context(_patches.register_lstm_while_loop_decomposition())
        yield


def value_reads(model: "torch.nn.Module", inputs: "torch.Tensor") -> list[str]:
    """The places ("file:line") where the model's forward on `inputs` reads a tensor's value into
    Python (`if x.sum() > 0`, .item(), int(x), .tolist(), .numpy()) or the size of a tensor whose
    size is the data's (len(x.nonzero()), x[mask].shape): a traced file keeps what these inputs
    gave for every input (TorchScript, silently), and torch.export refuses most. Other shapes read
    in Python are plain ints in eager mode, not reads."""
    import traceback

    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    torch_dir = str(Path(torch.__file__).parent)
    found: list[str] = []
    # The tensors whose size the data decides (nonzero, x[mask], unique), kept alive by the list
    # so that their ids stay theirs until the forward ends.
    sized_by_data: list[torch.Tensor] = []

    def note_caller(innermost_only: bool) -> None:
        # The innermost frame outside torch and this file: the user's line. innermost_only: only
        # when the user's line itself read it (a size torch's own forward reads is not a read).
        frames = traceback.extract_stack()
        while frames and (
            frames[-1].filename.startswith(torch_dir) or frames[-1].filename == __file__
        ):
            frames.pop()
            if innermost_only and frames and frames[-1].filename.startswith(torch_dir):
                wrapper = Path(frames[-1].filename).name in ("_tensor.py", "overrides.py")
                if not wrapper:  # called from torch's own code, e.g. a module's forward
                    return
        if frames:
            found.append(f"{frames[-1].filename}:{frames[-1].lineno}")

    def sized_by_mask(func: Callable, args: tuple) -> bool:
        if func is not torch.ops.aten.index.Tensor:
            return True
        # x[indices] is sized by the indices' shape; only a boolean mask's values size it.
        return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])

    class ValueReads(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None
        ) -> object:
            result = func(*args, **(kwargs or {}))
            # Every tensor-to-Python-number conversion runs this one operator.
            if func is torch.ops.aten._local_scalar_dense.default:
                note_caller(innermost_only=False)
            elif torch.Tag.dynamic_output_shape in func.tags and sized_by_mask(func, args):
                sized_by_data.extend(torch.utils._pytree.tree_leaves(result))
            return result

    # Reads without that operator: whole tensors (.tolist(), .numpy(), numpy's __array__) and
    # sizes (len, .shape, .size(), .numel()), which torch answers before dispatch.
    copies = {"tolist", "numpy", "__array__"}
    sizes = {"__len__", "__get__", "size", "numel"}

    class HostReads(TorchFunctionMode):
        def __torch_function__(
            self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None
        ) -> object:
            name = getattr(func, "__name__", "")
            if name in copies:
                note_caller(innermost_only=False)
            elif name in sizes and args and any(args[0] is t for t in sized_by_data):
                note_caller(innermost_only=True)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), ValueReads(), HostReads():
        model(inputs)
    return list(dict.fromkeys(found))
