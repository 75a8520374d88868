"""``Stepper.build``: the optimizer, lr schedule and scaler the loop and the benchmarks step
with, checked against the config by hand; and the typed ``StepLog`` each step returns."""

from __future__ import annotations

import pytest
import torch

from adalora_cli.config import TrainConfig
from adalora_cli.engine.precision import Precision
from adalora_cli.engine.step import StepLog, Stepper
from adalora_cli.methods import apply_method
from adalora_cli.methods.allocator import StepReport
from tests.methods._tiny import LAYERS, run_config, tiny_batch, tiny_bert

T, T_INIT, T_FINAL, DELTA_T, BUDGET = 30, 5, 10, 3, 10
B0 = 6 * LAYERS * 4  # 6 adapted matrices per layer at the default r0 = 4


def tiny_stepper(seed: int = 0) -> Stepper:
    cfg = run_config("adalora", adalora={"budget": BUDGET, "t_init": T_INIT,
                                         "t_final": T_FINAL, "delta_t": DELTA_T})
    model = tiny_bert(seed)
    handle = apply_method(model, cfg, T)
    train = TrainConfig(learning_rate=0.01, warmup_steps=4, weight_decay=0.1, grad_accum=2,
                        max_grad_norm=0.5, precision="fp16")
    return Stepper.build(model, handle, train, T, Precision.of("fp16", torch.device("cpu")))


def test_build_follows_the_train_config():
    stepper = tiny_stepper()
    group = stepper.optimizer.param_groups[0]
    assert isinstance(stepper.optimizer, torch.optim.AdamW)
    assert group["weight_decay"] == 0.1 and group["initial_lr"] == 0.01
    assert {id(p) for p in group["params"]} == {id(p) for p in stepper.handle.trainable}
    assert (stepper.grad_accum, stepper.max_grad_norm) == (2, 0.5)
    # fp16 is for CUDA only: on the CPU no autocast and no loss scaling
    assert not stepper.scaler.is_enabled()
    with stepper.autocast():
        assert not torch.is_autocast_enabled()


def test_each_step_reports_its_lr_budget_and_mask_events():
    stepper = tiny_stepper()
    events = []
    for t in range(1, T + 1):
        stepper.backward_pieces([(tiny_batch(t), 1.0)])
        log = stepper.update(t)
        # warm-up 4 steps to 0.01, then linear decay to 0 at T (LambdaLR counts from 0)
        expected_lr = 0.01 * (t / 4 if t <= 4 else (T - (t - 1)) / (T - 4))
        assert log.lr == pytest.approx(expected_lr, rel=1e-12)
        if t <= T_INIT:
            assert log.budget == B0  # no pruning during the warm-up
        if t > T - T_FINAL:
            assert log.budget == BUDGET  # the final phase keeps b(T)
        if log.ranks is not None:
            events.append(t)
            assert sum(log.ranks.values()) == log.budget
    # masks every delta_t steps after t_init, then once when the final phase begins
    assert events == [6, 9, 12, 15, 18, T - T_FINAL + 1]


def test_step_log_from_a_methods_report():
    assert StepLog.of(1e-3, StepReport(12)) == StepLog(1e-3, 12, None)
    # an int, so metrics.jsonl says "budget": 12, never 12.0
    assert type(StepLog.of(1e-3, StepReport(12.0)).budget) is int
    assert StepLog.of(1e-3, StepReport(4, {"a": 3, "b": 1})) == \
        StepLog(1e-3, 4, {"a": 3, "b": 1})
    assert StepLog.of(2e-3, None) == StepLog(2e-3)


def test_on_cuda_the_step_is_fused_and_adds_eq4_in_closed_form_except_under_ddp(tmp_path):
    """Stepper.build's choices for a CUDA run (only the device's type is read here, so
    the CPU can build it): fused AdamW and the closed-form Eq. 4 gradient on one GPU; under
    DDP autograd's gradient (DDP's hooks expect every trained parameter's gradient inside
    the backward pass), still fused; the CPU keeps torch's default AdamW and autograd."""
    import torch.distributed as dist

    cfg = run_config("adalora", adalora={"budget": BUDGET, "t_init": T_INIT,
                                         "t_final": T_FINAL, "delta_t": DELTA_T})
    model = tiny_bert()
    handle = apply_method(model, cfg, T)
    train = TrainConfig(precision="fp32")
    built = {}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for name, wrapped, device in (("cpu", model, "cpu"), ("cuda", model, "cuda"),
                                      ("cuda-ddp", ddp, "cuda")):
            # fp32, built directly: Precision.of would ask this CPU-only torch about a GPU
            stepper = Stepper.build(wrapped, handle, train, T,
                                    Precision("fp32", torch.device(device)))
            built[name] = (stepper.closed_form_reg, stepper.optimizer.defaults["fused"])
    finally:
        dist.destroy_process_group()
    assert built == {"cpu": (False, None), "cuda": (True, True), "cuda-ddp": (False, True)}
