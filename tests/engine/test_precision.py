"""``train.precision: auto`` and ``model.base_dtype: auto`` on GPUs this machine does not
have: torch's CUDA queries are answered as a V100, a T4, an A100 and an H100 answer them.
``torch.cuda.is_bf16_supported()`` says True on all four (V100 and T4 emulate bf16), so the
choice must come from the compute capability."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from adalora_cli.engine import precision as prec
from adalora_cli.engine.precision import Precision, bf16_native, decide, resolve
from tests.methods._tiny import run_config

CUDA = torch.device("cuda")
GPUS = {"V100": (7, 0), "T4": (7, 5), "A100": (8, 0), "RTX 4090": (8, 9), "H100": (9, 0)}


@pytest.fixture()
def gpu(monkeypatch):
    """``gpu(name)``: torch.cuda answers as that GPU (CUDA build, not ROCm)."""

    def as_gpu(name: str) -> None:
        major, minor = GPUS[name]
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (major, minor))
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda d=None: SimpleNamespace(major=major, minor=minor))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: f"NVIDIA {name}")
        # the emulation probe: creating a bf16 tensor works on every CUDA GPU
        monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda d: True,
                            raising=False)
    return as_gpu


@pytest.mark.parametrize("name, native", [("V100", False), ("T4", False), ("A100", True),
                                          ("RTX 4090", True), ("H100", True)])
def test_auto_is_bf16_only_where_bf16_is_native(gpu, monkeypatch, name, native):
    gpu(name)
    monkeypatch.setattr(prec, "cpu_bf16_native", lambda: False)  # an AVX2-only host
    assert torch.cuda.is_bf16_supported()  # what the old test said: True even on a V100
    assert bf16_native(CUDA) is native
    # torch's own answer without emulation agrees wherever torch has it (2.4 and later)
    assert torch.cuda.is_bf16_supported(including_emulation=False) is native
    auto = "bf16" if native else "fp16"
    assert resolve("auto", CUDA) == auto
    assert Precision.of("auto", CUDA).amp_dtype is (torch.bfloat16 if native else torch.float16)
    # an explicit choice is kept, fp32 means no autocast, and a CPU without native bf16 is
    # fp32 whatever the GPU
    assert [resolve(p, CUDA) for p in ("bf16", "fp16", "fp32")] == [
        "bf16", "fp16", "fp32"]
    assert Precision.of("fp32", CUDA).amp_dtype is None
    assert resolve("auto", torch.device("cpu")) == "fp32"


@pytest.mark.parametrize("name, expected", [("V100", torch.float32), ("A100", torch.bfloat16)])
def test_base_dtype_auto_follows_the_same_decision(gpu, name, expected):
    """A bf16 base only under bf16 autocast; under fp16 autocast the base stays fp32."""
    gpu(name)
    assert decide(run_config("lora", model={"base_dtype": "auto"}), CUDA).base_dtype is expected
    assert decide(run_config("lora", model={"base_dtype": "fp16"}),
                  CUDA).base_dtype is torch.float16


def test_rocm_runs_bf16(gpu, monkeypatch):
    gpu("V100")
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert resolve("auto", CUDA) == "bf16"


def test_dtype_names_are_the_config_s():
    assert [prec.dtype_name(d) for d in (torch.float32, torch.bfloat16, torch.float16)] == [
        "fp32", "bf16", "fp16"]


# ------------------------------------------------------------------ bf16 on the CPU
CPU = torch.device("cpu")


@pytest.mark.parametrize("native", [False, True])
def test_the_cpu_autocasts_when_asked_for_bf16_and_for_auto_where_native(monkeypatch, native):
    monkeypatch.setattr(prec, "cpu_bf16_native", lambda: native)
    auto = "bf16" if native else "fp32"
    assert [resolve(p, CPU) for p in ("auto", "bf16", "fp16", "fp32")] == [
        auto, "bf16", "fp32", "fp32"]
    assert Precision.of("auto", CPU).amp_dtype is (torch.bfloat16 if native else None)
    # model.base_dtype=auto follows: a bf16 base only under bf16 autocast
    assert decide(run_config("lora", model={"base_dtype": "auto"}), CPU).base_dtype is (
        torch.bfloat16 if native else torch.float32)
    half = Precision.of("bf16", CPU)
    context, dtype = half.context(), half.amp_dtype
    assert dtype is torch.bfloat16
    with context():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") is torch.bfloat16
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype is torch.bfloat16
    assert Precision.of("fp32", CPU).amp_dtype is None
    # a bf16 base may now run on the CPU (it meets bf16 autocast); without it, refused
    cfg = run_config("lora", model={"base_dtype": "bf16"}, train={"precision": "bf16"})
    assert decide(cfg, CPU).base_dtype is torch.bfloat16
    assert decide(run_config("lora", model={"base_dtype": "auto"},
                             train={"precision": "bf16"}), CPU).base_dtype is torch.bfloat16
    with pytest.raises(prec.ConfigError, match="train.precision=bf16 on a CPU"):
        decide(run_config("lora", model={"base_dtype": "bf16"},
                          train={"precision": "fp32"}), CPU)


@pytest.mark.parametrize("avx512_bf16, amx, native", [(True, False, True), (False, True, True),
                                                      (False, False, False)])
def test_native_cpu_bf16_is_avx512_bf16_or_amx(monkeypatch, avx512_bf16, amx, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert prec.cpu_bf16_native() is native


def test_without_torch_s_helpers_the_cpu_flags_decide(monkeypatch, tmp_path):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    flags = {"/proc/cpuinfo": "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n"}
    monkeypatch.setattr(prec.Path, "read_text", lambda self: flags[str(self)])
    assert prec.cpu_bf16_native()
    flags["/proc/cpuinfo"] = "flags\t\t: fpu sse avx2 avx512f\n"
    assert not prec.cpu_bf16_native()


def test_a_bf16_step_on_the_cpu_keeps_adapters_head_and_adam_in_fp32():
    from adalora_cli.config import TrainConfig
    from adalora_cli.engine.step import Stepper
    from adalora_cli.methods import apply_method
    from tests.methods._tiny import tiny_batch, tiny_bert

    model = tiny_bert(0)
    handle = apply_method(model, run_config(
        "adalora", adalora={"budget": 16, "t_init": 2, "delta_t": 2, "t_final": 2}), 10)
    stepper = Stepper.build(model, handle, TrainConfig(), 10, Precision.of("bf16", CPU))
    assert stepper.precision == "bf16" and not stepper.scaler.is_enabled()
    outputs = []
    model.register_forward_hook(lambda m, i, o: outputs.append(o.logits.dtype))
    loss, _ = stepper.backward_pieces([(tiny_batch(1), 1.0)])
    stepper.update(1, loss)
    assert outputs == [torch.bfloat16]  # the forward ran under bf16 autocast
    assert {p.dtype for p in handle.trainable} == {torch.float32}
    states = [stepper.optimizer.state[p] for p in handle.trainable]
    assert {s["exp_avg"].dtype for s in states} == {torch.float32}
    assert all(p.grad is None for p in handle.trainable)  # zeroed after the step
    assert torch.isfinite(loss) and loss.dtype is torch.float64


@pytest.mark.parametrize("native, warned", [(False, True), (True, False)])
def test_smoke_run_in_bf16_records_it_and_warns_once_where_emulated(
        monkeypatch, tmp_path, capsys, native, warned):
    import json

    from adalora_cli.config import load_config
    from adalora_cli.engine.loop import train

    from .conftest import SMOKE

    monkeypatch.setattr(prec, "cpu_bf16_native", lambda: native)
    run = train(load_config(SMOKE, ["train.precision=bf16", "train.max_steps=14"]),
                tmp_path / "run", quiet=True)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["precision"]["autocast"] == "bf16"
    assert summary["precision"]["loss_scaling"] is False
    err = capsys.readouterr().err
    assert err.count("without native bf16") == (1 if warned else 0)


@pytest.mark.parametrize("native, ran, reason", [
    (False, "fp32", "runs fp32 on this CPU (no native bf16"),
    (True, "bf16", "runs bf16 autocast on this CPU (native bf16")])
def test_auto_on_the_cpu_is_bf16_only_where_native_and_says_so_once(
        monkeypatch, tmp_path, capsys, native, ran, reason):
    import json

    from adalora_cli.config import load_config
    from adalora_cli.engine.loop import train

    from .conftest import SMOKE

    monkeypatch.setattr(prec, "cpu_bf16_native", lambda: native)
    for quiet in (False, True):
        run = train(load_config(SMOKE, ["train.precision=auto", "train.max_steps=14"]),
                    tmp_path / f"run-{quiet}", quiet=quiet)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["precision"]["autocast"] == ran
        notes = [line for line in capsys.readouterr().out.splitlines()
                 if "train.precision=auto" in line]
        if quiet:  # the run's header only: --quiet runs (sweeps, scripts) stay terse
            assert notes == []
        else:  # the header's device line, before the model loads
            assert len(notes) == 1 and notes[0].startswith("device cpu: ") and reason in notes[0]


@pytest.mark.parametrize("name, line", [
    ("A100", "device cuda (NVIDIA A100), precision bf16 autocast (train.precision=auto: "
             "native bf16)"),
    ("V100", "device cuda (NVIDIA V100), precision fp16 autocast with loss scaling "
             "(train.precision=auto: this GPU has no native bf16)")])
def test_the_header_says_the_gpu_and_what_auto_chose_there(gpu, name, line):
    from adalora_cli.engine.header import machine

    gpu(name)
    assert machine(decide(run_config("lora"), CUDA)) == line
    assert machine(decide(run_config("lora", train={"precision": "fp32"}), CUDA)) == (
        f"device cuda (NVIDIA {name}), precision fp32")
