"""The config key `device` and what each kind of device supports (utils/distributed/device.py).

There is no GPU and no Mac here: CUDA and MPS are simulated by replacing torch's availability
functions (torch.cuda.device_count, torch.backends.mps.is_available, ...), and the `meta` device
stands in for "a device that is not the CPU" where a real one is needed. MPS itself never runs.
"""

import json
import logging
import platform

import pytest
import torch
from conftest import ROOT, checkpoint_dirs, run_main, set_flags, shrink
from torch.torch_version import TorchVersion

import train
from build import build_trainer
from parse_config import ConfigParser
from utils import UserError, configure_torch, get_rng_state
from utils.distributed.device import capabilities, check_options, gpu_indices, select_device
from utils.distributed.process_group import ProcessInfo
from utils.state.checkpoint import load_checkpoint, save_checkpoint
from utils.util import set_rng_state, set_tf32, tf32_enabled

LOGGER = logging.getLogger("test_device")
TORCHRUN = ProcessInfo(rank=1, local_rank=1, world_size=2, torchrun=True)


@pytest.fixture
def machine(monkeypatch):
    """machine(cuda=N, mps=bool, torch="2.6.0"): what torch reports about this machine."""

    def make(cuda: int = 0, mps: bool = False, torch_version: str | None = None) -> None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda > 0)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
        monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: True)
        if torch_version is not None:
            monkeypatch.setattr(torch, "__version__", TorchVersion(torch_version))

    return make


# --- which device a config names ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "n_gpu", "cuda", "mps", "info", "expected"),
    [
        ("auto", 0, 2, True, None, "cpu"),  # n_gpu 0: the CPU, as before `device` existed
        ("auto", 1, 2, True, None, "cuda:0"),
        ("auto", 1, 0, True, None, "mps"),
        ("auto", 1, 0, False, None, "cpu"),  # n_gpu 1 without a GPU: the CPU, as before
        ("auto", 1, 2, False, TORCHRUN, "cuda:1"),  # cuda:LOCAL_RANK
        ("auto", 1, 0, True, TORCHRUN, "cpu"),  # MPS serves one process
        ("cpu", 1, 2, True, None, "cpu"),  # an explicit device wins over n_gpu
        ("cuda", 0, 1, False, None, "cuda:0"),
        ("cuda", 1, 2, False, TORCHRUN, "cuda:1"),
        ("cuda:1", 1, 2, False, None, "cuda:1"),
        ("mps", 0, 0, True, None, "mps"),
    ],
)
def test_device_selection(machine, requested, n_gpu, cuda, mps, info, expected):
    machine(cuda=cuda, mps=mps)
    assert select_device(requested, n_gpu, LOGGER, info=info) == torch.device(expected)


@pytest.mark.parametrize(
    ("requested", "cuda", "mps", "info", "message"),
    [
        ("cuda", 0, True, None, 'c.json: device: "cuda": no CUDA device here'),
        ("cuda:0", 0, False, None, "no CUDA device here"),
        ("mps", 2, False, None, 'c.json: device: "mps": no MPS device here'),
        ("cuda:3", 2, False, None, "needs cuda:3, but 2 CUDA device(s) are visible"),
        ("cuda:0", 2, False, TORCHRUN, "under torchrun every process would share that GPU"),
        ("mps", 0, True, ProcessInfo(torchrun=True), "not under torchrun"),
        ("auto", 1, False, TORCHRUN, "needs cuda:1, but 1 CUDA device(s) are visible"),
    ],
)
def test_a_device_that_is_not_there_is_a_one_line_error(
    machine, requested, cuda, mps, info, message
):
    machine(cuda=cuda, mps=mps)
    with pytest.raises(UserError) as raised:
        select_device(requested, 1, LOGGER, info=info, source="c.json")
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_no_gpu_falls_back_to_the_cpu_with_a_log_line(machine, caplog):
    machine(cuda=0, mps=False)
    with caplog.at_level(logging.INFO):
        assert select_device("auto", 1, LOGGER) == torch.device("cpu")
    assert "No CUDA device available" in caplog.text


def test_the_gpu_indices_of_d_are_not_a_device_name():
    assert gpu_indices("0,1") == "0,1" and gpu_indices("") == ""
    for name in ("mps", "cpu", "cuda:1"):
        with pytest.raises(UserError, match=f'-d {name}: takes GPU indices .* "device" chooses'):
            gpu_indices(name)


# --- what each device supports ------------------------------------------------------------------


def test_capabilities_per_device(machine, monkeypatch):
    cpu = capabilities(torch.device("cpu"))
    assert cpu.autocast == ("bf16", "fp16") and cpu.grad_scaler and cpu.backend == "gloo"
    assert not (cpu.pin_memory or cpu.cuda_settings or cpu.fused_optimizers or cpu.sync_bn)

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    cuda = capabilities(torch.device("cuda", 0))
    assert cuda.pin_memory and cuda.cuda_settings and cuda.fused_optimizers and cuda.sync_bn
    assert cuda.autocast == ("bf16", "fp16") and cuda.backend == "nccl"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert capabilities(torch.device("cuda", 0)).autocast == ("fp16",)

    for version, recent in (("2.6.0", False), ("2.8.0", True), ("2.14.1+cpu", True)):
        machine(mps=True, torch_version=version)
        mps = capabilities(torch.device("mps"))
        assert mps.grad_scaler == recent and mps.compile == ("prototype" if recent else "no")
        assert mps.autocast == ("bf16", "fp16") and mps.backend is None
        assert not (mps.pin_memory or mps.cuda_settings or mps.fused_optimizers)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: False)
    assert capabilities(torch.device("mps")).autocast == ("fp16",)

    meta = capabilities(torch.device("meta"))  # nothing assumed of an unknown kind
    assert meta.autocast == () and not meta.grad_scaler and meta.compile == "no"


@pytest.fixture
def demo_parser(tmp_path):
    """demo_parser(**{"trainer.amp": "fp16"}) -> a ConfigParser of the shrunk demo config."""

    def make(**overrides) -> ConfigParser:
        config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path)
        for dotted, value in overrides.items():
            section, key = dotted.split(".")
            config.setdefault(section, {})[key] = value
        return ConfigParser(config, source="demo.json")

    return make


@pytest.mark.parametrize(
    ("overrides", "device", "torch_version", "training", "message"),
    [
        ({"trainer.amp": "fp16"}, "mps", "2.6.0", True, 'trainer.amp: "fp16" trains with a Grad'),
        ({"trainer.amp": "fp16"}, "mps", "2.6.0", False, None),  # evaluation needs no scaler
        ({"trainer.amp": "fp16"}, "mps", "2.8.0", True, None),
        ({"trainer.amp": "bf16"}, "mps", "2.6.0", True, None),
        ({"trainer.compile": True}, "mps", "2.6.0", True, "trainer.compile: torch 2.6.0 cannot"),
        ({"trainer.compile": True}, "mps", "2.8.0", True, None),
        ({"trainer.amp": "bf16"}, "meta", None, False, 'trainer.amp: "bf16" does not run on meta'),
        ({"distributed.backend": "nccl"}, "cpu", None, True, 'distributed.backend: "nccl" reduces'),
        ({"distributed.sync_bn": True}, "cpu", None, True, "distributed.sync_bn: SyncBatchNorm"),
    ],
)
def test_options_a_device_cannot_run_are_refused(
    demo_parser, machine, overrides, device, torch_version, training, message
):
    machine(mps=True, torch_version=torch_version)
    config = demo_parser(**overrides)
    check = lambda: check_options(  # noqa: E731
        config, torch.device(device), LOGGER, info=TORCHRUN, training=training
    )
    if message is None:
        check()
    else:
        with pytest.raises(UserError, match=f"^demo.json: {message}"):
            check()


def test_options_a_device_ignores_or_may_run_slowly_are_logged(demo_parser, machine, caplog):
    machine(mps=True, torch_version="2.8.0")
    options = {"trainer.tf32": True, "trainer.compile": True, "trainer.channels_last": True}
    with caplog.at_level(logging.INFO):
        check_options(demo_parser(**options), torch.device("mps"), LOGGER)
    assert "trainer.tf32: CUDA settings, no effect on mps" in caplog.text
    assert "compile on mps: torch's backend there is a prototype" in caplog.text
    assert "channels_last on mps: may train slower" in caplog.text


def test_a_cuda_gpu_without_bf16_refuses_bf16_up_front(demo_parser, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    with pytest.raises(
        UserError, match=r'trainer.amp: "bf16" does not run on cuda; set "fp16" or null'
    ):
        check_options(demo_parser(**{"trainer.amp": "bf16"}), torch.device("cuda", 0), LOGGER)


@pytest.mark.parametrize(
    ("machine_name", "avx512_bf16", "amx", "warned"),
    [
        ("x86_64", False, False, True),  # AVX2 only (e.g. an AMD EPYC before Zen 4)
        ("x86_64", True, False, False),
        ("x86_64", False, True, False),
        ("arm64", False, False, False),  # nothing claimed where torch cannot tell
    ],
)
def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_of(
    demo_parser, monkeypatch, caplog, machine_name, avx512_bf16, amx, warned
):
    monkeypatch.setattr(platform, "machine", lambda: machine_name)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    with caplog.at_level(logging.WARNING):
        check_options(demo_parser(**{"trainer.amp": "bf16"}), torch.device("cpu"), LOGGER)
    assert ('trainer.amp "bf16" on a CPU without bf16 instructions' in caplog.text) == warned
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        check_options(demo_parser(**{"trainer.amp": None}), torch.device("cpu"), LOGGER)
    assert "bf16" not in caplog.text


def test_tf32_and_cudnn_benchmark_are_set_on_cuda_only(demo_parser):
    before = (tf32_enabled(), torch.backends.cudnn.benchmark)
    options = demo_parser(**{"trainer.tf32": True, "trainer.cudnn_benchmark": True})["trainer"]
    try:
        set_tf32(False)
        torch.backends.cudnn.benchmark = False
        for device in ("cpu", "meta", "mps"):
            configure_torch(options, torch.device(device))
            assert tf32_enabled() == (False, False) and not torch.backends.cudnn.benchmark
        configure_torch(options, torch.device("cuda", 0))  # flags only: no GPU needed
        assert tf32_enabled() == (True, True) and torch.backends.cudnn.benchmark
    finally:
        set_tf32(before[0][0])
        torch.backends.cudnn.benchmark = before[1]


# --- not the CPU, not CUDA: MPS's random numbers and the meta device ------------------------------


def test_mps_rng_state_is_saved_and_restored_through_a_cpu_loaded_checkpoint(monkeypatch, tmp_path):
    restored = []
    monkeypatch.setattr(torch.mps, "get_rng_state", lambda: torch.arange(8, dtype=torch.uint8))
    monkeypatch.setattr(torch.mps, "set_rng_state", restored.append)
    state = get_rng_state(torch.device("mps"))
    assert state["cuda"] is None
    save_checkpoint({"model": {}, "config": {}, "epoch": 1, "rng": state}, tmp_path / "c.pth")
    loaded = load_checkpoint(tmp_path / "c.pth", map_location="cpu")["rng"]
    set_rng_state(loaded, torch.device("mps"))
    assert len(restored) == 1 and torch.equal(restored[0], torch.arange(8, dtype=torch.uint8))
    # A CPU run's state (no MPS generator) resumed on MPS: the CPU's restored, MPS's left alone.
    set_rng_state(get_rng_state(torch.device("cpu")), torch.device("mps"))
    assert len(restored) == 1


def test_a_run_built_for_a_device_that_is_not_the_cpu_assumes_no_cuda(demo_parser, monkeypatch):
    """A GPU machine (CUDA "available") running on meta: nothing pinned or fused, no scaler,
    and no CUDA call (each raises here)."""

    def no_cuda(*args, **kwargs):
        raise AssertionError("a CUDA call for a run that is not on CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("get_rng_state", "set_rng_state", "set_device", "is_bf16_supported"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    config = demo_parser(**{"trainer.tf32": True})  # the demo's loader asks for pin_memory
    assert config["data_loader"]["args"]["pin_memory"] is True
    meta = torch.device("meta")
    trainer = build_trainer(config, ProcessInfo(), meta, LOGGER)
    assert trainer.data.pin_memory is False and trainer.train_loader.pin_memory is False
    assert not trainer.optimizer.defaults.get("fused") and not trainer.scaler.is_enabled()
    assert next(trainer.model.parameters()).device == meta
    configure_torch(config["trainer"], meta)
    assert get_rng_state(meta)["cuda"] is None and get_rng_state(meta)["mps"] is None
    # The CPU chosen on a GPU machine: the device decides pinning, not the machine.
    cpu_trainer = build_trainer(config, ProcessInfo(), torch.device("cpu"), LOGGER)
    assert cpu_trainer.train_loader.pin_memory is False


# --- end to end: train.py with each device here -------------------------------------------------


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_train_py_runs_on_cpu_and_auto_and_refuses_devices_that_are_not_here(
    machine, make_config, tmp_path, capsys
):
    # In-process (run_main): a machine without CUDA or MPS, as torch reports it here. A hidden
    # GPU (CUDA_VISIBLE_DEVICES) stays visible to a process that has already used it.
    machine(cuda=0, mps=False)
    config = make_config(**{"n_gpu": 1, "trainer.epochs": 1, "trainer.tensorboard": False})
    save_dir = tmp_path / "saved"
    for device in ("cpu", "auto"):
        result = run_main("train.py", "-c", str(config), "--run-id", device, *set_flags(
            {"device": device}
        ))  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        saved = json.loads(
            (save_dir / "models" / "Demo_CifarCNN" / device / "config.json").read_text()
        )
        assert saved["device"] == device
    assert "No CUDA device available (MPS: none): running on the CPU." in result.stdout  # auto
    for device in ("mps", "cuda"):  # neither is here
        result = run_main("train.py", "-c", str(config), "--run-id", "refused", *set_flags(
            {"device": device}
        ))  # fmt: skip
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert lines[0].startswith(f'error: {config}: device: "{device}": no '), lines[0]
    # -d takes GPU indices: refused before anything else.
    assert train.main(["-c", str(config), "--run-id", "refused", "-d", "mps"]) == 2
    assert capsys.readouterr().err.startswith("error: -d mps: takes GPU indices")
    assert [path.name for path in checkpoint_dirs(save_dir)] == ["auto", "cpu"]
    assert not (save_dir / "log" / "Demo_CifarCNN" / "refused").exists()
