"""Muon (torch.optim.Muon on the hidden matrices, AdamW on the rest): state, Newton-Schulz FLOPs and temporaries as
PyTorch's own optimizer allocates and computes them, and refused where trainplan does not model it."""

from __future__ import annotations

import copy

import pytest

from trainplan.catalog import find_accelerator, get_catalog
from trainplan.errors import SpecError
from trainplan.estimate import architecture as arch_mod
from trainplan.estimate.compose import compose
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.result import RejectKind
from trainplan.estimate.steptime import gemm_efficiency
from trainplan.estimate.transformer import estimate_transformer, transformer_profile
from trainplan.spec import parse_job
from trainplan.strategies import Strategy

torch = pytest.importorskip("torch")

TINY = {"layers": 2, "hidden": 512, "heads": 8, "ffn_hidden": 1024, "vocab": 2048, "max_seq_len": 128}


def _job(model: object = None, **extra: object):
    return parse_job({"kind": "transformer", "model": model or TINY, "seq_len": 64, "micro_batch": 2, "steps": 5,
                      "optimizer": "muon", **extra})  # fmt: skip


@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (128, 128), (96, 40)])
def test_newton_schulz_flops_are_pytorchs_own_count(shape: tuple[int, int]) -> None:
    """The formula (4m²n + 2m³ a step, 5 steps) equals PyTorch's FLOP counter around torch.optim.Muon.step()."""
    from torch.utils.flop_counter import FlopCounterMode

    w = torch.nn.Parameter(torch.randn(*shape))
    w.grad = torch.randn(*shape)
    opt = torch.optim.Muon([w])
    with FlopCounterMode(display=False) as counter:
        opt.step()
    assert counter.get_total_flops() == arch_mod.newton_schulz_flops([(1, *shape)])


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.body = torch.nn.Linear(16, 24)
        self.norm = torch.nn.LayerNorm(24)
        self.head = torch.nn.Linear(24, 50, bias=False)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(torch.relu(self.body(self.embed(x)))))


def _loss(model: torch.nn.Module, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(step)
    x = torch.randint(0, 50, (4, 7), generator=gen)
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())


def test_muon_with_adamw_is_pytorchs_two_optimizers_side_by_side() -> None:
    """One optimizer object, the same updates as torch.optim.Muon (AdamW-matched RMS, one lr and weight decay) on the
    hidden matrix and torch.optim.AdamW on the rest (embedding, head, norm, biases); a scheduler's lr reaches both;
    state_dict round-trips mid-run."""
    from trainplan.estimate.trace.optimizers import make_optimizer, muon_split
    from trainplan.spec import Optimizer

    torch.manual_seed(0)
    a = _Tiny()
    b = copy.deepcopy(a)
    hidden, rest = muon_split(a, list(a.parameters()))
    assert [id(p) for p in hidden] == [id(a.body.weight)]  # embedding and head stay on AdamW
    opt = make_optimizer(a.parameters(), Optimizer.MUON, lr=0.01, model=a)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    ref_hidden, ref_rest = muon_split(b, list(b.parameters()))
    ref = [torch.optim.Muon(ref_hidden, lr=0.01, weight_decay=0.01, adjust_lr_fn="match_rms_adamw"),
           torch.optim.AdamW(ref_rest, lr=0.01, weight_decay=0.01)]
    ref_sched = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.5**s) for o in ref]
    for step in range(4):
        if step == 2:  # resume from a saved state into a new optimizer
            saved = copy.deepcopy(opt.state_dict())
            opt = make_optimizer(a.parameters(), Optimizer.MUON, lr=0.01, model=a)
            opt.load_state_dict(saved)
            for group, ref_group in zip(opt.param_groups, [g for o in ref for g in o.param_groups], strict=True):
                assert group["lr"] == ref_group["lr"]
        for model, opts in ((a, [opt]), (b, ref)):
            for o in opts:
                o.zero_grad()
            _loss(model, step).backward()
            for o in opts:
                o.step()
        if step < 2:
            sched.step()
            for s in ref_sched:
                s.step()
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(pa, pb)
    assert set(opt.state[a.body.weight]) == {"momentum_buffer"}
    assert set(opt.state[a.embed.weight]) >= {"exp_avg", "exp_avg_sq"}


@pytest.mark.parametrize("precision", ["bf16", "fp32", "bf16-pure"])
@pytest.mark.parametrize("tied", [True, False])
def test_analytic_muon_equals_the_traced_optimizer(precision: str, tied: bool) -> None:
    """The analytic count (one buffer on the block matrices, two moments on embeddings, head and vectors), the
    Newton-Schulz FLOPs and the step's temporaries equal what the real MuonWithAdamW allocates and computes when
    transformers' model is traced."""
    pytest.importorskip("transformers")
    from trainplan.estimate.torchjob import trace_transformer_job

    job = _job({**TINY, "tied_embeddings": tied}, precision=precision)
    cat = get_catalog()
    hw = hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=1)
    analytic, traced = transformer_profile(job, cat), trace_transformer_job(job)
    a, t = compose(job, analytic, hw, Strategy.SINGLE, cat), compose(job, traced, hw, Strategy.SINGLE, cat)
    assert a.memory.optimizer == t.memory.optimizer > 0
    assert analytic.params.optimizer_flops == traced.params.optimizer_flops > 0
    assert analytic.memory.optimizer_temporaries == traced.memory.optimizer_temporaries


def test_muon_keeps_less_state_than_adamw_and_spends_newton_schulz_time() -> None:
    """Llama-3.2-1B: 4 bytes × (Muon's matrices + 2 × the rest) against AdamW's 8 bytes a parameter; the optimizer's
    time grows by the Newton-Schulz FLOPs at the GEMM rate (the same on 1 or 8 DDP ranks: each steps every matrix)."""
    cat = get_catalog()
    muon, adamw = (parse_job({"kind": "transformer", "model": "llama-3.2-1b", "seq_len": 2048, "micro_batch": 4,
                              "global_batch": 64, "steps": 10, "optimizer": o, "activation_checkpointing": "full"})
                   for o in ("muon", "adamw"))  # fmt: skip
    profile = transformer_profile(muon, cat)
    total = profile.params.total
    hidden = arch_mod.muon_params(_arch("llama-3.2-1b"))
    assert 0 < hidden < total
    est = {}
    for name, job in (("muon", muon), ("adamw", adamw)):
        for gpus, strategy in ((1, Strategy.SINGLE), (8, Strategy.DDP)):
            hw = hardware_for_gpu(find_accelerator("H100-80GB"), cat, gpus=gpus)
            est[name, gpus] = estimate_transformer(job, hw, strategy, cat)
    assert est["muon", 1].memory.optimizer == pytest.approx(4.0 * (hidden + 2 * (total - hidden)))
    assert est["adamw", 1].memory.optimizer == pytest.approx(8.0 * total)
    flops = profile.params.optimizer_flops
    assert flops == arch_mod.newton_schulz_flops(arch_mod.muon_matrices(_arch("llama-3.2-1b")))
    h100 = find_accelerator("H100-80GB")
    ns_s = flops / (h100.peak_tflops("bf16") * 1e12 * gemm_efficiency(cat, h100.id))
    for gpus in (1, 8):
        muon_s, adamw_s = (est[o, gpus].time_breakdown["optimizer_s"] for o in ("muon", "adamw"))
        assert 0 < muon_s - ns_s < adamw_s  # the Newton-Schulz matmuls, plus fewer state bytes than AdamW streams
    assert est["muon", 8].time_breakdown["optimizer_s"] == pytest.approx(est["muon", 1].time_breakdown["optimizer_s"])


def _arch(name: str):
    from trainplan.catalog import resolve_model

    return resolve_model(name)


@pytest.mark.parametrize("strategy", [Strategy.FSDP, Strategy.ZERO1, Strategy.ZERO3_OFFLOAD])
def test_muon_on_sharded_strategies_is_rejected_with_the_reason(strategy: Strategy) -> None:
    cat = get_catalog()
    hw = hardware_for_gpu(find_accelerator("H100-80GB"), cat, gpus=8)
    e = estimate_transformer(_job(), hw, strategy, cat)
    assert e.rejection is not None and e.rejection.kind is RejectKind.PLATFORM
    assert "muon" in e.rejection.text and strategy.value in e.rejection.text


def test_muon_plan_keeps_only_whole_matrix_options() -> None:
    from trainplan.planner.core import plan_job

    plan = plan_job(_job(), hints=False)
    assert plan.options and {o.strategy for o in plan.options} <= {"single", "ddp"}


def test_muon_with_adapters_or_keras_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError) as err:
        transformer_profile(_job(method="lora", lora={"rank": 8}), get_catalog())
    assert err.value.field == "optimizer" and "method: full" in str(err.value)
    with pytest.raises(Exception, match="muon is modelled for PyTorch only"):
        parse_job({"kind": "keras", "model": "m:f", "inputs": [{"shape": [4]}], "micro_batch": 2, "steps": 1,
                   "loss": "mse", "optimizer": "muon"})  # fmt: skip




MLP = """
from torch import nn

def mlp():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
"""


def test_a_traced_torch_model_gets_muon_on_its_matrices(tmp_path, monkeypatch) -> None:
    """kind: torch — the trace builds the real optimizer: one fp32 buffer per weight matrix, AdamW's two per bias,
    and the Newton-Schulz FLOPs of the three matrices; it costs time on the GPU and the CPU alike."""
    from trainplan.estimate.hardware import hardware_for_cpus
    from trainplan.estimate.torchjob import estimate_traced, trace_torch_job

    (tmp_path / "tp_muon_models.py").write_text(MLP)
    monkeypatch.syspath_prepend(str(tmp_path))
    job = parse_job({"kind": "torch", "model": "tp_muon_models:mlp", "inputs": [{"shape": [64]}], "micro_batch": 16,
                     "steps": 10, "optimizer": "muon", "precision": "fp32"})  # fmt: skip
    traced = trace_torch_job(job)
    shapes = [(256, 64), (256, 256), (8, 256)]
    assert traced.params.optimizer_flops == arch_mod.newton_schulz_flops([(1, r, c) for r, c in shapes])
    cat = get_catalog()
    gpu = estimate_traced(job, traced, hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=1), Strategy.SINGLE, cat)
    matrices, biases = sum(r * c for r, c in shapes), sum(r for r, _ in shapes)
    assert gpu.memory.optimizer == pytest.approx(4 * (matrices + 2 * biases), abs=4096)  # + AdamW's step counters
    cpu = estimate_traced(job, traced, hardware_for_cpus(8, cat), Strategy.SINGLE, cat)
    for e in (gpu, cpu):
        assert e.rejection is None and e.time_breakdown["optimizer_s"] > 0


def test_a_moe_keeps_its_3d_experts_on_adamw(tmp_path) -> None:
    """Qwen3-MoE as transformers 5 builds it: the router, attention and dense layers are 2-D (Muon); each routed
    expert projection is one 3-D tensor, which torch.optim.Muon does not take (AdamW) — analytic equals traced."""
    pytest.importorskip("transformers")
    import json

    from trainplan.estimate.torchjob import trace_transformer_job
    from trainplan.hfconfig import arch_from_hf_config

    # every tensor a multiple of 256 bf16 elements, so the trace's 512-byte allocator blocks round nothing
    config = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256,
              "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 512, "max_position_embeddings": 128}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    job = _job(str(tmp_path / "config.json"), precision="bf16-pure")  # grouped experts trace in bf16
    cat = get_catalog()
    analytic, traced = transformer_profile(job, cat), trace_transformer_job(job)
    arch = arch_from_hf_config(config)
    experts = sum(e * i * o for e, i, o in arch_mod.expert_tensor_shapes(arch).values()) * arch.moe_layers
    muon = arch_mod.muon_params(arch)
    assert 0 < experts <= analytic.params.total - muon  # the experts are on AdamW's side
    assert analytic.params.shaped_state_elems == traced.params.shaped_state_elems
    assert analytic.params.optimizer_flops == traced.params.optimizer_flops > 0


def test_a_muon_job_that_fits_nowhere_says_what_sharding_would_need() -> None:
    from trainplan.errors import InfeasibleError
    from trainplan.planner.core import plan_job, require_options

    job = parse_job({"kind": "transformer", "model": "llama-2-70b", "seq_len": 4096, "micro_batch": 1, "steps": 10,
                     "optimizer": "muon", "activation_checkpointing": "full"})  # fmt: skip
    with pytest.raises(InfeasibleError, match="muon is planned with single and ddp only; optimizer: adamw") as err:
        require_options(plan_job(job, hints=False), job)
    assert err.value.field == "constraints" and "\n" not in str(err.value)


def test_muon_on_a_pytorch_without_it_is_one_line(monkeypatch) -> None:
    """trainplan's torch extra accepts PyTorch 2.4; torch.optim.Muon arrived in 2.9: run and trace say so."""
    from trainplan.estimate.trace.optimizers import make_optimizer
    from trainplan.run.workloads.checks import check_optimizer
    from trainplan.spec import Optimizer

    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(SpecError, match=r"PyTorch >= 2.9") as err:
        check_optimizer(Optimizer.MUON)
    assert err.value.field == "optimizer"
    with pytest.raises(ValueError, match=r"PyTorch >= 2.9"):
        make_optimizer(torch.nn.Linear(2, 2).parameters(), Optimizer.MUON, model=torch.nn.Linear(2, 2))
