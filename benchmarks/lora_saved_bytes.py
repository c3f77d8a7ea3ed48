"""What a LoRA fine-tune's blocks keep for backward under PEFT, against trainplan's count (issue 22: a lead).

    python benchmarks/lora_saved_bytes.py

A small Llama (4 layers, hidden 256, SwiGLU 512, 8 heads in 2 KV groups), its weights in bf16, wrapped by PEFT's
``get_peft_model`` (rank 8) with each target set; one forward pass of its decoder blocks (no head, no loss) on CPU
under ``torch.autograd.graph.saved_tensors_hooks``, counting the distinct storages autograd saves (parameters out),
with 5 blocks less with 4: one block past the first adapted one (the first keeps less, its input needing no gradient).
Two adapter dtypes: PEFT's default (``autocast_adapter_dtype=True``: fp32 adapters beside a bf16 base, each
adapted layer casting its input to fp32 for ``lora_A``) and bf16 adapters. Printed per token per block, beside
trainplan's ``transformer.block_activation_bytes`` for the same job (precision bf16-pure, method lora). Needs
``transformers`` and ``peft`` (the ``qlora`` extra).

    python benchmarks/lora_saved_bytes.py --torchtune

The same block built by torchtune 0.6.1 (``lora_llama3``, its adapters in the model's bf16, base frozen by
``set_trainable_params``) against trainplan's ``stack: torchtune``.  torchtune needs torchao with its NF4 tensor
(0.14.1 imports on torch 2.13; later releases dropped it), so it lives in an environment of its own layered on this
one, as CI does for torchtitan: ``python -m venv /tmp/tune``, a ``.pth`` naming this environment's site-packages,
``/tmp/tune/bin/python -m pip install torchtune==0.6.1 torchao==0.14.1``, then run this script with that
interpreter and ``PYTHONPATH=src``.  torchtune's LoRA targets are q/k/v/output_proj and the whole MLP or none of it.

    python benchmarks/lora_saved_bytes.py --litgpt

The same for LitGPT 0.5.13 (``pip install litgpt==0.5.13`` in that environment, then ``huggingface-hub>=2.4`` again
for this environment's transformers).  ``--measure-json`` prints every torchtune and LitGPT measurement the tests
compare with; .ci/run builds that side environment (.ci-lora) and names it in $TRAINPLAN_LORA_STACKS_PYTHON.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

import torch

from trainplan.catalog import get_catalog
from trainplan.estimate.stack import effective_knobs
from trainplan.estimate.transformer import block_activation_bytes
from trainplan.hfconfig import arch_from_hf_config
from trainplan.spec import parse_job

CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False}  # fmt: skip
SEQ, BATCH, RANK = 64, 2, 8
TARGETS = (["q_proj"], ["o_proj"], ["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj"], ["gate_proj"],
           ["down_proj"], ["gate_proj", "up_proj", "down_proj"])  # fmt: skip


def measured(targets: list[str], *, fp32_adapters: bool, dropout: float = 0.0, config: dict | None = None) -> float:
    """Bytes one more block adds (5 blocks less 4): a block past the first adapted one, whose input needs a gradient.
    ``config``: another family's config of CONFIG's vocabulary (default: CONFIG's Llama)."""
    return (_saved(targets, fp32_adapters, dropout, layers=5, config=config)
            - _saved(targets, fp32_adapters, dropout, layers=4, config=config))  # fmt: skip


def _saved(targets: list[str], fp32_adapters: bool, dropout: float, *, layers: int, config: dict | None = None) -> int:
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = {**(config or CONFIG), "num_hidden_layers": layers}
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config),
                                                          attn_implementation="sdpa").to(torch.bfloat16)  # fmt: skip
    model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=targets, lora_dropout=dropout),
                           autocast_adapter_dtype=fp32_adapters)  # fmt: skip
    model.train()
    blocks = model.base_model.model.model  # the decoder blocks and the final norm
    embeds = blocks.embed_tokens(torch.randint(1, CONFIG["vocab_size"], (BATCH, SEQ))).detach()
    return saved_bytes(model, lambda: blocks(inputs_embeds=embeds))


def saved_bytes(module: torch.nn.Module, step: Callable[[], object]) -> int:
    """Bytes of the distinct storages autograd saves while ``step()`` runs ``module`` (its parameters excluded); what
    ``step`` returns is held until the count is taken, so no saved storage is freed and its address reused."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = step()  # noqa: F841 — held: its graph keeps every saved storage alive until the sum
        return sum(saved.values())


def loss_step_saved_bytes(cfg: dict, batch: int = 2, seq: int = 32) -> int:
    """Bytes autograd saves in a training forward pass with its loss of the bf16 model transformers builds from the
    config mapping ``cfg`` (CPU, a fixed seed, ``batch`` x ``seq`` tokens of ids below 101), with SDPA where the family
    has it and transformers' eager attention where it has not (Gemma 2, gpt-oss) — as the estimate's
    ``flash_attention: auto`` reads them. The tests compare two families of one shape by it."""
    import transformers

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**cfg)
    # built in bf16, as from_pretrained(dtype=torch.bfloat16) builds it: a module its family builds in fp32 whatever
    # the dtype (Hunyuan MoE's router) stays fp32, where casting a built model with .to() would not keep it
    try:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    except ValueError:  # "does not support an attention implementation through ... scaled_dot_product_attention"
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.bfloat16)
    ids = torch.randint(1, 101, (batch, seq))
    return saved_bytes(model, lambda: model(input_ids=ids, labels=ids).loss)


def predicted(targets: list[str], *, fp32_adapters: bool = True, dropout: float = 0.0, stack: str = "plain",
              config: dict | None = None) -> float:  # fmt: skip
    """trainplan's bytes for one block of the job (a stack other than plain takes its own adapters: no dtype knob)."""
    arch = arch_from_hf_config(config or CONFIG)
    knobs = {"lora_fp32_adapters": fp32_adapters} if stack == "plain" else {}
    job = parse_job({"kind": "transformer", "model": arch.model_dump(exclude_none=True), "seq_len": SEQ,
                     "micro_batch": BATCH, "precision": "bf16-pure", "steps": 1, "method": "lora", "stack": stack,
                     "lora": {"rank": RANK, "targets": targets, "dropout": dropout}, "knobs": knobs})  # fmt: skip
    return block_activation_bytes(job, arch, effective_knobs(job, get_catalog())) / arch.layers


# torchtune's attention targets, as trainplan names them
TORCHTUNE_NAMES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
TORCHTUNE_TARGETS = ((["q_proj"], False), (["output_proj"], False), (["q_proj", "v_proj"], False),
                     (["q_proj", "k_proj", "v_proj", "output_proj"], False), (["q_proj"], True),
                     (["q_proj", "k_proj", "v_proj", "output_proj"], True))  # fmt: skip


def measured_torchtune(attn: list[str], mlp: bool, *, dropout: float = 0.0, kv_heads: int = 2) -> float:
    """Bytes one more torchtune block adds (5 blocks less 4), as :func:`measured` does for PEFT."""
    return _saved_torchtune(attn, mlp, dropout, kv_heads, layers=5) - _saved_torchtune(attn, mlp, dropout, kv_heads, layers=4)


def _saved_torchtune(attn: list[str], mlp: bool, dropout: float, kv_heads: int, *, layers: int) -> int:
    from torchtune.models.llama3 import lora_llama3
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    torch.manual_seed(0)
    model = lora_llama3(attn, apply_lora_to_mlp=mlp, vocab_size=CONFIG["vocab_size"], num_layers=layers,
                        num_heads=CONFIG["num_attention_heads"], num_kv_heads=kv_heads, embed_dim=CONFIG["hidden_size"],
                        max_seq_len=SEQ, intermediate_dim=CONFIG["intermediate_size"], lora_rank=RANK,
                        lora_alpha=2 * RANK, lora_dropout=dropout).to(torch.bfloat16)  # fmt: skip
    set_trainable_params(model, get_adapter_params(model))
    model.train()
    embeds = model.tok_embeddings(torch.randint(1, CONFIG["vocab_size"], (BATCH, SEQ))).detach()

    def blocks() -> torch.Tensor:
        h = embeds
        for layer in model.layers:
            h = layer(h)
        return h

    return saved_bytes(model, blocks)


def torchtune_targets(attn: list[str], mlp: bool) -> list[str]:
    return [TORCHTUNE_NAMES[a] for a in attn] + (["gate_proj", "up_proj", "down_proj"] if mlp else [])


def main_torchtune(per: int) -> None:
    print("torchtune 0.6.1 LoRALinear, bf16 (bytes per token per block)")
    print(f"{'targets':48} {'torchtune':>10} {'trainplan':>10} {'err':>7}")
    for attn, mlp in TORCHTUNE_TARGETS:
        targets = torchtune_targets(attn, mlp)
        m, p = measured_torchtune(attn, mlp) / per, predicted(targets, stack="torchtune") / per
        print(f"{'+'.join(targets):48} {m:10.0f} {p:10.0f} {p / m - 1:+7.1%}")


# LitGPT's LoRA switches (lora_query, lora_key, lora_value, lora_projection, lora_mlp) and trainplan's names for them
LITGPT_TARGETS = (((True, False, False, False, False), ["q_proj"]), ((False, False, False, True, False), ["o_proj"]),
                  ((True, False, True, False, False), ["q_proj", "v_proj"]),
                  ((True, True, True, True, False), ["q_proj", "k_proj", "v_proj", "o_proj"]),
                  ((False, False, False, False, True), ["gate_proj", "up_proj", "down_proj"]),
                  ((True, True, True, True, True), ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                    "down_proj"]))  # fmt: skip


def measured_litgpt(switches: tuple[bool, ...], *, kv_heads: int = 2) -> float:
    """Bytes one more LitGPT block adds (5 blocks less 4): ``litgpt.lora.GPT`` (its fused QKV linear with
    ``LoRAQKVLinear``), bf16, ``mark_only_lora_as_trainable``."""
    return _saved_litgpt(switches, kv_heads, layers=5) - _saved_litgpt(switches, kv_heads, layers=4)


def _saved_litgpt(switches: tuple[bool, ...], kv_heads: int, *, layers: int) -> int:
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

    torch.manual_seed(0)
    q, k, v, proj, mlp = switches
    config = Config(n_layer=layers, n_head=CONFIG["num_attention_heads"], n_embd=CONFIG["hidden_size"],
                    n_query_groups=kv_heads, intermediate_size=CONFIG["intermediate_size"], mlp_class_name="LLaMAMLP",
                    norm_class_name="RMSNorm", bias=False, padded_vocab_size=CONFIG["vocab_size"],
                    vocab_size=CONFIG["vocab_size"], block_size=SEQ, rotary_percentage=1.0, parallel_residual=False,
                    lora_r=RANK, lora_alpha=2 * RANK, lora_query=q, lora_key=k, lora_value=v, lora_projection=proj,
                    lora_mlp=mlp, lora_head=False)  # fmt: skip
    model = GPT(config).to(torch.bfloat16)
    mark_only_lora_as_trainable(model)
    model.train()
    embeds = model.transformer.wte(torch.randint(1, CONFIG["vocab_size"], (BATCH, SEQ))).detach()
    cos, sin = (c[:SEQ].to(torch.bfloat16).unsqueeze(0) for c in model.rope_cache())

    def blocks() -> torch.Tensor:
        h = embeds
        for block in model.transformer.h:
            h = block(h, cos, sin)
        return h

    return saved_bytes(model, blocks)


def main_litgpt(per: int) -> None:
    print("LitGPT LoRA (lora.GPT), bf16 (bytes per token per block); MHA: the same block with 8 KV heads")
    print(f"{'targets':56} {'LitGPT':>8} {'trainplan':>10} {'err':>7} {'MHA':>8} {'trainplan':>10} {'err':>7}")
    mha_config = {**CONFIG, "num_key_value_heads": CONFIG["num_attention_heads"]}
    for switches, targets in LITGPT_TARGETS:
        m, p = measured_litgpt(switches) / per, predicted(targets, stack="litgpt") / per
        mm = measured_litgpt(switches, kv_heads=CONFIG["num_attention_heads"]) / per
        mp = predicted(targets, stack="litgpt", config=mha_config) / per
        print(f"{'+'.join(targets):56} {m:8.0f} {p:10.0f} {p / m - 1:+7.1%} {mm:8.0f} {mp:10.0f} {mp / mm - 1:+7.1%}")


def side_measurements() -> dict[str, float]:
    """Every measurement tests/estimate/test_lora_saves.py compares with, keyed by :func:`measurement_key`: torchtune's
    blocks (with 2 and 8 KV heads, and with dropout) and LitGPT's (with 2 and 8 KV heads).  Printed as JSON by
    ``--measure-json``, which the tests run with the side environment's interpreter ($TRAINPLAN_LORA_STACKS_PYTHON)."""
    out: dict[str, float] = {}
    heads = CONFIG["num_attention_heads"]
    for attn, mlp in TORCHTUNE_TARGETS:
        if "output_proj" in attn:
            continue
        for dropout, kv in ((0.0, 2), (0.0, heads), (0.1, 2)):
            out[measurement_key("torchtune", torchtune_targets(attn, mlp), dropout, kv)] = measured_torchtune(
                attn, mlp, dropout=dropout, kv_heads=kv)  # fmt: skip
    for switches, targets in LITGPT_TARGETS:
        for kv in (2, heads):
            out[measurement_key("litgpt", targets, 0.0, kv)] = measured_litgpt(switches, kv_heads=kv)
    return out


def measurement_key(stack: str, targets: list[str], dropout: float, kv_heads: int) -> str:
    return f"{stack}|{'+'.join(targets)}|{dropout:g}|{kv_heads}"


def main() -> None:
    warnings.filterwarnings("ignore")
    per = SEQ * BATCH
    if "--measure-json" in sys.argv[1:]:
        import json

        print(json.dumps(side_measurements()))
        return
    if "--torchtune" in sys.argv[1:]:
        main_torchtune(per)
        return
    if "--litgpt" in sys.argv[1:]:
        main_litgpt(per)
        return
    print(f"bytes per token per block (hidden {CONFIG['hidden_size']}, SwiGLU {CONFIG['intermediate_size']}, rank {RANK})")
    print(f"{'targets':28} {'PEFT fp32':>10} {'trainplan':>10} {'err':>7} {'PEFT bf16':>10} {'trainplan':>10} {'err':>7}")
    for targets in TARGETS:
        f, pf = measured(targets, fp32_adapters=True) / per, predicted(targets) / per
        b, pb = measured(targets, fp32_adapters=False) / per, predicted(targets, fp32_adapters=False) / per
        print(f"{'+'.join(targets):28} {f:10.0f} {pf:10.0f} {pf / f - 1:+7.1%} {b:10.0f} {pb:10.0f} {pb / b - 1:+7.1%}")


if __name__ == "__main__":
    main()
