"""trainplan.runtime in this process: accumulation, optimizer rebuilding, SIGTERM, checkpoints."""

from __future__ import annotations

import copy
import os
import signal

import pytest
import torch

from trainplan import runtime
from trainplan.run.config import RunConfig
from trainplan.run.metrics import read_metrics
from trainplan.run.runtime.process import ProcessInfo
from trainplan.run.runtime.telemetry import FaultInjection
from trainplan.run.runtime.wrapping import param_names, rebuild_optimizer


@pytest.fixture
def restore_sigterm():
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def _config(tmp_path, **changes) -> RunConfig:
    base = dict(
        job={"kind": "torch"}, out_dir=str(tmp_path / "run"), strategy="single", world_size=1, accelerator="cpu",
        threads_per_process=torch.get_num_threads(), total_steps=6, grad_accum=1, micro_batch=4, global_batch=4,
    )
    return RunConfig(**{**base, **changes})


def _train(ctx: runtime.Context, model: torch.nn.Module, x: torch.Tensor) -> list[bool]:
    model, _ = ctx.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
    stepped = []
    for chunk in x.chunk(ctx.grad_accum):
        ctx.backward(model(chunk).pow(2).mean())
        stepped.append(ctx.step())
    return stepped


def test_gradient_accumulation_matches_one_big_batch(tmp_path, restore_sigterm) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x = torch.randn(8, 4)
    one, two = copy.deepcopy(model), copy.deepcopy(model)
    assert _train(runtime.init(_config(tmp_path / "a", grad_accum=1)), one, x) == [True]
    assert _train(runtime.init(_config(tmp_path / "b", grad_accum=2)), two, x) == [False, True]
    for p, q in zip(one.parameters(), two.parameters()):
        torch.testing.assert_close(p, q)


def test_bare_init_is_a_single_local_process(monkeypatch, restore_sigterm) -> None:
    monkeypatch.delenv("TRAINPLAN_RUN_CONFIG", raising=False)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    ctx = runtime.init()
    assert (ctx.rank, ctx.world_size, ctx.strategy, ctx.is_main) == (0, 1, "single", True)
    model = torch.nn.Linear(2, 2)
    wrapped, opt = ctx.wrap(model, lambda params: torch.optim.AdamW(params, lr=1e-3))
    assert wrapped is model and isinstance(opt, torch.optim.AdamW)
    assert ctx.resume() == 0 and ctx.end_of_step(1, loss=1.0) is False  # no run directory: nothing written
    assert ctx.finish() is None


def test_optimizer_rebuilt_over_new_parameters_keeps_groups() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.AdamW(
        [{"params": model[0].parameters(), "weight_decay": 0.0}, {"params": model[1].parameters()}], lr=0.01, weight_decay=0.1
    )
    names = param_names(model)
    replica = copy.deepcopy(model)  # stands in for a model whose parameters were replaced by sharding
    new = rebuild_optimizer(opt, names, replica)
    assert [g["weight_decay"] for g in new.param_groups] == [0.0, 0.1]
    assert all(p1 is p2 for p1, p2 in zip(new.param_groups[0]["params"], replica[0].parameters()))


def _dropout_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))


def test_sigterm_checkpoints_and_resume_restores_everything(tmp_path, restore_sigterm) -> None:
    cfg = _config(tmp_path, checkpoint_every=4)
    ctx = runtime.init(cfg)
    torch.manual_seed(0)
    model, _ = ctx.wrap(_dropout_model(), lambda p: torch.optim.AdamW(p, lr=0.01))
    assert ctx.resume() == 0
    stopped_at = None
    for step in range(cfg.total_steps):
        ctx.backward(model(torch.ones(2, 4)).sum())
        ctx.step()
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag
        if ctx.end_of_step(step + 1, loss=float(step), samples=4):
            stopped_at = step + 1
            break
    assert stopped_at == 2
    after_stop = torch.rand(3)  # what the RNG gives next; a resume must give it again
    result = ctx.finish(status="preempted", workload={"samples_per_step": 4})
    assert result is not None and result["status"] == "preempted" and result["steps"] == 2
    events = [r["event"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "event" in r]
    assert events == ["start", "checkpoint", "preempted"]

    again = runtime.init(cfg)
    model2, _ = again.wrap(_dropout_model(), lambda p: torch.optim.AdamW(p, lr=0.01))
    assert again.resume() == 2
    for p, q in zip(model.parameters(), model2.parameters()):
        torch.testing.assert_close(p, q)
    assert torch.equal(torch.rand(3), after_stop)


def test_fault_injection_is_read_once_at_start_up(tmp_path, monkeypatch, restore_sigterm) -> None:
    monkeypatch.setenv(runtime.FAULT_STEP_ENV, "soon")
    with pytest.raises(ValueError, match=runtime.FAULT_STEP_ENV):  # a bad switch fails at start-up, not mid-run
        runtime.init(_config(tmp_path))
    monkeypatch.delenv(runtime.FAULT_STEP_ENV)
    ctx = runtime.init(_config(tmp_path))
    monkeypatch.setenv(runtime.FAULT_STEP_ENV, "soon")  # after start-up: never read again
    model, _ = ctx.wrap(torch.nn.Linear(2, 1), lambda p: torch.optim.SGD(p, lr=0.1))
    assert ctx.resume() == 0
    for step in range(2):
        ctx.backward(model(torch.ones(1, 2)).sum())
        ctx.step()
        assert ctx.end_of_step(step + 1, loss=1.0) is False
    assert ctx.finish()["steps"] == 2


def test_fault_injection_strikes_one_rank_at_one_step_on_the_first_attempt() -> None:
    fault = FaultInjection.from_env({runtime.FAULT_STEP_ENV: "6", runtime.FAULT_RANK_ENV: "1"})
    assert fault.due(6, rank=1, restart_count=0)
    assert not fault.due(5, rank=1, restart_count=0) and not fault.due(6, rank=0, restart_count=0)
    assert not fault.due(6, rank=1, restart_count=1)  # the restarted group runs on
    assert FaultInjection.from_env({}) == FaultInjection(at_step=None, rank=0)
    assert not FaultInjection.from_env({runtime.FAULT_STEP_ENV: ""}).due(0, rank=0, restart_count=0)


def test_process_facts_come_from_the_launcher_environment() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "2"}
    assert ProcessInfo.from_env(env) == ProcessInfo(rank=3, world_size=4, local_rank=1, restart_count=2)
    agent = ProcessInfo.from_env({**env, "TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "h", "MASTER_PORT": "29500"})
    assert agent.agent_store == ("h", 29500)
    assert ProcessInfo.from_env({}) == ProcessInfo()
    with pytest.raises(ValueError, match=r"\$WORLD_SIZE"):
        ProcessInfo.from_env({"WORLD_SIZE": "two"})
