"""Configure Python logging from logger_config.json, once per process, from main()."""

import json
import logging
import logging.config
from pathlib import Path

CONFIG_PATH = Path(__file__).with_name("logger_config.json")
LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}


def setup_logging(
    log_dir: Path | None, *, verbosity: int = 1, rank: int = 0, config_path: Path = CONFIG_PATH
) -> None:
    """Console logging, plus log_dir/info.log when log_dir is given and this is rank 0.

    Other ranks log only warnings and errors (everything at verbosity 2), tagged with their
    rank, and write no file.
    """
    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    handlers = config["handlers"]
    for name, handler in list(handlers.items()):
        if "filename" in handler:
            if log_dir is None or rank != 0:
                del handlers[name]
                config["root"]["handlers"].remove(name)
            else:
                handler["filename"] = str(Path(log_dir) / handler["filename"])
    # Other ranks repeat rank 0's lines, so they stay quiet unless debugging (verbosity 2).
    config["root"]["level"] = LEVELS[verbosity] if rank == 0 or verbosity == 2 else logging.WARNING
    if rank != 0:
        for formatter in config["formatters"].values():
            formatter["format"] = f"[rank {rank}] {formatter['format']}"
    logging.config.dictConfig(config)
