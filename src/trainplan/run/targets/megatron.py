"""Megatron-LM: the plan's layout — tensor (+ sequence), pipeline (+ virtual stages), context and expert parallel,
with Megatron's DDP or its distributed optimizer — as a ``pretrain_gpt.py`` argument list.

Megatron-LM builds its GPT model from command-line arguments (``megatron/training/arguments.py``), so any decoder
trainplan can describe with Megatron's switches is rendered: layers, widths, grouped-query attention, SwiGLU or
GELU, RMSNorm or LayerNorm, rotary or learned positions, biases, tied or untied embeddings, and mixture-of-experts
layers (routed experts, top-k, expert and shared-expert widths, dense layers as a ``--moe-layer-freq`` list).
What Megatron has no switch for in this rendering is refused in one line: multi-head latent attention, sliding
windows, logit soft-capping, attention sinks, NoPE layers, q/k norms over the full width, four norms a block, LoRA / QLoRA, a pretrained Hugging
Face checkpoint (Megatron loads its own checkpoint format; convert it with Megatron-Bridge first), FSDP / ZeRO-2 / 3
strategies (Megatron's own FSDP is not rendered here: pick a ddp or zero1 option).

The data-parallel sharding: ``ddp`` is Megatron's DDP; ``zero1`` is ``--use-distributed-optimizer`` (optimizer
state sharded over the data-parallel ranks, Megatron's ZeRO-1).  Batch: ``--micro-batch-size`` and
``--global-batch-size`` (Megatron accumulates, or feeds the pipeline, ``global / (micro × dp)`` micro-batches).
Activation checkpointing: ``selective`` is ``--recompute-granularity selective`` (the attention core, Korthikanti et
al. 2022) — refused unless the job's ``knobs.selective_recompute`` is ``attention-core``, so that the plan was estimated
as Megatron runs it — and ``full`` is ``full`` / ``uniform`` / one layer per group.

Data: ``--mock-data`` with ``--tokenizer-type NullTokenizer`` (a smoke run at the plan's shape); a real run replaces
them by ``--data-path`` and a tokenizer (a note says so).  When Megatron Core is importable
(``pip install megatron-core``), :func:`check_with_megatron_core` builds its ``TransformerConfig`` from the rendered
arguments before anything is written, so its own checks (heads divisible by tensor parallel, the pipeline's dtype,
MoE settings, …) run on the layout.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from trainplan.catalog import checkpoint_dir, get_catalog, resolve_model
from trainplan.errors import SpecError
from trainplan.model import ModelArch
from trainplan.run.targets.base import Command, LaunchPlan, Rendered, unsupported
from trainplan.run.targets.common import DS_CONFIG, base_files
from trainplan.run.targets.torchrun import launcher_argv
from trainplan.spec import Checkpointing, JobKind, Method, Optimizer, Precision, SelectiveRecompute
from trainplan.strategies import Strategy

#: Where Megatron-LM is checked out on the nodes: ``$MEGATRON_LM`` when rendering, else ``./Megatron-LM``.
CHECKOUT_ENV = "MEGATRON_LM"
ENTRY = "pretrain_gpt.py"


def entry_point() -> str:
    """Megatron-LM's training script, in the checkout the nodes use."""
    return os.path.join(os.environ.get(CHECKOUT_ENV) or "Megatron-LM", ENTRY)


def check(plan: LaunchPlan) -> ModelArch:
    """Why Megatron-LM cannot run this plan (one line), or the architecture it builds."""
    job = plan.job
    if job.kind is not JobKind.TRANSFORMER:
        raise unsupported(plan, f"Megatron-LM trains transformer language models; this is a kind: {job.kind.value} job")
    if plan.options.script is not None:
        raise unsupported(plan, "Megatron-LM runs its own trainer (pretrain_gpt.py); a --script runs with --to torchrun")
    if job.method is not Method.FULL:
        raise unsupported(plan, f"pretrain_gpt.py trains all weights; method {job.method.value} runs with --to torchrun / deepspeed")
    if checkpoint_dir(job.model) is not None:
        raise unsupported(plan, "Megatron-LM loads its own checkpoint format, not a save_pretrained folder: convert it "
                                "(Megatron-Bridge) and pass --load, or use --to torchrun")  # fmt: skip
    if job.optimizer not in (Optimizer.ADAMW, Optimizer.SGD):
        raise unsupported(plan, f"Megatron's optimizers are adam (AdamW) and sgd; the job's is {job.optimizer.value}")
    if plan.strategy not in (Strategy.SINGLE, Strategy.DDP, Strategy.ZERO1):
        raise unsupported(plan, f"the option's strategy is {plan.strategy.value}; Megatron-LM is rendered with its DDP "
                                "or its distributed optimizer (ZeRO-1): pick a ddp or zero1 option (--strategy zero1)")  # fmt: skip
    if job.precision is Precision.BF16_PURE:
        raise unsupported(plan, "Megatron keeps fp32 master weights; precision bf16-pure has no equivalent — use bf16")
    if job.activation_checkpointing is Checkpointing.SELECTIVE:
        kept = plan.knobs.selective_recompute
        if kept is not SelectiveRecompute.ATTENTION_CORE:
            raise unsupported(plan, "Megatron's selective recomputation recomputes only the attention core, which keeps "
                                    f"more than this plan was estimated with (selective_recompute {kept.value}): set "
                                    "knobs.selective_recompute: attention-core in the job and plan again")  # fmt: skip
    if plan.placement.device.value != "cuda":
        raise unsupported(plan, "Megatron-LM runs on GPUs (NCCL); --device cpu rehearses with --to torchrun")
    arch = resolve_model(job.model, get_catalog())
    if arch.arch != "decoder":
        raise unsupported(plan, f"pretrain_gpt.py builds decoders; the model is {arch.arch}")
    if arch.position not in ("rope", "learned"):
        raise unsupported(plan, f"Megatron's GPT has rope or learned positions; the model's are {arch.position}")
    refused = {
        "mla": "multi-head latent attention", "sliding_window": "a sliding attention window",
        "final_logit_softcap": "logit soft-capping", "attention_sinks": "attention sinks",
        "gelu_python": "transformers' Python GELU", "extra_embedding_params": "extra embedding parameters",
        "nope_layers": "layers without rotary embeddings (NoPE)",
        "post_norms": "norms after attention and the MLP instead of before them (OLMo 2, EXAONE 4)",
        "norm_fp32_weight": "norms that multiply their weight in fp32 (Gemma, gpt-oss, OLMo 2)",
        "norm_python": "fp32 Python LayerNorms (Cohere)",
        "embedding_norm": "a norm of the embedding's output (nanochat)",
        "attention_gate": "a sigmoid gate on the attention output (AFMoE)",
    }  # fmt: skip
    for field, what in refused.items():
        if getattr(arch, field):
            raise unsupported(plan, f"the model has {what} ({field}), which this Megatron-LM rendering has no switch for")
    if not arch.norm_weight:
        raise unsupported(plan, "the model's norms have no weight (nanochat: norm_weight false), which this Megatron-LM "
                                "rendering has no switch for")  # fmt: skip
    if arch.qk_norm in ("full", "each_head"):
        raise unsupported(plan, "the model normalises q and k over the full width (OLMoE) or with a weight per head "
                                "(Cohere); Megatron's --qk-layernorm normalises each head with one shared weight")  # fmt: skip
    if arch.block_norms != 2:
        what = ("four norms a block (Gemma 2/3, GLM-4-0414)" if arch.block_norms == 4
                else "one norm a block read by attention and the MLP side by side (Cohere)")
        raise unsupported(plan, f"the model has {what}, which Megatron's GPT layer does not build")
    if arch.hf_model_type in _SCALAR_MULTIPLIED:
        raise unsupported(plan, f"the model ({arch.hf_model_type}) multiplies its embedding, attention scores, residual "
                                "branches and logits by constants of its config (Granite's muP scalars), which "
                                "Megatron's GPT does not build")  # fmt: skip
    if arch.moe is not None and (arch.moe.shared_gate or arch.moe.router_bias or arch.moe.expert_bias or arch.moe.output_norm):
        raise unsupported(plan, "the model's experts have a shared-expert gate, biases or a norm of their output, not "
                                "rendered for Megatron-LM")  # fmt: skip
    if arch.attention_bias == "qkvo":
        raise unsupported(plan, "the model has an output-projection bias without the MLP's, not rendered for Megatron-LM")
    return arch


#: families that scale the embedding, the attention scores, each residual branch and the logits by config constants
#: (``embedding_multiplier``, ``attention_multiplier``, ``residual_multiplier``, ``logits_scaling``: transformers 5.25
#: ``modeling_granite.py`` and the families built on it), where Megatron's GPT applies 1, 1/sqrt(head_dim), 1 and 1
_SCALAR_MULTIPLIED = ("granite", "granitemoe", "granitemoeshared", "hyperclovax")
#: families whose rotary embedding turns interleaved pairs of channels (transformers' ``rotate_half`` on ``x[..., 0::2]``
#: and ``x[..., 1::2]``) where Megatron's default turns the two halves of each head
_INTERLEAVED_ROTARY = ("glm", "glm4", "ernie4_5", "ernie4_5_moe", "cohere", "cohere2")
#: Megatron-Core's Llama 3.x frequency scaling takes only the factor (``--rope-scaling-factor``); the rest is fixed in
#: ``RotaryEmbedding._apply_scaling`` (megatron/core/models/common/embeddings/rotary_pos_embedding.py, 0.16)
_MEGATRON_LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


#: a two-matrix MLP's activation as transformers names it, and the pretrain_gpt.py switch that builds it (Megatron-LM
#: arguments.py: GELU by default — F.gelu —, ``--openai-gelu`` its tanh approximation, ``--squared-relu`` ReLU²)
_TWO_MATRIX_ACTIVATIONS = {"gelu": [], "gelu_pytorch_tanh": ["--openai-gelu"], "relu2": ["--squared-relu"]}
#: what a family's config class defaults ``hidden_act`` to, where a config.json may leave it out (transformers 5.25)
_DEFAULT_ACTIVATION = {"starcoder2": "gelu_pytorch_tanh", "gpt_neox": "gelu", "arcee": "relu2", "nemotron": "relu2", "jais2": "relu2",
                       "gemma": "gelu_pytorch_tanh", "gemma2": "gelu_pytorch_tanh", "gemma3_text": "gelu_pytorch_tanh"}  # fmt: skip


def config_arguments(plan: LaunchPlan, arch: ModelArch) -> tuple[list[str], list[str]]:
    """What a model read from a ``config.json`` says beyond its shape, as ``pretrain_gpt.py`` arguments — the rotary
    base (``--rotary-base``), the rotated fraction of each head (``--rotary-percent``), Llama 3.x frequency scaling
    (``--use-rope-scaling --rope-scaling-factor``), a two-matrix MLP's activation (``--openai-gelu``,
    ``--squared-relu``) and the norms' epsilon (``--norm-epsilon``) — and what it leaves
    unsaid (a config without the key: its class default, which trainplan does not read). Rotary kinds Megatron's GPT
    does not build (interleaved pairs, YaRN, linear, dynamic, LongRoPE) are refused: rendering Megatron's default
    rotary would train another model than the one planned."""
    import json

    cfg = json.loads(arch.hf_source or "{}")
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    if arch.hf_model_type in _INTERLEAVED_ROTARY:
        raise unsupported(plan, f"the model ({arch.hf_model_type}) rotates interleaved pairs of channels, which this "
                                "Megatron-LM rendering does not build (its rotary turns the two halves of each head)")  # fmt: skip
    args: list[str] = []
    unsaid: list[str] = []
    if arch.hf_model_type == "gpt_neox" and cfg.get("use_parallel_residual", True):
        raise unsupported(plan, "the model (GPT-NeoX, Pythia) runs attention and the MLP side by side "
                                "(use_parallel_residual), which Megatron's GPT layer does not build")  # fmt: skip
    theta = cfg.get("rope_theta", rope.get("rope_theta", cfg.get("rotary_emb_base")))  # the last: GPT-NeoX's older key
    if theta is not None and arch.position == "rope":
        if float(theta) != int(theta):
            raise unsupported(plan, f"the model's rotary base {theta!r} is not an integer, which --rotary-base takes")
        args += ["--rotary-base", str(int(theta))]
    elif arch.position == "rope":
        unsaid.append("the rotary base")
    fraction = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", cfg.get("rotary_pct")))
    if fraction is None:  # the config classes' defaults (transformers 5.25): GPT-NeoX and StableLM 0.25, Nemotron 0.5
        fraction = {"gpt_neox": 0.25, "stablelm": 0.25, "nemotron": 0.5}.get(arch.hf_model_type or "")
    if fraction is None and cfg.get("rotary_dim"):
        fraction = cfg["rotary_dim"] / (arch.head_dim or arch.hidden // arch.heads)  # MiniMax-M2's legacy key
    if fraction is not None and float(fraction) != 1.0:
        args += ["--rotary-percent", f"{float(fraction):g}"]
    kind = str(scaling.get("rope_type") or scaling.get("type") or rope.get("rope_type") or "default")
    params = {**rope, **scaling}
    if kind == "llama3":
        off = {k: params.get(k) for k, v in _MEGATRON_LLAMA3.items() if float(params.get(k, v)) != v}
        if off:
            raise unsupported(plan, f"the model's Llama 3 rotary scaling sets {off}, which Megatron-Core fixes at "
                                    f"{_MEGATRON_LLAMA3}")  # fmt: skip
        args += ["--use-rope-scaling", "--rope-scaling-factor", f"{float(params.get('factor', 8.0)):g}"]
    elif kind != "default":
        raise unsupported(plan, f"the model's rotary scaling ({kind!r}) is not one this Megatron-LM rendering builds "
                                "(Llama 3.x's is)")  # fmt: skip
    act = cfg.get("hidden_act", cfg.get("activation_function", _DEFAULT_ACTIVATION.get(arch.hf_model_type or "", "silu")))
    if arch.mlp == "swiglu" and act != "silu":
        raise unsupported(plan, f"the model's gated MLP uses {act!r}; Megatron's --swiglu gates with SiLU")
    if arch.mlp == "gelu":
        if act not in _TWO_MATRIX_ACTIVATIONS:
            raise unsupported(plan, f"the model's MLP activation {act!r} is not one Megatron's GPT builds "
                                    f"({', '.join(sorted(_TWO_MATRIX_ACTIVATIONS))})")  # fmt: skip
        args += _TWO_MATRIX_ACTIVATIONS[act]
    if arch.hf_model_type == "nemotron":  # NemotronLayerNorm1P scales by 1 + weight: Megatron's zero-centred gamma
        args.append("--apply-layernorm-1p")
    if arch.moe is not None:
        args += _router_arguments(plan, arch, cfg)
    eps = next((cfg[k] for k in ("rms_norm_eps", "layer_norm_eps", "norm_epsilon", "layer_norm_epsilon", "norm_eps")
                if k in cfg), None)  # fmt: skip
    if eps is not None:
        args += ["--norm-epsilon", f"{float(eps):g}"]
    else:
        unsaid.append("the norm epsilon")
    return args, unsaid


#: families whose router scores experts with a sigmoid plus a score-correction bias (DeepSeek-V3's auxiliary-loss-free
#: balancing), where Megatron's default router takes a softmax (transformers 5.25 modeling: ``router_logits.sigmoid()``
#: and ``e_score_correction_bias`` in each family's router, GLM-4.5's for Param2 and Sarvam; A.X K1, MiniCPM5-MoE,
#: K-EXAONE and Kolibri 1 are refused before this for their attention or norms, and listed for what their router is)
_SIGMOID_ROUTED = ("deepseek_v3", "sarvam_mla", "axk1", "glm4_moe", "glm4_moe_lite", "param2moe", "sarvam_moe", "dots1",
                   "solar_open", "minimax_m2", "minicpm5_moe", "exaone_moe", "kolibri1")
#: what ``norm_topk_prob`` defaults to where a family's softmax router reads it (transformers 5.25 config classes)
_NORM_TOPK_DEFAULT = {"qwen3_moe": False, "qwen2_moe": False, "olmoe": False, "mellum": True}


def _router_arguments(plan: LaunchPlan, arch: ModelArch, cfg: dict[str, Any]) -> list[str]:
    """The router a config.json's family builds, as Megatron-Core's: its default router takes top-k of the logits and a
    softmax over those k (``moe_router_pre_softmax`` false: the same weights as a softmax over all experts renormalised
    over the k chosen — Mixtral's, Hunyuan's, a Qwen3-MoE with ``norm_topk_prob``); a softmax over all experts whose
    top-k weights are not renormalised (``norm_topk_prob`` false) is ``--moe-router-pre-softmax``. Sigmoid routers
    with a score-correction bias are refused: this rendering does not set Megatron's sigmoid, expert-bias, group and
    scaling switches, and rendering its softmax would train another model than the one planned."""
    if arch.hf_model_type in _SIGMOID_ROUTED:
        raise unsupported(plan, f"the model's router ({arch.hf_model_type}) scores experts with a sigmoid and a "
                                "score-correction bias, which this Megatron-LM rendering does not set (its default "
                                "router is a softmax)")  # fmt: skip
    if arch.hf_model_type in _NORM_TOPK_DEFAULT:
        if not cfg.get("norm_topk_prob", _NORM_TOPK_DEFAULT[arch.hf_model_type]):
            return ["--moe-router-pre-softmax"]
    return []


def _moe_layer_freq(arch: ModelArch) -> str:
    """``--moe-layer-freq`` as the Python list Megatron evaluates: 1 for an MoE layer, 0 for a dense one."""
    dense = set(arch.moe.dense_layers) if arch.moe else set()
    flags = [0 if i in dense else 1 for i in range(arch.layers)]
    return "[" + ",".join(map(str, flags)) + "]"


def arguments(plan: LaunchPlan, arch: ModelArch) -> list[str]:
    """``pretrain_gpt.py`` arguments for the plan (names as Megatron-LM's arguments.py declares them)."""
    job, layout = plan.job, plan.layout
    micro = job.micro_batch
    global_batch = micro * plan.micro_steps * layout.data_parallel
    heads_kv = arch.kv_heads or arch.heads
    args = [
        "--num-layers", str(arch.layers), "--hidden-size", str(arch.hidden),
        "--num-attention-heads", str(arch.heads), "--ffn-hidden-size", str(arch.ffn_hidden),
        "--seq-length", str(job.seq_len), "--max-position-embeddings", str(max(job.seq_len, arch.max_seq_len or 0)),
        "--tensor-model-parallel-size", str(layout.tp), "--pipeline-model-parallel-size", str(layout.pp),
        "--context-parallel-size", str(layout.cp),
        "--micro-batch-size", str(micro), "--global-batch-size", str(global_batch),
        "--train-iters", str(plan.config.total_steps), "--lr", f"{job.learning_rate:g}",
        "--optimizer", "sgd" if job.optimizer is Optimizer.SGD else "adam",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(arch.vocab),
        "--save", str(plan.path("megatron")), "--seed", str(job.seed),
    ]  # fmt: skip
    if arch.head_dim and arch.head_dim * arch.heads != arch.hidden:
        args += ["--kv-channels", str(arch.head_dim)]
    if heads_kv != arch.heads:
        args += ["--group-query-attention", "--num-query-groups", str(heads_kv)]
    if arch.qk_norm == "head":
        args.append("--qk-layernorm")  # a norm of q and of k over each head's channels (Qwen3), of --normalization's kind
    if arch.mlp == "swiglu":
        args.append("--swiglu")
    if arch.norm == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    args += ["--position-embedding-type", "rope" if arch.position == "rope" else "learned_absolute"]
    if not arch.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not arch.bias:
        args.append("--disable-bias-linear")
        if arch.attention_bias == "qkv":
            args.append("--add-qkv-bias")
    # always the model's own: Megatron's defaults (0.1 each) would train another model than the one planned
    args += ["--attention-dropout", f"{arch.dropout:g}", "--hidden-dropout", f"{arch.dropout:g}"]
    if arch.hf_source is not None:
        args += config_arguments(plan, arch)[0]
    if layout.tp > 1 and layout.sequence_parallel:
        args.append("--sequence-parallel")
    if layout.pp > 1 and layout.vpp > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(arch.layers // (layout.pp * layout.vpp))]
    first, last = _split_weights(plan)
    if first:
        args.append("--account-for-embedding-in-pipeline-split")
    if last:
        args.append("--account-for-loss-in-pipeline-split")
    if arch.moe is not None:
        args += ["--num-experts", str(arch.moe.experts), "--moe-router-topk", str(arch.moe.top_k),
                 "--moe-ffn-hidden-size", str(arch.moe.expert_ffn_hidden), "--moe-layer-freq", _moe_layer_freq(arch),
                 "--expert-model-parallel-size", str(layout.ep), "--moe-token-dispatcher-type", "alltoall",
                 "--moe-grouped-gemm"]  # fmt: skip
        if arch.moe.shared_ffn_hidden:
            args += ["--moe-shared-expert-intermediate-size", str(arch.moe.shared_ffn_hidden)]
    if arch.mtp_layers:  # GLM-4.5's multi-token-prediction layer (DeepSeek-V3's design, which Megatron-Core builds)
        args += ["--mtp-num-layers", str(arch.mtp_layers)]
    if plan.strategy is Strategy.ZERO1:
        args.append("--use-distributed-optimizer")
    if job.precision in (Precision.BF16, Precision.FP8):
        args.append("--bf16")
    elif job.precision is Precision.FP16:
        args.append("--fp16")
    if job.precision is Precision.FP8:
        args += ["--fp8-format", "hybrid"]  # Transformer Engine: E4M3 forward, E5M2 gradients (delayed scaling)
    if job.activation_checkpointing is Checkpointing.SELECTIVE:
        args += ["--recompute-granularity", "selective"]
        if job.knobs.recompute_modules is not None:  # the modules the plan was estimated with (Megatron-Core >= 0.13)
            args += ["--recompute-modules", *sorted(m.value for m in job.knobs.recompute_modules)]
    elif job.activation_checkpointing is Checkpointing.FULL:
        blocks = _checkpointed_per_chunk(plan, arch)
        if blocks is None:
            args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        else:  # the first `blocks` layers of each chunk checkpointed, the rest not (Megatron-Core recompute_method block)
            args += ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(blocks)]
    if plan.config.checkpoint_every:
        args += ["--save-interval", str(plan.config.checkpoint_every)]
    return args


def _split_weights(plan: LaunchPlan) -> tuple[int, int]:
    """Blocks' worth the embedding and the loss take in the pipeline split (knobs.pipeline_first_stage_less_layers /
    _last_stage_less_layers): Megatron-Core counts each as one layer with ``--account-for-embedding-in-pipeline-split``
    / ``--account-for-loss-in-pipeline-split`` (TransformerConfig), so 0 or 1 each, and without virtual stages (how
    Megatron sizes interleaved chunks around them is not rendered here)."""
    k = plan.knobs
    first, last = k.pipeline_first_stage_less_layers, k.pipeline_last_stage_less_layers
    if plan.layout.pp == 1:
        return 0, 0
    if first > 1 or last > 1:
        raise unsupported(plan, "Megatron-LM counts the embedding and the loss as one layer each in the pipeline split "
                                "(--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split): "
                                "knobs.pipeline_first_stage_less_layers and _last_stage_less_layers must be 0 or 1")  # fmt: skip
    if (first or last) and plan.layout.vpp > 1:
        raise unsupported(plan, "the embedding and loss counted as pipeline layers are rendered for Megatron-LM without "
                                "virtual stages: use vpp 1 or set both pipeline_*_stage_less_layers knobs to 0")  # fmt: skip
    return first, last


def _checkpointed_per_chunk(plan: LaunchPlan, arch: ModelArch) -> int | None:
    """Layers of each model chunk that full recomputation checkpoints when knobs.checkpoint_fraction is set (None: all,
    the uniform method).  Megatron-Core's ``block`` method checkpoints the first ``recompute_num_layers`` layers of each
    chunk (TransformerBlock ``_checkpointed_forward``), the same share as the plan's only where the chunks are equal and
    the share of each is a whole number of layers."""
    fraction = plan.knobs.checkpoint_fraction
    if fraction >= 1.0:
        return None
    layout = plan.layout
    chunks = layout.pp * layout.vpp
    first, last = _split_weights(plan)
    per_chunk = arch.layers / chunks
    blocks = per_chunk * fraction
    if first or last or per_chunk != int(per_chunk) or abs(blocks - round(blocks)) > 1e-9 or round(blocks) < 1:
        raise unsupported(plan, f"Megatron-LM checkpoints the first N layers of each of the {chunks} model chunk(s) "
                                f"(--recompute-method block): knobs.checkpoint_fraction {fraction:g} of {per_chunk:g} layers "
                                "a chunk must be a whole number, with no embedding or loss counted in the split")  # fmt: skip
    return round(blocks)


def _check_layers(plan: LaunchPlan, arch: ModelArch) -> None:
    layout = plan.layout
    stages = layout.pp * layout.vpp
    first, last = _split_weights(plan)
    units = arch.layers + first + last
    if layout.pp > 1 and units % stages:
        counted = f"{arch.layers} layers" + (f" and the embedding / loss ({units} in all)" if units != arch.layers else "")
        raise unsupported(plan, f"Megatron-LM splits the {counted} evenly over pp × vpp = {stages} stages: "
                                "choose a layout whose stages divide them")  # fmt: skip


def _unsaid_note(plan: LaunchPlan, arch: ModelArch) -> str:
    """What the render leaves at Megatron's defaults because trainplan's model does not record it."""
    if arch.hf_source is None:
        return ("not rendered, as a preset or inline model does not record them (they change no memory or time): the "
                "rotary base (Megatron's default 10000; Llama 3 uses --rotary-base 500000) and its scaling, the norm "
                "epsilon and initialisation — add the model's own, or plan from its config.json, whose values are rendered")  # fmt: skip
    unsaid = config_arguments(plan, arch)[1]
    return ("rendered from the model's config.json: its rotary base, rotated fraction and scaling, its MLP activation, "
            "its experts' router and its norm epsilon where it states them" + (f" (it leaves out {' and '.join(unsaid)}: Megatron's default is rendered; its "
                                      "config class's default may differ)" if unsaid else "")
            + "; initialisation is Megatron's")  # fmt: skip


def render(plan: LaunchPlan) -> Rendered:
    arch = check(plan)
    _check_layers(plan, arch)
    nodes = plan.placement.nodes
    if nodes > 1 and not plan.options.master_addr:
        raise SpecError(f"Megatron-LM on {nodes} nodes needs the rendezvous host (node 0's address)", field="--master-addr")
    args = arguments(plan, arch)
    env = {"PYTHONUNBUFFERED": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # Megatron's TP/SP overlap expects 1
    if plan.options.iface:
        env["NCCL_SOCKET_IFNAME"] = plan.options.iface
    commands = tuple(
        Command(argv=tuple([*launcher_argv(plan, rank, master_addr=plan.options.master_addr), entry_point(), *args]), env=env,
                cwd=plan.out, where=f"node {rank} of {nodes}" + (" (the rendezvous host)" if rank == 0 and nodes > 1 else ""))
        for rank in range(nodes)
    )  # fmt: skip
    notes = [
        f"Megatron-LM trains a {arch.layers}-layer GPT built from these arguments with {plan.layout.describe()}, "
        f"from {entry_point()} (a Megatron-LM checkout at that path on every node; set {CHECKOUT_ENV} when rendering "
        "to name another; it needs Transformer Engine and a PyTorch it supports)",
        "data: --mock-data with NullTokenizer runs the plan's shape on random tokens; for a real run replace them by "
        "--data-path (an indexed .bin/.idx prefix from tools/preprocess_data.py) and your tokenizer",
        "Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by (128) × tensor parallel: a few "
        "embedding rows more than the plan counts",
        _unsaid_note(plan, arch),
        f"optimizer: {'sgd' if plan.job.optimizer is Optimizer.SGD else 'adam (AdamW)'} at --lr "
        f"{plan.job.learning_rate:g} and Megatron's defaults for the schedule, weight decay and clipping",
    ]
    if plan.job.stack.value != "plain":
        notes.append(f"the plan was estimated for stack {plan.job.stack.value}; Megatron's loss and optimizer are its own")
    if arch.moe is not None and not plan.knobs.moe_fused_activation:
        # Megatron-LM's --no-bias-swiglu-fusion is off by default: TEGroupedMLP runs weighted_bias_swiglu_impl
        notes.append("Megatron-Core's grouped experts fuse SwiGLU with the routing weight (bias_swiglu_fusion, its "
                     "default) and keep less than the plan counted (transformers' eager experts): set "
                     "knobs.moe_fused_activation: true in the job for a plan that matches")  # fmt: skip
    if nodes > 1:
        notes.append(f"Megatron saves checkpoints under {plan.path('megatron')}: storage every node sees")
    files = base_files(plan)
    files.pop(DS_CONFIG, None)  # ZeRO-1 is Megatron's distributed optimizer here, not DeepSpeed's
    return Rendered(plan.target, files, commands, tuple(notes))


# ---------------------------------------------------------------------------- Megatron Core's own checks

#: pretrain_gpt.py flags and the TransformerConfig fields they set (Megatron-LM arguments.py core_transformer_config_from_args
#: copies each parsed argument into the field of the same name; the few renamed ones are listed here).
_FIELDS = {
    "--num-layers": "num_layers", "--hidden-size": "hidden_size", "--num-attention-heads": "num_attention_heads",
    "--ffn-hidden-size": "ffn_hidden_size", "--kv-channels": "kv_channels", "--num-query-groups": "num_query_groups",
    "--tensor-model-parallel-size": "tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--context-parallel-size": "context_parallel_size", "--expert-model-parallel-size": "expert_model_parallel_size",
    "--num-experts": "num_moe_experts", "--moe-router-topk": "moe_router_topk", "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
    "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
    "--moe-token-dispatcher-type": "moe_token_dispatcher_type", "--recompute-granularity": "recompute_granularity",
    "--recompute-method": "recompute_method", "--recompute-num-layers": "recompute_num_layers",
    "--mtp-num-layers": "mtp_num_layers",
}  # fmt: skip
_SWITCHES = {"--sequence-parallel": "sequence_parallel", "--swiglu": "gated_linear_unit", "--moe-grouped-gemm": "moe_grouped_gemm",
             "--moe-router-pre-softmax": "moe_router_pre_softmax",
             "--bf16": "bf16", "--fp16": "fp16", "--qk-layernorm": "qk_layernorm",
             "--account-for-embedding-in-pipeline-split": "account_for_embedding_in_pipeline_split",
             "--account-for-loss-in-pipeline-split": "account_for_loss_in_pipeline_split"}  # fmt: skip


def megatron_core_available() -> bool:
    return importlib.util.find_spec("megatron.core") is not None


def transformer_config_kwargs(args: list[str]) -> dict[str, Any]:
    """The ``TransformerConfig`` keyword arguments the rendered ``pretrain_gpt.py`` arguments set."""
    import torch

    kw: dict[str, Any] = {}
    for i, flag in enumerate(args):
        if flag in _FIELDS:
            value = args[i + 1]
            kw[_FIELDS[flag]] = int(value) if value.isdigit() else value
        elif flag in _SWITCHES:
            kw[_SWITCHES[flag]] = True
    if "--moe-layer-freq" in args:
        kw["moe_layer_freq"] = [int(x) for x in args[args.index("--moe-layer-freq") + 1].strip("[]").split(",")]
    if "--num-layers-per-virtual-pipeline-stage" in args:
        per_stage = int(args[args.index("--num-layers-per-virtual-pipeline-stage") + 1])
        kw["virtual_pipeline_model_parallel_size"] = kw["num_layers"] // (per_stage * kw["pipeline_model_parallel_size"])
    dtype = torch.bfloat16 if kw.get("bf16") else torch.float16 if kw.get("fp16") else torch.float32
    kw["params_dtype"] = kw["pipeline_dtype"] = dtype  # arguments.py: params_dtype from --bf16 / --fp16
    kw.setdefault("num_query_groups", None)
    if "--disable-bias-linear" in args:
        kw["add_bias_linear"] = False
    return kw


def check_with_megatron_core(args: list[str]) -> Any:
    """Megatron Core's ``TransformerConfig`` built from the rendered arguments (its ``__post_init__`` checks run).

    Raises :class:`SpecError` with Megatron's own message when it rejects the configuration."""
    import warnings

    try:
        with warnings.catch_warnings():  # Megatron Core warns at import when Transformer Engine and Apex are absent
            warnings.simplefilter("ignore")
            from megatron.core.transformer.transformer_config import TransformerConfig

            return TransformerConfig(**transformer_config_kwargs(args))
    except (ValueError, AssertionError, TypeError) as exc:
        raise SpecError(f"Megatron Core's TransformerConfig rejected the rendered configuration: {exc}", field="--to") from None


def checked(plan: LaunchPlan, rendered: Rendered) -> Rendered:
    """``rendered`` after Megatron Core has built its TransformerConfig from it (a note says so), or a note saying why not."""
    if not megatron_core_available():
        note = "not checked by Megatron Core here (pip install megatron-core to run its TransformerConfig checks first)"
        return Rendered(rendered.target, rendered.files, rendered.commands, (*rendered.notes, note), rendered.executable)
    argv = list(rendered.commands[0].argv)
    start = next(i for i, a in enumerate(argv) if a.endswith(ENTRY)) + 1
    check_with_megatron_core(argv[start:])
    note = "checked: Megatron Core's TransformerConfig accepted the layout and model arguments"
    return Rendered(rendered.target, rendered.files, rendered.commands, (*rendered.notes, note), rendered.executable)
