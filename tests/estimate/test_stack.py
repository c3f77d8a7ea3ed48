"""Stack-aware memory: a job names the stack that trains it; the stack's defaults and explicit knobs change
what the estimate counts, each by a mechanism with its source (catalog/data/stacks.yaml, memory.py)."""

from __future__ import annotations

import pytest

from trainplan.catalog import find_accelerator, get_catalog
from trainplan.errors import SpecError
from trainplan.estimate.compose import compose
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.memory import GIB, logits_bytes
from trainplan.estimate.result import RejectKind
from trainplan.estimate.stack import LORA_IMPLEMENTATIONS, effective_knobs
from trainplan.estimate.transformer import transformer_profile
from trainplan.spec import LossImpl, Precision, Stack, parse_job
from trainplan.strategies import Strategy

BASE = {"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": 2, "steps": 10}


def _job(**extra):
    return parse_job({**BASE, **extra})


def _hw(gpu: str = "A100-80GB", gpus: int = 1):
    cat = get_catalog()
    return hardware_for_gpu(find_accelerator(gpu), cat, gpus=gpus)


def test_every_stack_has_sourced_defaults() -> None:
    cat = get_catalog()
    assert set(cat.stacks) == {s.value for s in Stack}
    for name, entry in cat.stacks.items():
        assert entry["sources"] and entry["as_of"], name
        for knob in entry["sources"]:
            assert knob in entry["knobs"] or knob in entry, (name, knob)  # a knob, or a field of the stack (engines …)
        assert entry.get("lora_implementation", "own") in LORA_IMPLEMENTATIONS, name
        if entry.get("attention_expands_kv") or entry.get("lora_implementation") == "torchtune":
            assert {"attention_expands_kv", "lora_implementation"} <= set(entry["sources"]), name


def test_stack_defaults_and_explicit_knobs_that_win() -> None:
    cat = get_catalog()
    tt = effective_knobs(_job(stack="torchtune"), cat)
    assert tt.loss is LossImpl.CHUNKED and tt.loss_chunks == 8 and tt.fused_optimizer and not tt.notes
    lit = effective_knobs(_job(stack="litgpt"), cat)
    assert lit.loss is LossImpl.CHUNKED and lit.loss_chunks == 2048 // 128
    over = effective_knobs(_job(stack="llm-foundry", knobs={"loss": "full", "compile": True}), cat)
    assert over.loss is LossImpl.FULL and over.compile
    assert "knobs.loss: full overrides llm-foundry's default (fused)" in over.notes
    assert any(n.startswith("knobs.compile: True overrides") for n in over.notes)


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"stack": "torchtun"}, "stack", "did you mean 'torchtune'"),
        ({"knobs": {"compil": True}}, "knobs.compil", "did you mean 'compile'"),
        ({"knobs": {"loss": "fusd"}}, "knobs.loss", "did you mean 'fused'"),
    ],
)
def test_unknown_stacks_and_knobs_get_one_clear_line(data, field, words) -> None:
    with pytest.raises(SpecError) as err:
        _job(**data)
    assert err.value.field == field and words in str(err.value) and "\n" not in str(err.value)


def test_knobs_that_cannot_hold_together_are_refused() -> None:
    cat = get_catalog()
    with pytest.raises(SpecError, match="optimizer: adam8bit") as err:
        effective_knobs(_job(knobs={"paged_optimizer": True}), cat)
    assert err.value.field == "knobs.paged_optimizer"
    torch_job = parse_job({"kind": "torch", "model": "m:f", "inputs": [{"shape": [4]}], "micro_batch": 2, "steps": 1,
                           "knobs": {"loss": "chunked"}})  # fmt: skip
    with pytest.raises(SpecError) as err2:
        effective_knobs(torch_job, cat)
    assert err2.value.field == "knobs.loss"


def test_loss_bytes_per_logit_by_implementation() -> None:
    kw = dict(seq_len=1024, micro_batch=2, vocab=32000, precision=Precision.BF16, hidden=4096)
    logits = 1024 * 2 * 32000
    # backward start: the saved fp32 log-softmax, nll_loss's dense fp32 gradient and log-softmax's fp32 gradient
    assert logits_bytes(**kw) == logits * 12
    assert logits_bytes(**kw, loss=LossImpl.CHUNKED, chunks=8) == pytest.approx(logits * (2 + 4 + 0.5))
    assert logits_bytes(**kw, loss=LossImpl.FUSED) == 2048 * (32000 * 2 + 4)
    assert logits_bytes(**kw, loss=LossImpl.FUSED_LINEAR) == 2048 * (4096 * 2 + 4)


def test_the_stack_changes_the_peak_through_its_loss() -> None:
    cat = get_catalog()
    hw = _hw()
    # the same frozen base in both (llm-foundry's amp_bf16 would keep it in fp32: a separate mechanism)
    job, fjob = _job(method="lora"), _job(method="lora", stack="llm-foundry", knobs={"frozen_weights_fp32": False})
    plain = compose(job, transformer_profile(job, cat), hw, Strategy.SINGLE, cat)
    foundry = compose(fjob, transformer_profile(fjob, cat), hw, Strategy.SINGLE, cat)
    # plain cross-entropy peaks at 12 B per logit (fp32 log-softmax + its two fp32 gradients at the start of backward);
    # the fused kernel keeps the 16-bit logits and an fp32 lse per token
    saved = 2048 * 2 * (32000 * (12 - 2) - 4)
    assert plain.memory.phase == foundry.memory.phase == "forward"
    assert plain.memory.activations - foundry.memory.activations == pytest.approx(saved)
    assert plain.memory.peak - foundry.memory.peak == pytest.approx(saved * (1 + cat.assumption("allocator_fragmentation")))


def test_compile_keeps_fewer_activations() -> None:
    cat = get_catalog()
    eager = transformer_profile(_job(), cat).memory.activations
    compiled = transformer_profile(_job(knobs={"compile": True, "compile_loss": True}), cat).memory.activations
    tokens, h, f, layers = 4096, 4096, 11008, 32
    # per block: two RMSNorms lose their fp32 copy (4 bytes × h each), the SwiGLU keeps 2 of its 4 f-wide tensors,
    # and the output projection's contiguous copy of the SDPA output is recomputed (2 bytes × h)
    per_block = tokens * (2 * 4 * h + 2 * 2 * f + 2 * h)
    head = tokens * 4 * h  # the final norm's fp32 copy
    # the compiled loss keeps the bf16 logits and an fp32 lse; the fp32 up-cast is transient and no fp32 log-softmax
    # and gradients meet at the start of backward (12 -> 6 bytes/logit)
    head += tokens * 32000 * (12 - 6) - tokens * 4
    assert eager - compiled == pytest.approx(layers * per_block + head, rel=1e-6)


def test_optimizer_in_backward_frees_gradients_and_cannot_accumulate() -> None:
    cat = get_catalog()
    hw = _hw()
    # short sequences: the optimizer step, not the forward pass, holds the peak
    job = _job(knobs={"optimizer_in_backward": True}, precision="bf16-pure", seq_len=256)
    e = compose(job, transformer_profile(job, cat), hw, Strategy.SINGLE, cat)
    base = _job(precision="bf16-pure", seq_len=256)
    plain = compose(base, transformer_profile(base, cat), hw, Strategy.SINGLE, cat)
    assert plain.memory.phase != "forward"
    # at the optimizer moment only the largest weight's gradient exists (the embedding, 32000 × 4096 in bf16), where
    # without it every bf16 gradient does
    whole = 2 * transformer_profile(_job(precision="bf16-pure"), cat).params.trainable
    assert e.memory.gradients <= 2 * 32000 * 4096 < whole
    assert e.memory.peak < plain.memory.peak - 10 * GIB
    acc = _job(knobs={"optimizer_in_backward": True}, global_batch=8)
    r = compose(acc, transformer_profile(acc, cat), hw, Strategy.SINGLE, cat).rejection
    assert r.kind is RejectKind.BATCH and "cannot accumulate" in r.text


def test_activation_offloading_moves_activations_to_the_host() -> None:
    cat = get_catalog()
    hw = _hw()
    on, off = _job(method="lora", knobs={"activation_offloading": True}), _job(method="lora")
    a = compose(on, transformer_profile(on, cat), hw, Strategy.SINGLE, cat)
    b = compose(off, transformer_profile(off, cat), hw, Strategy.SINGLE, cat)
    moved = transformer_profile(on, cat).memory.host_activations
    assert moved > 0 and a.memory.host >= moved
    assert b.memory.activations - a.memory.activations == pytest.approx(moved)
    # the device keeps two of the 32 blocks in flight
    from trainplan.estimate.transformer import block_activation_bytes
    from trainplan.catalog import resolve_model

    assert moved == pytest.approx(block_activation_bytes(off, resolve_model("llama-2-7b"), effective_knobs(off, cat)) * 30 / 32)


def test_paged_8bit_state_is_counted_on_the_host() -> None:
    cat = get_catalog()
    job = _job(optimizer="adam8bit", knobs={"paged_optimizer": True})
    e = compose(job, transformer_profile(job, cat), _hw(), Strategy.SINGLE, cat)
    assert e.memory.optimizer == 0 and e.memory.host >= 2 * 6.7e9


def test_a_stack_runs_only_its_engines() -> None:
    cat = get_catalog()
    job = _job(stack="torchtune")
    prof = transformer_profile(job, cat)
    hw = _hw(gpus=8)
    ds = compose(job, prof, hw, Strategy.ZERO2, cat)
    assert ds.rejection.kind is RejectKind.PLATFORM and "torchtune" in ds.reason
    assert compose(job, prof, hw, Strategy.FSDP, cat).rejection is None


def test_qlora_counts_the_dequantised_weight_buffer() -> None:
    cat = get_catalog()
    q = transformer_profile(_job(method="qlora"), cat)
    assert q.memory.forward_temporaries == 2 * 4096 * 11008  # the largest 4-bit matrix (an MLP projection), in bf16
    assert transformer_profile(_job(method="lora"), cat).memory.forward_temporaries == 0


def test_published_verdicts_use_the_record_stack() -> None:
    """llm-foundry's tables are llm-foundry runs (fused cross-entropy): a run at its largest micro-batch fits."""
    from pathlib import Path

    import yaml

    from trainplan.estimate.published import compare

    records = yaml.safe_load((Path(__file__).resolve().parents[1] / "data" / "published_llm.yaml").read_text())
    rec = next(r for r in records if r["id"] == "llmfoundry-h100-80gb-mpt1b-s2048-g64-mb20")
    assert compare(rec).predicted_fits is True
    assert compare({**rec, "stack": "plain"}).predicted_fits is False


def test_thunders_benchmark_script_takes_its_loss_over_the_whole_logits() -> None:
    """lightning-thunder's benchmark_litgpt.py trains LitGPT's model with its own loop: F.cross_entropy over the whole
    16-bit logits, outside the compiled model — not LitGPT's chunked loss. Its records are read so, and the loss then
    costs more than LitGPT's (the same record as a LitGPT run keeps less)."""
    from trainplan.estimate.published import compare, framework_knobs

    rec = {"id": "thunder-x", "framework": "lightning-thunder benchmark_litgpt.py (LitGPT model code)", "stack": "litgpt",
           "model": "llama-2-7b", "method": "full", "hardware": {"accelerator": "H100-80GB", "gpus_per_node": 8, "nodes": 1},
           "strategy": "fsdp", "precision": "bf16-pure", "seq_len": 4096, "micro_batch": 1,
           "activation_checkpointing": "full", "knobs": {"compile": True}, "measured": {"peak_memory_gib": 40}}  # fmt: skip
    assert framework_knobs(rec) == {"loss": "full", "loss_upcast": False, "compile_loss": False}
    eager = {**rec, "knobs": {}}
    assert framework_knobs(eager) == {"loss": "full", "loss_upcast": False}  # no compile: nothing to say about it
    litgpt_loop = {**rec, "framework": "LitGPT pretrain"}
    assert framework_knobs(litgpt_loop) == {}
    logits = 4096 * 32000
    assert compare(rec).predicted_peak_gib - compare(litgpt_loop).predicted_peak_gib > 2 * logits / 2**30


def test_the_trace_honours_the_knobs_it_can_run() -> None:
    """A chunked loss is traced as chunks (fewer fp32 logits kept); a fused optimizer makes no foreach buffers;
    what is not eager PyTorch (a fused loss kernel, compile) is named as not traced."""
    pytest.importorskip("transformers")
    from trainplan.estimate.torchjob import trace_transformer_job

    arch = {"layers": 2, "hidden": 256, "heads": 4, "ffn_hidden": 688, "vocab": 32000, "max_seq_len": 1024}
    base = {"kind": "transformer", "model": arch, "seq_len": 1024, "micro_batch": 4, "steps": 1}
    plain = trace_transformer_job(parse_job(base))
    tune = trace_transformer_job(parse_job({**base, "stack": "torchtune"}))
    logits = 4 * 1024 * 32000
    # at least the fp32 up-cast of 7 of the 8 chunks is gone (4 bytes per logit each)
    assert plain.memory.activations - tune.memory.activations >= 4 * logits * 7 / 8
    assert plain.memory.optimizer_temporaries > 0 and tune.memory.optimizer_temporaries == 0
    foundry = trace_transformer_job(parse_job({**base, "stack": "llm-foundry"}))
    assert any("not traced" in n and "fused" in n for n in foundry.notes)
    assert foundry.memory.activations == pytest.approx(plain.memory.activations)


def test_a_mixed_precision_plugin_keeps_the_frozen_base_in_fp32_and_its_casts() -> None:
    """Lightning/LitGPT '*-mixed' keep the LoRA base in fp32 (stacks.yaml frozen_weights_fp32); '*-true' is bf16-pure."""
    from trainplan.estimate import architecture as arch_mod
    from trainplan.estimate.transformer import resolve_transformer

    cat = get_catalog()
    mixed, true = _job(method="lora", stack="litgpt", precision="bf16"), _job(method="lora", stack="litgpt", precision="bf16-pure")
    m, t = resolve_transformer(mixed, cat), resolve_transformer(true, cat)
    assert m.frozen_bytes == 2 * t.frozen_bytes == 4 * m.total == m.frozen_fp32_bytes
    pm, pt = transformer_profile(mixed, cat), transformer_profile(true, cat)
    arch = m.arch
    casts = 2 * (m.counts.block_linear + arch.vocab * arch.hidden) + 2 * m.adapter_params
    assert pm.memory.autocast_copies == casts and pt.memory.autocast_copies == 0
    # plain (trainplan run) loads a GPU LoRA base in 16 bits: no fp32 copy, no casts
    plain = resolve_transformer(_job(method="lora", precision="bf16"), cat)
    assert plain.frozen_bytes == t.frozen_bytes and plain.frozen_fp32_bytes == 0
    # the knob overrides the stack, and a DeepSpeed engine casts the module to bf16 whatever the stack keeps
    off = resolve_transformer(_job(method="lora", stack="litgpt", precision="bf16", knobs={"frozen_weights_fp32": False}), cat)
    assert off.frozen_bytes == t.frozen_bytes
    hw = _hw(gpus=2)
    acc = _job(method="lora", stack="accelerate", precision="bf16")
    z3 = compose(acc, transformer_profile(acc, cat), hw, Strategy.ZERO3, cat)
    assert z3.memory.weights == pytest.approx(m.total * 2 / 2 + 2 * m.adapter_params / 2, rel=0.01)
    assert arch_mod.lora_params(arch, acc.lora_spec) == m.adapter_params


def test_litgpt_computes_its_loss_in_the_logits_dtype_and_fused_kernels_bring_their_loss() -> None:
    cat = get_catalog()
    k = effective_knobs(_job(stack="litgpt"), cat)
    assert not k.loss_upcast and k.loss is LossImpl.CHUNKED
    assert effective_knobs(_job(), cat).loss_upcast
    liger = effective_knobs(_job(stack="hf-trainer", knobs={"fused_kernels": "liger"}), cat)
    unsloth = effective_knobs(_job(stack="hf-trainer", knobs={"fused_kernels": "unsloth"}), cat)
    assert liger.loss is LossImpl.FUSED_LINEAR and unsloth.loss is LossImpl.FUSED
    assert effective_knobs(_job(knobs={"fused_kernels": "liger", "loss": "chunked"}), cat).loss is LossImpl.CHUNKED
    # pure bf16, LitGPT: the loss costs e·(2 + 2/chunks) per logit instead of the up-cast path's 2 + 4 + 4/chunks
    pure = _job(stack="litgpt", precision="bf16-pure", method="lora")
    up = _job(stack="litgpt", precision="bf16-pure", method="lora", knobs={"loss_upcast": True})
    assert transformer_profile(up, cat).memory.activations > transformer_profile(pure, cat).memory.activations
    with pytest.raises(SpecError, match="knobs.fused_kernels"):
        effective_knobs(parse_job({"kind": "torch", "model": "torchvision.models:resnet18", "inputs": [{"shape": [3, 32, 32]}],
                                   "loss": "cross_entropy", "micro_batch": 2, "steps": 1, "knobs": {"fused_kernels": "liger"}}), cat)


def test_alibi_models_attend_eagerly_under_auto_and_old_records_too() -> None:
    """BLOOM / MPT have no SDPA path in transformers; a record that ran transformers < 4.36 attended eagerly."""
    from trainplan.estimate.published import record_flash_attention

    cat = get_catalog()
    bloom = {**BASE, "model": "bloomz-7b1", "seq_len": 1024, "micro_batch": 1}
    auto = transformer_profile(parse_job(bloom), cat).memory.activations
    eager = transformer_profile(parse_job({**bloom, "flash_attention": "false"}), cat).memory.activations
    fused = transformer_profile(parse_job({**bloom, "flash_attention": "true"}), cat).memory.activations
    assert auto == eager > fused
    llama = transformer_profile(_job(), cat).memory.activations
    assert llama < transformer_profile(_job(flash_attention="false"), cat).memory.activations  # RoPE: SDPA under auto
    assert record_flash_attention({"framework": "Fabric 2.0.2 + transformers 4.28.1"}) is False
    assert record_flash_attention({"framework": "TRL, transformers 4.40.0"}) is None
    assert record_flash_attention({"framework": "HF Seq2SeqTrainer (transformers, Feb 2023)"}) is False
    assert record_flash_attention({"framework": "plain loop, Feb 2023"}) is None  # not a Hugging Face model
    assert record_flash_attention({"framework": "transformers 4.28", "flash_attention": True}) is True


def test_gpt2_presets_read_like_their_config_json() -> None:
    """The presets carry what trainplan's reader takes from the same config.json: dropout 0.1, the Python gelu_new."""
    from trainplan.catalog import resolve_model
    from trainplan.hfconfig import arch_from_hf_config

    cfg = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024,
           "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "activation_function": "gelu_new"}  # fmt: skip
    read, preset = arch_from_hf_config(cfg), resolve_model("gpt2")
    assert (read.dropout, read.gelu_python) == (preset.dropout, preset.gelu_python) == (0.1, True)
    assert not arch_from_hf_config({**cfg, "activation_function": "gelu"}).gelu_python
    # a config.json that leaves the keys out builds GPT2Config's defaults (gelu_new, 0.1 dropout): read the same
    bare = {k: v for k, v in cfg.items() if not k.endswith("pdrop") and k != "activation_function"}
    assert (arch_from_hf_config(bare).dropout, arch_from_hf_config(bare).gelu_python) == (0.1, True)
    assert arch_from_hf_config({**bare, "resid_pdrop": 0.0}).dropout == 0.0


def test_compile_loss_says_whether_the_loss_is_compiled_with_the_model() -> None:
    """A hand-written loop (stack plain) that compiles its model runs the loss eagerly on the returned logits, so
    `compile: true` there keeps the up-cast loss's 12 bytes a logit; the stacks that compile the loss with the model
    (torchtune, torchtitan, a Hugging Face model's own forward) keep the compiled loss's; the knob overrides either,
    and without compile it is refused in one line."""
    cat = get_catalog()
    plain = effective_knobs(_job(knobs={"compile": True}), cat)
    tune = effective_knobs(_job(stack="torchtune", knobs={"compile": True, "loss": "full"}), cat)
    hf = effective_knobs(_job(stack="hf-trainer", knobs={"compile": True}), cat)
    assert plain.compile and not plain.compile_loss
    assert tune.compile_loss and hf.compile_loss
    assert effective_knobs(_job(knobs={"compile": True, "compile_loss": True}), cat).compile_loss
    assert not effective_knobs(_job(stack="torchtune"), cat).compile_loss  # no compile, no compiled loss
    eager = transformer_profile(_job(knobs={"compile": True}))
    compiled = transformer_profile(_job(knobs={"compile": True, "compile_loss": True}))
    vocab_logits = 2048 * 2 * 32000
    # the eager up-cast loss: 12 bytes a logit; compiled (one chunk): the 16-bit logits and one fp32 chunk, 2 + 4
    assert eager.memory.activations - compiled.memory.activations == pytest.approx(vocab_logits * (12 - 6), rel=0.01)
    with pytest.raises(SpecError, match="knobs.compile_loss"):
        effective_knobs(_job(knobs={"compile_loss": True}), cat)


def test_an_unknown_lora_implementation_is_refused_not_counted_as_measured() -> None:
    from dataclasses import replace

    base = get_catalog()
    cat = replace(base, stacks={**base.stacks, "torchtune": {**base.stacks["torchtune"], "lora_implementation": "mine"}})
    with pytest.raises(SpecError, match="lora_implementation 'mine' is not one of") as err:
        effective_knobs(_job(stack="torchtune"), cat)
    assert err.value.field == "stack"


@pytest.mark.parametrize("stack", ["plain", "hf-trainer", "litgpt"])
def test_gemma2_attends_eagerly_under_auto_for_its_soft_cap(stack: str) -> None:
    """Gemma 2's attention-logit soft-cap has no SDPA path (transformers: ``_supports_sdpa = False``; LitGPT computes
    the scores eagerly when it is set): ``auto`` is eager, with the tanh output kept; the flash-attn package (``true``)
    applies the cap in its kernel.  Gemma 3 has no attention soft-cap and keeps SDPA."""
    from trainplan.catalog import resolve_model

    cat = get_catalog()
    assert resolve_model("gemma-2-9b").attention_softcap == 50.0 and resolve_model("gemma-3-1b").attention_softcap is None
    gemma = {**BASE, "model": "gemma-2-9b", "seq_len": 2048, "micro_batch": 1, "stack": stack}
    auto = transformer_profile(parse_job(gemma), cat).memory.activations
    eager = transformer_profile(parse_job({**gemma, "flash_attention": "false"}), cat).memory.activations
    fused = transformer_profile(parse_job({**gemma, "flash_attention": "true"}), cat).memory.activations
    assert auto == eager > fused
    gemma3 = {**BASE, "model": "gemma-3-1b", "seq_len": 2048, "micro_batch": 1, "stack": stack}
    assert transformer_profile(parse_job(gemma3), cat).memory.activations < transformer_profile(
        parse_job({**gemma3, "flash_attention": "false"}), cat).memory.activations


@pytest.mark.parametrize("stack", ["plain", "hf-trainer", "accelerate"])
def test_gpt_oss_attends_eagerly_under_auto_for_its_sinks_except_in_torchtitan(stack: str) -> None:
    """gpt-oss's attention sinks have no SDPA path in transformers (``GptOssPreTrainedModel._supports_sdpa = False``):
    ``auto`` is its eager attention there; torchtitan's gpt-oss runs its own sink-aware kernel; ``true`` is a fused
    sink-aware kernel (the kernels hub's flash-attn 3, Transformer Engine)."""
    cat = get_catalog()
    oss = {**BASE, "model": "gpt-oss-20b", "seq_len": 2048, "micro_batch": 1, "method": "lora", "stack": stack}
    auto = transformer_profile(parse_job(oss), cat).memory.activations
    eager = transformer_profile(parse_job({**oss, "flash_attention": "false"}), cat).memory.activations
    fused = transformer_profile(parse_job({**oss, "flash_attention": "true"}), cat).memory.activations
    assert auto == eager > fused
    titan = {**oss, "stack": "torchtitan", "method": "full"}
    assert (transformer_profile(parse_job(titan), cat).memory.activations
            < transformer_profile(parse_job({**titan, "flash_attention": "false"}), cat).memory.activations)


def test_gpt_oss_eager_scores_are_fp32_only_over_fp32_weights() -> None:
    """Its softmax runs in the logits' dtype (tests/estimate/test_activations.py measures both): fp32 for a mixed
    full fine-tune (autocast over fp32 weights) or an fp32 LoRA base, 16-bit for a 16-bit base or pure bf16; other
    eager attention keeps autocast's fp32 softmax under any mixed precision."""
    from trainplan.catalog import resolve_model
    from trainplan.estimate.transformer import _fp32_scores

    cat = get_catalog()
    oss, llama = resolve_model("gpt-oss-20b"), resolve_model("llama-2-7b")

    def fp32(arch, **extra) -> bool:  # noqa: ANN001
        job = _job(**extra)
        return _fp32_scores(job, arch, effective_knobs(job, cat))

    assert fp32(oss) and not fp32(oss, method="lora") and not fp32(oss, precision="bf16-pure")
    assert fp32(oss, method="lora", knobs={"frozen_weights_fp32": True})
    assert fp32(llama) and fp32(llama, method="lora")


@pytest.mark.parametrize(("model", "stack", "upcast"), [
    ("llama-2-7b", "hf-trainer", True), ("gemma-2-9b", "litgpt", True), ("bloomz-7b1", "plain", True),
    ("gpt2", "hf-trainer", False), ("llama-2-7b", "torchtune", False), ("llama-2-7b", "llm-foundry", False),
    ("bert-base", "hf-trainer", False),
])  # fmt: skip
def test_pure_bf16_eager_scores_are_fp32_where_the_model_code_upcasts(model: str, stack: str, upcast: bool) -> None:
    """transformers' eager attention (every decoder family but GPT-2's) and LitGPT's up-cast the softmax whatever
    the precision (tests/estimate/test_activations.py measures Llama's and GPT-2's); under autocast every one is fp32."""
    from trainplan.catalog import resolve_model
    from trainplan.estimate.transformer import _fp32_scores

    cat = get_catalog()
    for precision, expected in (("bf16-pure", upcast), ("bf16", True)):
        job = _job(model=model, stack=stack, precision=precision, flash_attention="false")
        assert _fp32_scores(job, resolve_model(model), effective_knobs(job, cat)) is expected


def test_an_estimate_says_when_the_model_makes_auto_attention_eager() -> None:
    cat = get_catalog()
    oss = {**BASE, "model": "gpt-oss-20b", "seq_len": 2048, "micro_batch": 1, "method": "lora", "stack": "hf-trainer"}
    notes = transformer_profile(parse_job(oss), cat).notes
    assert any("attention: eager" in n and "attention sinks" in n for n in notes)
    gemma = transformer_profile(parse_job({**oss, "model": "gemma-2-9b"}), cat).notes
    assert any("attention-logit soft-capping" in n for n in gemma)
    for quiet in ({**oss, "flash_attention": "true"}, {**oss, "flash_attention": "false"}, {**oss, "model": "llama-2-7b"},
                  {**oss, "stack": "torchtitan", "method": "full"}):
        assert not any("attention: eager" in n for n in transformer_profile(parse_job(quiet), cat).notes), quiet
