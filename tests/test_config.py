"""parse_config.py in-process: reading, overrides, validation messages, builders and purity."""

import argparse
import functools
import json
import re
import types
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import train
from parse_config import ConfigError, ConfigParser
from utils import ConfigValueError, UserError
from utils.state.run_folder import default_run_id, find_resume_point

DELETE = object()  # marks a key to remove in a validation case

# The attributes train.parse_args produces, all unset (checked against it below).
NAMESPACE_DEFAULTS = {
    "config": None,
    "resume": None,
    "device": None,
    "lr": None,
    "bs": None,
    "epochs": None,
    "folds": None,
    "fold": None,
    "run_id": None,
    "set": None,
    "continue_run": False,
    "requeue_file": None,
    "allow_data_change": False,
}


def namespace(**values) -> argparse.Namespace:
    """What train.parse_args returns, with `values` set."""
    return argparse.Namespace(**{**NAMESPACE_DEFAULTS, **values})


def edit(config: dict, dotted: str, value) -> dict:
    """Set (or with DELETE, remove) config[k1][k2]... for dotted = "k1.k2..."; returns config."""
    *parents, last = dotted.split(".")
    node = config
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return config


@pytest.fixture
def demo_config(make_config):
    """The shrunk demo config as a dict (outputs under tmp_path/saved)."""
    return json.loads(make_config().read_text())


@pytest.fixture
def write_config(tmp_path):
    """write_config(dict or text) -> path of tmp_path/cfg.json holding it."""

    def write(content) -> str:
        path = tmp_path / "cfg.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content, indent=4))
        return str(path)

    return write


def parse_error(**values) -> str:
    """The ConfigError message from_args raises for these arguments."""
    with pytest.raises(ConfigError) as error:
        ConfigParser.from_args(namespace(**values))
    message = str(error.value)
    assert "\n" not in message
    return message


def test_namespace_matches_train_parse_args():
    assert vars(train.parse_args([])) == NAMESPACE_DEFAULTS


# --- reading and defaults ---------------------------------------------------------------------


def test_getitem_reads_the_config(make_config):
    path = make_config()
    parser = ConfigParser.from_args(namespace(config=str(path)))
    assert parser["optimizer"]["args"]["lr"] == 0.003
    assert parser["arch"]["type"] == "CifarCNN"
    assert parser.source == str(path)


def test_defaults_fill_every_optional_key(demo_config):
    for key in ("n_gpu", "seed", "metrics"):
        del demo_config[key]
    for key in ("save_dir", "save_period", "verbosity", "monitor", "early_stop", "tensorboard"):
        del demo_config["trainer"][key]
    del demo_config["trainer"]["len_epoch"], demo_config["trainer"]["log_step"]
    del demo_config["lr_scheduler"]["interval"]
    del demo_config["arch"]["args"]

    parser = ConfigParser(demo_config, source="cfg.json")

    assert parser["n_gpu"] == 1
    assert parser["seed"] == 0
    assert parser["metrics"] == []
    defaults = {
        "epochs": 2,
        "save_dir": "saved/",
        "save_period": 1,
        "verbosity": 1,
        "monitor": "off",
        "early_stop": 0,
        "tensorboard": True,
        "len_epoch": None,
        "log_step": 10,
    }
    assert {key: parser["trainer"][key] for key in defaults} == defaults
    assert parser["lr_scheduler"]["interval"] == "epoch"
    assert parser["arch"]["args"] == {}
    assert (parser.monitor_mode, parser.monitor_key) == ("off", "")
    # The caller's dict is left as it was.
    assert "interval" not in demo_config["lr_scheduler"]


def test_trainer_class_defaults_to_trainer_without_args(demo_config):
    parser = ConfigParser(demo_config, source="cfg.json")
    assert (parser["trainer"]["type"], parser["trainer"]["args"]) == ("Trainer", {})


def test_trainer_class_and_args_can_be_set(make_config):
    path = make_config(**{"trainer.type": "MyTrainer", "trainer.args": {"width": 2}})
    parser = ConfigParser.from_args(namespace(config=str(path), set=["trainer.args.depth=3"]))
    assert parser["trainer"]["type"] == "MyTrainer"
    assert parser["trainer"]["args"] == {"width": 2, "depth": 3}


def test_lr_scheduler_defaults_to_none(demo_config):
    del demo_config["lr_scheduler"]
    assert ConfigParser(demo_config, source="cfg.json")["lr_scheduler"] is None


@pytest.mark.parametrize(
    "name",
    ["config.json", "configs/cifar10_cnn.json", "configs/demo.json", "configs/imagenet.json",
     "configs/imagenet_v1.json", "configs/finetune.json", "configs/imagenet_vit.json"],
)  # fmt: skip
def test_shipped_configs_parse(name):
    parser = ConfigParser.from_args(namespace(config=str(ROOT / name)))
    assert parser.monitor_mode == "max"
    assert parser.monitor_key in ("val/accuracy", "val/ema_accuracy")
    assert parser.checkpoint_dir.parent == Path("saved", "models", parser["name"])


# --- init_obj / init_ftn ----------------------------------------------------------------------


class Box:
    def __init__(self, label, *, size=1, colour="red"):
        self.label, self.size, self.colour = label, size, colour


class Picky:
    def __init__(self, *, value=0):
        raise ConfigValueError(f"value {value} is not allowed")


class Buggy:
    """A constructor with a bug in it: a TypeError raised inside, not by the call."""

    def __init__(self, *, size=1):
        self.layer = torch.nn.Linear(size)


def scale(number, *, factor=2):
    return number * factor


def hidden():
    return "not exported"


@pytest.fixture
def toys():
    """A module whose __all__ lists what a config may name (hidden is public but not listed)."""
    module = types.ModuleType("toys")
    module.Box, module.Picky, module.scale, module.hidden = Box, Picky, scale, hidden
    module.Buggy = Buggy
    module.__all__ = ["Box", "Buggy", "Picky", "scale"]
    return module


def parser_with(demo_config, section: dict) -> ConfigParser:
    """A parser whose arch section is `section`."""
    demo_config["arch"] = section
    return ConfigParser(demo_config, source="cfg.json")


def test_init_obj_passes_args_config_args_and_kwargs(demo_config, toys):
    parser = parser_with(demo_config, {"type": "Box", "args": {"size": 3}})
    box = parser.init_obj("arch", toys, "first", colour="blue")
    assert isinstance(box, Box)
    assert (box.label, box.size, box.colour) == ("first", 3, "blue")


def test_init_ftn_binds_the_args(demo_config, toys):
    parser = parser_with(demo_config, {"type": "scale", "args": {"factor": 3}})
    function = parser.init_ftn("arch", toys)
    assert isinstance(function, functools.partial)
    assert function.func is scale
    assert function.keywords == {"factor": 3}
    assert function(5) == 15
    bound = parser.init_ftn("arch", toys, 4)
    assert bound() == 12


@pytest.mark.parametrize("method", ["init_obj", "init_ftn"])
def test_kwarg_colliding_with_config_is_an_error(demo_config, toys, method):
    parser = parser_with(demo_config, {"type": "Box", "args": {"size": 3, "colour": "red"}})
    with pytest.raises(ConfigError, match=r"cfg\.json: arch\.args: size is set by the program"):
        getattr(parser, method)("arch", toys, "first", size=4)


@pytest.mark.parametrize("name", ["Nope", "hidden", "ModuleType"])
def test_unknown_type_lists_the_available_names(demo_config, toys, name):
    parser = parser_with(demo_config, {"type": name, "args": {}})
    with pytest.raises(ConfigError) as error:
        parser.init_obj("arch", toys, "first")
    assert str(error.value) == (
        f"cfg.json: arch.type: unknown name {name!r} in toys (available: Box, Buggy, Picky, scale)"
    )


def test_lookup_without_all_offers_public_callables(demo_config):
    module = types.ModuleType("plain")
    module.scale, module._private, module.CONSTANT, module.types = scale, hidden, 3, types
    parser = ConfigParser(demo_config, source="cfg.json")
    assert parser.lookup(module, "scale", "loss") is scale
    with pytest.raises(
        ConfigError, match=r"cfg\.json: loss: unknown name 'x' in plain \(available: scale\)"
    ):
        parser.lookup(module, "x", "loss")


def test_unexpected_arg_is_an_error_naming_the_args(demo_config, toys):
    parser = parser_with(demo_config, {"type": "Box", "args": {"sizes": 3}})
    with pytest.raises(ConfigError) as error:
        parser.init_obj("arch", toys, "first")
    assert str(error.value) == (
        "cfg.json: arch.args: unknown key 'sizes' for Box (known: colour, label, size); "
        "did you mean 'size'?"
    )


def test_missing_positional_arg_is_an_error_naming_the_args(demo_config, toys):
    parser = parser_with(demo_config, {"type": "Box", "args": {}})
    with pytest.raises(ConfigError, match=r"cfg\.json: arch\.args: .*'label'"):
        parser.init_obj("arch", toys)


def test_value_error_from_constructor_becomes_config_error(demo_config, toys):
    parser = parser_with(demo_config, {"type": "Picky", "args": {"value": 7}})
    with pytest.raises(ConfigError, match=r"^cfg\.json: arch\.args: value 7 is not allowed$"):
        parser.init_obj("arch", toys)


def test_a_bug_inside_a_project_constructor_keeps_its_traceback(demo_config, toys):
    parser = parser_with(demo_config, {"type": "Buggy", "args": {"size": 3}})
    with pytest.raises(TypeError, match="out_features"):
        parser.init_obj("arch", toys)


def test_torch_optimizer_value_error_becomes_config_error(demo_config):
    demo_config["optimizer"] = {"type": "SGD", "args": {"lr": 0.1, "momentum": -1}}
    parser = ConfigParser(demo_config, source="cfg.json")
    with pytest.raises(ConfigError) as error:
        parser.init_obj("optimizer", torch.optim, [torch.nn.Parameter(torch.zeros(2))])
    assert str(error.value).startswith("cfg.json: optimizer.args: ")
    assert "momentum" in str(error.value)


def test_type_error_from_constructor_becomes_config_error(demo_config):
    import model.model as arch_module

    demo_config["arch"]["args"]["widths"] = 5
    parser = ConfigParser(demo_config, source="cfg.json")
    with pytest.raises(ConfigError, match=r"cfg\.json: arch"):
        parser.init_obj("arch", arch_module)


# --- overrides --------------------------------------------------------------------------------


def test_shortcut_flags(make_config):
    parser = ConfigParser.from_args(namespace(config=str(make_config()), lr=0.5, bs=7, epochs=9))
    assert parser["optimizer"]["args"]["lr"] == 0.5
    assert parser["data_loader"]["args"]["batch_size"] == 7
    assert parser["trainer"]["epochs"] == 9


@pytest.mark.parametrize(
    ("text", "dotted", "expected"),
    [
        ("trainer.epochs=5", "trainer.epochs", 5),
        ("optimizer.args.lr=0.25", "optimizer.args.lr", 0.25),
        ("trainer.tensorboard=false", "trainer.tensorboard", False),
        ("trainer.len_epoch=null", "trainer.len_epoch", None),
        ("arch.args.widths=[4, 8, 16]", "arch.args.widths", [4, 8, 16]),
        ('lr_scheduler.args={"T_max": 7}', "lr_scheduler.args", {"T_max": 7}),
        ("name=my_run", "name", "my_run"),
        ("trainer.monitor=min val_loss", "trainer.monitor", "min val_loss"),
        ('name="quoted"', "name", "quoted"),
        ('name="False"', "name", "False"),  # a string, quoted
        ("metrics.1=top_5_acc", "metrics", ["accuracy", "top_5_acc"]),
        ("arch.args.widths.0=4", "arch.args.widths", [4, 16]),
        # A new key inside an args dict is a new keyword argument.
        ("optimizer.args.amsgrad=true", "optimizer.args.amsgrad", True),
        ("data_loader.args.data_dir=/data/x", "data_loader.args.data_dir", "/data/x"),
    ],
)
def test_set_override(make_config, text, dotted, expected):
    parser = ConfigParser.from_args(namespace(config=str(make_config()), set=[text]))
    node = parser.config
    for key in dotted.split("."):
        node = node[key]
    assert node == expected
    assert type(node) is type(expected)


def test_set_is_applied_in_order_after_shortcuts(make_config):
    parser = ConfigParser.from_args(
        namespace(
            config=str(make_config()),
            lr=0.5,
            set=["optimizer.args.lr=0.125", "trainer.epochs=4", "trainer.epochs=6"],
        )
    )
    assert parser["optimizer"]["args"]["lr"] == 0.125
    assert parser["trainer"]["epochs"] == 6


def test_set_can_fill_a_defaulted_key(make_config):
    path = make_config()
    config = json.loads(path.read_text())
    del config["trainer"]["early_stop"]
    path.write_text(json.dumps(config))
    parser = ConfigParser.from_args(namespace(config=str(path), set=["trainer.early_stop=3"]))
    assert parser["trainer"]["early_stop"] == 3


def optional_keys(schema: type | None = None, prefix: str = "") -> list[str]:
    """Every key config_schema.py declares as optional with nothing filled in (OPTIONAL)."""
    import dataclasses

    from config_schema import OPTIONAL, Config
    from utils.config.load_config import _nested_schema

    found = []
    for item in dataclasses.fields(schema or Config):
        if item.metadata.get("default") is OPTIONAL:
            found.append(prefix + item.name)
        nested = _nested_schema(item)
        if nested is not None:
            found += optional_keys(nested, f"{prefix}{item.name}.")
    return found


@pytest.mark.parametrize("dotted", optional_keys())
def test_set_reaches_every_documented_key_the_file_leaves_out(demo_config, dotted):
    """A key the docs list is settable with --set whether or not the file has it (arch.freeze
    and optimizer.param_groups were refused as unknown when the file left them out)."""
    from utils.config.load_config import apply_override, with_defaults

    *parents, last = dotted.split(".")
    config = with_defaults(demo_config)
    section = functools.reduce(dict.__getitem__, parents, config)
    section.pop(last, None)
    apply_override(config, dotted.split("."), "value", "--set")  # no "unknown key"
    assert section[last] == "value"


def test_set_freeze_and_param_groups_take_effect_when_the_file_leaves_them_out(make_config):
    from build import freeze
    from model.model import CifarCNN
    from utils.optim.optimizer import build_optimizer

    groups = [{"params": ["head"], "lr": 0.5}]
    parser = ConfigParser.from_args(
        namespace(
            config=str(make_config()),
            set=['arch.freeze=["features.0"]', f"optimizer.param_groups={json.dumps(groups)}"],
        )
    )
    model = CifarCNN(**parser["arch"]["args"])
    freeze(parser, model)
    optimizer = build_optimizer(parser, model, torch.device("cpu"))
    frozen = {name for name, param in model.named_parameters() if not param.requires_grad}
    assert frozen == {"features.0.0.weight", "features.0.1.weight", "features.0.1.bias"}
    rates = {
        id(param): group["lr"] for group in optimizer.param_groups for param in group["params"]
    }
    assert rates[id(model.head.weight)] == 0.5
    assert rates[id(model.features[1][0].weight)] == parser["optimizer"]["args"]["lr"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "arch.freeze.0=head",
            "--set arch.freeze.0=head: arch.freeze: not in the config; set it whole",
        ),
        ("trainer.epoch=3", "--set trainer.epoch=3: trainer.epoch: unknown key (known here: "),
        ("foo=1", "--set foo=1: foo: unknown key (known here: arch, batch_mixing, data_loader, "),
        (
            "arch.kind=x",
            "--set arch.kind=x: arch.kind: unknown key (known here: args, freeze, freeze_norm_scale, "
            "type)",
        ),
        # Only the last key may be new, and only inside args.
        ("arch.args.depth.x=1", "--set arch.args.depth.x=1: arch.args.depth: unknown key"),
        ("optimizer.lr=0.1", "--set optimizer.lr=0.1: optimizer.lr: unknown key"),
        ("trainer.epochs", "--set 'trainer.epochs': expected KEY.PATH=VALUE"),
        ("trainer..epochs=3", "--set 'trainer..epochs=3': expected KEY.PATH=VALUE"),
        ("=3", "--set '=3': expected KEY.PATH=VALUE"),
        ("loss.type=nll_loss", "--set loss.type=nll_loss: loss.type: loss is not a section"),
        (
            "trainer.epochs.max=3",
            "--set trainer.epochs.max=3: trainer.epochs.max: trainer.epochs is not a section",
        ),
        ("metrics.5=accuracy", "--set metrics.5=accuracy: metrics.5: no list index 5 (length 2)"),
        ("metrics.first=accuracy", "metrics.first: no list index first (length 2)"),
        # Python's spellings would be strings, and the string "False" is true.
        (
            "optimizer.args.amsgrad=False",
            "--set 'optimizer.args.amsgrad=False': False is no JSON; write "
            "optimizer.args.amsgrad=false",
        ),
        ("arch.args.pretrained=True", "write arch.args.pretrained=true"),
        ("trainer.len_epoch=None", "write trainer.len_epoch=null"),
    ],
)
def test_bad_set_is_an_error(make_config, text, expected):
    assert expected in parse_error(config=str(make_config()), set=[text])


def test_unknown_set_key_lists_the_known_keys(make_config):
    message = parse_error(config=str(make_config()), set=["trainer.epoch=3"])
    known = message.partition("(known here: ")[2].rstrip(")").split(", ")
    assert {"epochs", "save_dir", "monitor"} <= set(known)
    assert known == sorted(known)


def test_set_value_is_validated_against_the_config_file(make_config):
    path = make_config()
    message = parse_error(config=str(path), set=["trainer.epochs=0"])
    assert message == f"{path}: trainer.epochs: must be a positive integer, got 0"


def test_shortcut_value_is_validated(make_config):
    path = make_config()
    message = parse_error(config=str(path), lr=-1.0)
    assert message == f"{path}: optimizer.args.lr: must be a number > 0, got -1.0"


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dotted", "value", "expected"),
    [
        ("name", DELETE, "name: missing required key"),
        ("arch", DELETE, "arch: missing required key"),
        ("data_loader", DELETE, "data_loader: missing required key"),
        ("optimizer", DELETE, "optimizer: missing required key"),
        ("loss", DELETE, "loss: missing required key"),
        ("trainer", DELETE, "trainer: missing required key"),
        ("trainer.epochs", DELETE, "trainer.epochs: missing required key"),
        ("optimizer.type", DELETE, "optimizer.type: missing required key"),
        ("trainer.epochs", 0, "trainer.epochs: must be a positive integer, got 0"),
        ("trainer.epochs", "3", 'trainer.epochs: must be a positive integer, got "3"'),
        ("trainer.epochs", 2.5, "trainer.epochs: must be a positive integer, got 2.5"),
        ("trainer.epochs", True, "trainer.epochs: must be a positive integer, got true"),
        ("optimizer.args.lr", -0.1, "optimizer.args.lr: must be a number > 0, got -0.1"),
        ("optimizer.args.lr", 0, "optimizer.args.lr: must be a number > 0, got 0"),
        ("optimizer.args.weight_decay", -1, "optimizer.args.weight_decay: must be a number >= 0"),
        (
            "data_loader.args.batch_size",
            "a",
            'data_loader.args.batch_size: must be a positive integer, got "a"',
        ),
        (
            "data_loader.args.validation_split",
            1.5,
            "data_loader.args.validation_split: must be a fraction in [0, 1) or a whole number "
            "of samples >= 0, got 1.5",
        ),
        ("data_loader.args.validation_split", -1, "data_loader.args.validation_split: must be"),
        ("data_loader.args.num_workers", -1, "data_loader.args.num_workers: must be an integer"),
        ("data_loader.args.shuffle", "yes", "data_loader.args.shuffle: must be true or false"),
        ("trainer.verbosity", 3, "trainer.verbosity: must be 0, 1 or 2, got 3"),
        ("trainer.tensorboard", "yes", 'trainer.tensorboard: must be true or false, got "yes"'),
        ("trainer.early_stop", -1, "trainer.early_stop: must be an integer >= 0 or null, got -1"),
        ("trainer.len_epoch", 0, "trainer.len_epoch: must be a positive integer or null, got 0"),
        ("trainer.save_period", 0, "trainer.save_period: must be a positive integer, got 0"),
        ("trainer.save_dir", "", 'trainer.save_dir: must be a non-empty string, got ""'),
        ("n_gpu", -1, "n_gpu: must be an integer >= 0, got -1"),
        ("seed", "0", 'seed: must be an integer >= 0, got "0"'),
        ("name", "my run", "name: must be a name of letters, digits"),
        ("name", "a/b", "name: must be a name of letters, digits"),
        (
            "metrics",
            "accuracy",
            'metrics: must be a list of metric names or {"type": NAME, "name": KEY, "args": {...}}, '
            'each name or KEY letters, digits and "_", not "loss" nor "ema_...", got "accuracy"',
        ),
        ("loss", "", 'loss: must be a non-empty string, got ""'),
        ("foo", 1, "foo: unknown key (known: name, device, n_gpu, seed, arch, "),
        ("device", "gpu", 'device: must be "auto", "cpu", "cuda", "cuda:N" (N = 0, 1, ...) or'),
        ("device", "cuda:", 'device: must be "auto", "cpu", "cuda", "cuda:N"'),
        ("trainer.epoch", 3, "trainer.epoch: unknown key (known: epochs, save_dir, "),
        ("trainer", [1], "trainer: must be an object"),
        (
            "optimizer.kind",
            "SGD",
            "optimizer.kind: unknown key (allowed: ['args', 'norm_bias_weight_decay', 'param_groups', 'reference_batch_size', 'type'])",
        ),
        (
            "arch.interval",
            "epoch",
            "arch.interval: unknown key (allowed: ['args', 'freeze', 'freeze_norm_scale', 'type'])",
        ),
        ("optimizer.type", 3, "optimizer.type: must be a non-empty string, got 3"),
        ("optimizer", "SGD", 'optimizer: must be {"type": ..., "args": {...}}'),
        ("arch.args", [1], "arch.args: must be an object"),
        ("arch.args", None, "arch.args: must be an object"),
        (
            "lr_scheduler.interval",
            "batch",
            "lr_scheduler.interval: must be one of ('epoch', 'step'), got \"batch\"",
        ),
        (
            "trainer.monitor",
            "maximize val/accuracy",
            'trainer.monitor: must be "off" or "min|max <metric>", got "maximize val/accuracy"',
        ),
        (
            "trainer.monitor",
            "max val/f1",
            'trainer.monitor: unknown metric "val/f1" (choose from val/loss, val/accuracy, '
            "val/top_k_acc, train/loss, train/accuracy, train/top_k_acc)",
        ),
        ("trainer.monitor", "max test/accuracy", 'trainer.monitor: unknown metric "test/accuracy"'),
        ("trainer.monitor", "max", 'trainer.monitor: unknown metric ""'),
        ("trainer.monitor", "Off", 'trainer.monitor: must be "off" or "min|max <metric>"'),
        ("trainer.tf32", "on", 'trainer.tf32: must be true or false or null, got "on"'),
        ("trainer.tta_translate_weight", 0, "trainer.tta_translate_weight: must be a number > 0"),
        ("trainer.tta_translate_weight", "0.5", "trainer.tta_translate_weight: must be a number"),
        # Without shifted views the weight would do nothing: refused, not ignored.
        (
            "trainer.tta_translate_weight",
            0.5,
            "trainer.tta_translate_weight: weighs the shifted views, and trainer.tta_translate "
            "is 0 (none); set tta_translate > 0 or remove the weight",
        ),
        ("trainer.type", "", 'trainer.type: must be a non-empty string, got ""'),
        ("trainer.type", 3, "trainer.type: must be a non-empty string, got 3"),
        ("trainer.type", None, "trainer.type: must be a non-empty string, got null"),
        ("trainer.args", [1], "trainer.args: must be an object {...}"),
        ("trainer.args", "lr=1", "trainer.args: must be an object {...}"),
        ("trainer.args", None, "trainer.args: must be an object {...}"),
        (
            "lr_scheduler",
            {"type": "ReduceLROnPlateau", "args": {}, "interval": "step"},
            'lr_scheduler.interval: must be "epoch" for ReduceLROnPlateau, which steps on the '
            'monitored metric once per epoch; got "step"',
        ),
        ("arch.freeze", "features", "arch.freeze: must be a list of distinct parameter-name"),
        ("arch.freeze", ["head", "head"], "arch.freeze: must be a list of distinct"),
        ("arch.freeze", ["head", ""], "arch.freeze: must be a list of distinct"),
        ("optimizer.param_groups", {"params": "head"}, "optimizer.param_groups: must be a list"),
        ("optimizer.param_groups", [{"lr": 0.1}], "optimizer.param_groups[0]: must be an object"),
        ("optimizer.param_groups", [{"params": 3}], "optimizer.param_groups[0].params: must be a"),
        ("optimizer.param_groups", [{"params": []}], "optimizer.param_groups[0].params: must name"),
        (
            "optimizer.param_groups",
            [{"params": "head"}, {"params": ["features"], "lr": -1}],
            "optimizer.param_groups[1].lr: must be a number > 0, got -1",
        ),
    ],
)
def test_validation_error_names_file_and_key(demo_config, write_config, dotted, value, expected):
    path = write_config(edit(demo_config, dotted, value))
    message = parse_error(config=path)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_monitor_needs_its_metric_listed(demo_config, write_config):
    demo_config["metrics"] = ["top_k_acc"]
    message = parse_error(config=write_config(demo_config))
    assert 'trainer.monitor: unknown metric "val/accuracy"' in message


@pytest.mark.parametrize(
    ("monitor", "expected"),
    [
        ("off", ("off", "")),
        ("max val/accuracy", ("max", "val/accuracy")),
        ("min val_loss", ("min", "val/loss")),
        ("min train_loss", ("min", "train/loss")),
        ("max val_top_k_acc", ("max", "val/top_k_acc")),
        ("min  train/loss", ("min", "train/loss")),
    ],
)
def test_monitor_forms(demo_config, monitor, expected):
    demo_config["trainer"]["monitor"] = monitor
    parser = ConfigParser(demo_config, source="cfg.json")
    assert (parser.monitor_mode, parser.monitor_key) == expected


def test_json_syntax_error_gives_line_and_column(write_config):
    path = write_config('{\n    "name": "x",\n    "seed": 0,\n}\n')
    message = parse_error(config=path)
    assert message.startswith(f"{path}: invalid JSON at line 4, column 1: ")


def test_missing_config_file(tmp_path):
    path = tmp_path / "nope.json"
    assert parse_error(config=str(path)) == f"{path}: config file not found"


def test_config_that_is_a_folder(tmp_path):
    assert parse_error(config=str(tmp_path)).startswith(f"{tmp_path}: cannot read config file")


@pytest.mark.parametrize("text", ["[1, 2]", '"config"', "null", "3"])
def test_top_level_must_be_an_object(write_config, text):
    path = write_config(text)
    assert parse_error(config=path) == f"{path}: the top level must be a JSON object {{...}}"


def test_no_config_and_no_resume():
    assert "no config given: pass -c CONFIG" in parse_error()


# --- purity, run ids and resume ---------------------------------------------------------------


def test_parsing_creates_nothing(make_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = make_config()
    relative = make_config(filename="relative.json", **{"trainer.save_dir": "saved_relative/"})
    before = sorted(tmp_path.rglob("*"))

    parser = ConfigParser.from_args(namespace(config=str(path), set=["trainer.epochs=3"]))
    ConfigParser(json.loads(path.read_text()), source=str(path))
    relative_parser = ConfigParser.from_args(namespace(config=str(relative)))

    assert sorted(tmp_path.rglob("*")) == before
    assert parser.checkpoint_dir == tmp_path / "saved" / "models" / "Demo_CifarCNN" / parser.run_id
    assert parser.log_dir == tmp_path / "saved" / "log" / "Demo_CifarCNN" / parser.run_id
    assert not relative_parser.checkpoint_dir.exists()


def test_default_run_ids_are_unique(demo_config):
    first = ConfigParser(demo_config, source="cfg.json")
    second = ConfigParser(demo_config, source="cfg.json")
    assert first.run_id != second.run_id
    assert first.checkpoint_dir != second.checkpoint_dir
    for parser in (first, second):
        assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", parser.run_id)


def test_run_id_flag_names_the_folder(make_config):
    parser = ConfigParser.from_args(namespace(config=str(make_config()), run_id="try-1.b_2"))
    assert parser.run_id == "try-1.b_2"
    assert parser.checkpoint_dir.name == "try-1.b_2"


@pytest.mark.parametrize("run_id", ["a/b", "../up", "", "with space"])
def test_bad_run_id_is_rejected(make_config, run_id):
    message = parse_error(config=str(make_config()), run_id=run_id)
    assert message.startswith(f"--run-id {run_id!r}: must be a name of letters")


@pytest.mark.parametrize("run_id", ["..", "."])
def test_dot_run_id_is_rejected(make_config, run_id):
    with pytest.raises(ConfigError, match="--run-id"):
        ConfigParser.from_args(namespace(config=str(make_config()), run_id=run_id))


@pytest.mark.parametrize(
    ("elastic_id", "expected"),
    [("job-7.a", "job-7.a"), ("..", "own"), (".", "own"), ("a/b", "own"), ("none", "own")],
)
def test_torchruns_rendezvous_id_names_the_run_only_when_it_is_a_folder_name(
    monkeypatch, elastic_id, expected
):
    """--rdzv-id=.. named saved/models/<name>/.. (the experiment's folder) the run folder;
    what --run-id refuses falls back to the run id every rank is given."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", elastic_id)
    assert default_run_id("own", lambda value: value) == expected


@pytest.fixture
def moved_run(make_config, tmp_path):
    """A run folder somewhere else than save_dir: config.json beside a checkpoint file."""
    run_dir = tmp_path / "elsewhere" / "my-run"
    run_dir.mkdir(parents=True)
    make_config(filename="elsewhere/my-run/config.json")
    checkpoint = run_dir / "checkpoint-epoch1.pth"
    checkpoint.write_bytes(b"from_args only checks that the file exists")
    return checkpoint


def test_resume_without_config_reads_the_config_beside_it(moved_run, tmp_path):
    before = sorted(tmp_path.rglob("*"))
    parser = ConfigParser.from_args(namespace(resume=str(moved_run), set=["trainer.epochs=4"]))
    assert parser.source == str(moved_run.parent / "config.json")
    assert parser.resume == moved_run
    assert parser.checkpoint_dir == moved_run.parent
    assert parser.run_id == "my-run"
    # Its logs go with it, not into saved/log/Demo_CifarCNN/my-run: another run's, maybe.
    assert parser.log_dir == moved_run.parent / "log" / "my-run"
    assert parser["trainer"]["epochs"] == 4
    assert sorted(tmp_path.rglob("*")) == before


def test_resume_with_config_starts_a_new_run_folder(moved_run, make_config, tmp_path):
    path = make_config(filename="other.json")
    parser = ConfigParser.from_args(namespace(config=str(path), resume=str(moved_run)))
    assert parser.source == str(path)
    assert parser.resume == moved_run
    assert parser.checkpoint_dir.parent == tmp_path / "saved/models/Demo_CifarCNN"


def test_resume_without_beside_config_is_a_one_line_error(moved_run):
    (moved_run.parent / "config.json").unlink()
    message = parse_error(resume=str(moved_run))
    assert message == (
        f"{moved_run.parent / 'config.json'}: not found beside the checkpoint; pass -c CONFIG"
    )


def test_resume_of_a_missing_checkpoint(tmp_path):
    path = tmp_path / "gone" / "checkpoint-epoch1.pth"
    assert parse_error(resume=str(path)) == f"{path}: checkpoint not found"


def test_continue_needs_a_checkpoint_and_a_config(make_config, moved_run):
    message = parse_error(config=str(make_config()), continue_run=True)
    assert message.startswith("--continue: only with -r CHECKPOINT -c CONFIG")
    assert parse_error(resume=str(moved_run), continue_run=True).startswith("--continue: only")
    parser = ConfigParser.from_args(
        namespace(config=str(make_config()), resume=str(moved_run), continue_run=True)
    )
    assert parser.fine_tune and parser.continue_run
    # Each fold of a cross-validated fine-tune is a fine-tune too.
    folds = ConfigParser.from_args(
        namespace(config=str(make_config()), resume=str(moved_run), folds=3)
    )
    assert folds.for_fold(1).fine_tune and not folds.for_fold(1).continue_run


def test_a_run_folder_without_checkpoints_restarts_with_its_own_config(moved_run):
    moved_run.unlink()  # the run stopped before its first checkpoint: only config.json is left
    parser = ConfigParser.from_args(namespace(resume=str(moved_run.parent)))
    assert not parser.fine_tune and parser.source == str(moved_run.parent / "config.json")
    assert parser.checkpoint_dir == moved_run.parent and parser.run_id == "my-run"
    assert find_resume_point(parser).path is None  # epoch 1, in that folder


def test_a_run_folder_with_other_files_but_no_checkpoint_is_refused(moved_run):
    moved_run.unlink()
    (moved_run.parent / "notes.txt").write_text("mine")
    parser = ConfigParser.from_args(namespace(resume=str(moved_run.parent)))
    with pytest.raises(UserError) as raised:
        find_resume_point(parser)
    assert str(raised.value) == f"{moved_run.parent}: no checkpoint-epoch*.pth in this run folder"


def numeric_keys(node, prefix: str = "") -> list[str]:
    """The dotted paths of every number in a config's objects (not true/false, not in lists)."""
    if not isinstance(node, dict):
        is_number = isinstance(node, int | float) and not isinstance(node, bool)
        return [prefix[1:]] if is_number else []
    return [key for name, value in node.items() for key in numeric_keys(value, f"{prefix}.{name}")]


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"]


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), token=st.sampled_from(NON_FINITE), by_set=st.booleans())
def test_no_config_number_may_be_nan_or_infinite(make_config, data, token, by_set):
    """Python's json reads NaN, Infinity and 1e400 (as inf); a range check passes lr Infinity and
    a NaN fails comparisons far from where it was written. Any number, in the file or by --set,
    is refused in one line naming the token and where it was written."""
    path = make_config()
    config = json.loads(path.read_text())
    dotted = data.draw(st.sampled_from(numeric_keys(config)))
    if by_set:
        message = parse_error(config=str(path), set=[f"{dotted}={token}"])
        source = f"--set '{dotted}={token}'"
    else:
        edit(config, dotted, "@NON_FINITE@")
        path.write_text(json.dumps(config).replace('"@NON_FINITE@"', token))
        message, source = parse_error(config=str(path)), str(path)
    assert message == f"{source}: {token} is not a finite number; a config holds finite ones"
