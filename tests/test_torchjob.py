"""`kind: torch` jobs and `--trace`: the traced model goes through the same planner, sharding rules and CLI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from trainplan.catalog import find_accelerator, get_catalog, resolve_model  # noqa: E402
from trainplan.cli.main import main  # noqa: E402
from trainplan.estimate import architecture as arch_mod  # noqa: E402
from trainplan.estimate.compute import training_step_flops  # noqa: E402
from trainplan.estimate.memory import GIB  # noqa: E402
from trainplan.estimate.torchjob import estimate_traced, hf_config_for, trace_torch_job  # noqa: E402
from trainplan.planner.candidates import hardware_for_gpu  # noqa: E402
from trainplan.spec import Checkpointing, parse_job  # noqa: E402
from trainplan.strategies import Strategy  # noqa: E402

FACTORIES = '''
import torch
from torch import nn

def mlp(width=64, depth=2):
    layers = [nn.Linear(32, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 4))

def broken():
    raise RuntimeError("out of ideas")

class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 4)
    def forward(self, x):
        if x.sum() > 0:
            return self.a(x)
        return -self.a(x)

def branchy():
    return Branchy()
'''


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "tp_models.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))
    return tmp_path


def _job_file(tmp_path: Path, model: str = "tp_models:mlp", shape: str = "[32]", extra: str = "") -> Path:
    p = tmp_path / "job.yaml"
    args = "{width: 64}" if model.endswith(":mlp") else "{}"
    p.write_text(textwrap.dedent(f"""\
        kind: torch
        model: {model}
        model_args: {args}
        inputs: [{{shape: {shape}, dtype: float32}}]
        loss: mean
        micro_batch: 8
        precision: bf16
        optimizer: adamw
        steps: 100
        """) + extra)  # fmt: skip
    return p


def _run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_torch_job_estimate_json_reports_traced_params_and_flops(pkg: Path, capsys) -> None:
    code, out, err = _run(capsys, "estimate", _job_file(pkg), "--gpu", "A100-80GB", "--json")
    assert code == 0, err
    d = json.loads(out)
    expected_params = 32 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4
    assert d["params"] == expected_params and d["trainable_params"] == expected_params
    # forward of a Linear stack: 2·m·n·k per layer; backward twice that (input and weight gradients)
    fwd = 2 * 8 * (32 * 64 + 64 * 64 + 64 * 4)
    assert d["trace"]["flops_forward"] == pytest.approx(fwd, rel=0.01)
    # the first layer's input needs no gradient: backward = 2 × forward − its input-gradient matmul
    assert d["trace"]["flops_backward"] == pytest.approx(2 * fwd - 2 * 8 * 32 * 64, rel=0.01)
    assert d["fits"] is True and d["trace"]["peak_phase"] in ("forward", "backward", "optimizer")


def test_torch_job_plans_over_the_catalog(pkg: Path, capsys) -> None:
    code, out, err = _run(capsys, "plan", _job_file(pkg), "--json", "--top", "3")
    assert code == 0, err
    d = json.loads(out)
    assert d["options"] and all(o["fits"] for o in d["options"])
    assert all(o["samples_per_s"] > 0 for o in d["options"])


@pytest.mark.parametrize(
    ("model", "shape", "needle"),
    [
        ("tp_models_missing:mlp", "[32]", "tp_models_missing"),  # does not import
        ("tp_models:nothing_here", "[32]", "nothing_here"),  # no such factory
        ("tp_models:broken", "[32]", "out of ideas"),  # factory raises
        ("tp_models:mlp", "[31]", "model"),  # batch does not match the model
        ("tp_models:branchy", "[32]", "data-dependent"),  # cannot be traced
    ],
)
def test_bad_torch_jobs_get_one_error_line(pkg: Path, capsys, model: str, shape: str, needle: str) -> None:
    code, out, err = _run(capsys, "estimate", _job_file(pkg, model, shape), "--gpu", "A100-80GB")
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert needle in lines[0], lines[0]


def test_trace_of_an_unmapped_architecture_offers_the_analytic_path(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path))
    p = tmp_path / "bert.yaml"
    p.write_text("kind: transformer\nmodel: bert-base\nseq_len: 128\nmicro_batch: 8\nsteps: 10\n")
    code, out, err = _run(capsys, "estimate", p, "--gpu", "A100-80GB", "--trace")
    assert code == 2
    assert "analytic" in err and len(err.strip().splitlines()) == 1


def test_sharding_rules_apply_to_the_trace(pkg: Path) -> None:
    job = parse_job({"kind": "torch", "model": "tp_models:mlp", "model_args": {"width": 512, "depth": 4},
                     "inputs": [{"shape": [32]}], "micro_batch": 8, "steps": 10})  # fmt: skip
    traced = trace_torch_job(job)
    cat = get_catalog()
    acc = find_accelerator("A100-80GB")
    one = estimate_traced(job, traced, hardware_for_gpu(acc, cat, gpus=1), Strategy.SINGLE, cat)
    z3 = estimate_traced(job, traced, hardware_for_gpu(acc, cat, gpus=8), Strategy.ZERO3, cat)
    # DeepSpeed ZeRO-3 over 8: 16 bytes/param / 8 for model states (ZeRO paper), vs AMP's 4 + 8 (+4 grads at the step)
    # (the trace rounds each tensor to the CUDA allocator's 512 bytes, hence rel=1e-3)
    assert z3.memory.weights == pytest.approx(2 * traced.trainable_params / 8, rel=1e-3)
    assert z3.memory.optimizer == pytest.approx(12 * traced.trainable_params / 8, rel=1e-3)
    assert one.memory.weights == pytest.approx(4 * traced.trainable_params, rel=0.01)


@pytest.mark.parametrize("preset", ["gpt2", "tinyllama-1.1b", "llama-2-7b"])
def test_traced_params_and_flops_agree_with_the_formulas(preset: str) -> None:
    """The two paths count the same model: parameters exactly, forward FLOPs within 5% (docs/trace.md)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from trainplan.estimate.trace import build_hf_causal_lm, trace_training_step

    arch = resolve_model(preset)
    cfg = hf_config_for(arch)
    seq = 256

    def batch(mb: int):
        return [torch.randint(0, arch.vocab, (mb, seq))]

    def loss(out, inputs):
        return F.cross_entropy(out.logits.float().reshape(-1, arch.vocab), inputs[0].reshape(-1))

    r = trace_training_step(lambda: build_hf_causal_lm(cfg), batch, micro_batch=1, loss=loss)
    counts = arch_mod.param_counts(arch)
    assert r.params == counts.total
    f = training_step_flops(
        tokens=seq, matmul_params=counts.matmul_per_token, trainable_matmul_params=counts.matmul_per_token,
        adapter_params=0, layers=arch.layers, seq_len=seq, attn_dim=arch_mod.attention_inner_dim(arch),
        checkpointing=Checkpointing.NONE, lm_head_params=arch.vocab * arch.hidden,
    )  # fmt: skip
    assert r.flops_forward == pytest.approx(f.model / 3, rel=0.05)
    assert r.flops_backward == pytest.approx(2 * f.model / 3, rel=0.05)
    assert r.peak_bytes > 0 and r.peak_bytes < 200 * GIB
