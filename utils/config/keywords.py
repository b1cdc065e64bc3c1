"""The keywords a class or function from config takes, and the one-line refusal of any other:
what ConfigParser.init_obj checks of config[name].args before it builds anything."""

import difflib
import inspect
from collections.abc import Callable

from utils.util import ConfigError


def check_keywords(
    source: str, name: str, kind: str, target: Callable, config_args: dict, program_args: dict
) -> None:
    """Refuse, in one line, a key of config[name].args that `target` does not take (with
    the known ones and the closest), and a class of the project that does not take what
    the program passes it (it must accept **kwargs and hand them to super().__init__)."""
    accepted = accepted_keywords(target)
    if accepted is None:  # takes any keyword (a function with **kwargs)
        return
    refused = [key for key in program_args if key not in accepted]
    if refused:
        raise ConfigError(
            f"{source}: {name}.type: {kind}.__init__ does not take "
            f"{', '.join(refused)}, which the program passes: give it **kwargs and pass "
            "them on, super().__init__(**kwargs)"
        )
    for key in config_args:
        if key not in accepted:
            known = sorted(accepted - set(program_args))
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{source}: {name}.args: unknown key {key!r} for {kind} "
                f"(known: {', '.join(known)}){hint}"
            )


def accepted_keywords(target: Callable) -> set[str] | None:
    """The keyword arguments `target` takes; None when it takes any. A class's are those of its
    __init__ and, while an __init__ takes **kwargs, of the next __init__ up its bases (where
    those kwargs go by the template's convention, super().__init__(**kwargs)); torch's
    nn.Module and object take none."""
    accepted: set[str] = set()
    inits = (
        [vars(cls)["__init__"] for cls in target.__mro__ if "__init__" in vars(cls)]
        if inspect.isclass(target)
        else [target]
    )
    for init in inits:
        if init in (object.__init__, torch_module_init()):
            return accepted
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):  # no inspectable signature: let the call tell
            return None
        accepted |= {
            item.name
            for item in parameters
            if item.kind in (item.POSITIONAL_OR_KEYWORD, item.KEYWORD_ONLY) and item.name != "self"
        }
        if not any(item.kind is item.VAR_KEYWORD for item in parameters):
            return accepted
    return None if not inspect.isclass(target) else accepted


def torch_module_init() -> Callable:
    """nn.Module.__init__: (*args, **kwargs) in its signature, yet it refuses any keyword."""
    from torch import nn

    return nn.Module.__init__
