"""What tracing a model for export.py does beside the graph: torch's notes for its own
developers, hidden, and its while-loop decompositions of nn.GRU and nn.LSTM, which keep a
sequence's length dynamic."""

import contextlib
from collections.abc import Iterator


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
