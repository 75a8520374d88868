"""``adalora doctor``: what torch sees here, and a config that asks for CUDA where none is
visible refused in one line (exit 2) naming the reason and the fix. CUDA is faked by
patching torch.cuda's queries, so the GPU rows are checked on any machine."""

from __future__ import annotations

from importlib import metadata
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.engine.precision import cpu_bf16_native

runner = CliRunner()
INSTALL = "docs/reproducing.md#install-on-a-gpu-machine"


def rows(output: str) -> dict[str, str]:
    """The report's ``name  text`` lines (notes and errors left out)."""
    found = {}
    for line in output.splitlines():
        if line and not line.startswith(("note:", "error:")):
            name, text = line.split(None, 1)
            found[name] = text
    return found


@pytest.fixture()
def cpu_only(monkeypatch):
    """A CPU-only build of torch, whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)


GPUS = [("NVIDIA H100 80GB HBM3", 85_520_809_984, (9, 0)),  # 79.6 GiB
        ("Tesla V100-SXM2-16GB", 17_059_545_088, (7, 0))]   # 15.9 GiB


@pytest.fixture()
def two_gpus(monkeypatch):
    """A CUDA 13.0 build that sees an H100 (bf16 native) and a V100 (no native bf16)."""
    def index(device=None) -> int:
        return 0 if device is None else getattr(torch.device(device), "index", None) or 0

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(GPUS))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(
        name=GPUS[i][0], total_memory=GPUS[i][1], major=GPUS[i][2][0], minor=GPUS[i][2][1]))
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: GPUS[index(device)][2])


def test_a_cpu_only_torch_says_so_and_why_no_cuda(cpu_only, in_repo):
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    seen = rows(result.output)
    assert seen["torch"] == (f"{torch.__version__} (adalora declares >=2.13,<3); a CPU-only "
                             "build (no CUDA)")
    assert seen["CUDA"] == (f"no device visible: torch {torch.__version__} is a CPU-only "
                            f"build; install torch's CUDA build into this environment "
                            f"({INSTALL})")
    auto = "bf16" if cpu_bf16_native() else "fp32"
    assert seen["precision"].startswith(f"train.precision=auto runs {auto} on cpu;")
    assert seen["transformers"] == (f"{metadata.version('transformers')} (adalora declares "
                                    ">=5.24,<6)")
    assert "cuda:0" not in seen


def test_a_config_asking_for_cuda_without_one_is_one_line_exit_2(cpu_only, in_repo):
    result = runner.invoke(app, ["doctor", "configs/glue/mnli.yaml", "train.device=cuda"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: configs/glue/mnli.yaml asks for train.device=cuda but no CUDA device is "
        f"visible: torch {torch.__version__} is a CPU-only build; install torch's CUDA build "
        f"into this environment ({INSTALL})"]
    assert result.output.rstrip().endswith(errors[0]) and "Traceback" not in result.output
    assert "torch" in rows(result.output)  # the machine's facts came first


def test_hidden_gpus_are_named_as_the_reason(two_gpus, monkeypatch, in_repo):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = runner.invoke(app, ["doctor", "configs/smoke/glue.yaml", "train.device=cuda:1"])
    assert result.exit_code == 2
    assert result.output.rstrip().splitlines()[-1] == (
        "error: configs/smoke/glue.yaml asks for train.device=cuda:1 but no CUDA device is "
        "visible: CUDA_VISIBLE_DEVICES='' hides every GPU; unset CUDA_VISIBLE_DEVICES or "
        "name a GPU in it")


def test_visible_gpus_with_memory_bf16_and_where_a_config_runs(two_gpus, in_repo):
    result = runner.invoke(app, ["doctor", "configs/glue/mnli.yaml", "train.device=cuda"])
    assert result.exit_code == 0, result.output
    seen = rows(result.output)
    assert seen["torch"].endswith("; built for CUDA 13.0, cuDNN 91002")
    assert seen["CUDA"] == "2 device(s) visible"
    assert seen["cuda:0"] == ("NVIDIA H100 80GB HBM3, 79.6 GiB, compute capability 9.0, "
                              "bf16 native")
    assert seen["cuda:1"] == ("Tesla V100-SXM2-16GB, 15.9 GiB, compute capability 7.0, no "
                              "native bf16 (auto runs fp16 with loss scaling)")
    assert seen["precision"].startswith("train.precision=auto runs bf16 on cuda;")
    assert seen["run"] == ("configs/glue/mnli.yaml: microsoft/deberta-v3-base on cuda "
                           "(train.device=cuda) in bf16 (train.precision=auto)")
    # on the V100 the same config's auto is fp16 with loss scaling, not what the paper ran
    result = runner.invoke(app, ["doctor", "configs/glue/mnli.yaml", "train.device=cuda:1"])
    assert rows(result.output)["run"] == (
        "configs/glue/mnli.yaml: microsoft/deberta-v3-base on cuda:1 (train.device=cuda:1) "
        "in fp16 (train.precision=auto)")
    # a GPU index past the visible ones: the train command's own refusal
    result = runner.invoke(app, ["doctor", "configs/glue/mnli.yaml", "train.device=cuda:2"])
    assert result.exit_code == 2
    assert result.output.rstrip().splitlines()[-1] == (
        "error: train.device=cuda:2 but only 2 CUDA device(s) are visible; pick one of them")
