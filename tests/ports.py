"""A TCP port on 127.0.0.1 for a test's torchrun rendezvous."""

import random
import socket

# Below Linux's ephemeral range (32768-60999), from which the kernel hands out bind(("", 0))
# ports. A port found free with bind(0) is released before torchrun binds it, and under
# pytest-xdist another test's process (a --standalone store, a worker) can be handed the same
# port in between: both "nodes" would then wait on that stranger's store. A port from outside
# the range is never handed out that way.
LOW, HIGH = 20000, 32000


def free_port() -> int:
    """A port of [LOW, HIGH) that nothing listens on now, drawn at random."""
    draw = random.SystemRandom()  # independent of the tests' seeded RNGs
    for _ in range(100):
        port = draw.randrange(LOW, HIGH)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LOW}-{HIGH} on 127.0.0.1")
