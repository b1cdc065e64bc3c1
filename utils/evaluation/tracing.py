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
    Python (`if x.sum() > 0`, .item(), int(x)): a traced file keeps the branch these inputs
    took for every input (TorchScript, silently), and torch.export refuses them. Shapes read
    in Python are plain ints in eager mode, not reads."""
    import traceback

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    torch_dir = str(Path(torch.__file__).parent)
    found: list[str] = []

    class ValueReads(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None
        ) -> object:
            # Every tensor-to-Python-number conversion runs this one operator.
            if func is torch.ops.aten._local_scalar_dense.default:
                # The innermost frame outside torch (and this one): the user's line.
                frames = traceback.extract_stack()[:-1]
                ours = [frame for frame in frames if not frame.filename.startswith(torch_dir)]
                if ours:
                    found.append(f"{ours[-1].filename}:{ours[-1].lineno}")
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), ValueReads():
        model(inputs)
    return list(dict.fromkeys(found))
