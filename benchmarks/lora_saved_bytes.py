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
"""

from __future__ import annotations

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


def measured(targets: list[str], *, fp32_adapters: bool, dropout: float = 0.0) -> float:
    """Bytes one more block adds (5 blocks less 4): a block past the first adapted one, whose input needs a gradient."""
    return _saved(targets, fp32_adapters, dropout, layers=5) - _saved(targets, fp32_adapters, dropout, layers=4)


def _saved(targets: list[str], fp32_adapters: bool, dropout: float, *, layers: int) -> int:
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = {**CONFIG, "num_hidden_layers": layers}
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


def predicted(targets: list[str], *, fp32_adapters: bool = True, dropout: float = 0.0) -> float:
    arch = arch_from_hf_config(CONFIG)
    job = parse_job({"kind": "transformer", "model": arch.model_dump(exclude_none=True), "seq_len": SEQ,
                     "micro_batch": BATCH, "precision": "bf16-pure", "steps": 1, "method": "lora",
                     "lora": {"rank": RANK, "targets": targets, "dropout": dropout},
                     "knobs": {"lora_fp32_adapters": fp32_adapters}})  # fmt: skip
    return block_activation_bytes(job, arch, effective_knobs(job, get_catalog())) / CONFIG["num_hidden_layers"]


def main() -> None:
    warnings.filterwarnings("ignore")
    per = SEQ * BATCH
    print(f"bytes per token per block (hidden {CONFIG['hidden_size']}, SwiGLU {CONFIG['intermediate_size']}, rank {RANK})")
    print(f"{'targets':28} {'PEFT fp32':>10} {'trainplan':>10} {'err':>7} {'PEFT bf16':>10} {'trainplan':>10} {'err':>7}")
    for targets in TARGETS:
        f, pf = measured(targets, fp32_adapters=True) / per, predicted(targets) / per
        b, pb = measured(targets, fp32_adapters=False) / per, predicted(targets, fp32_adapters=False) / per
        print(f"{'+'.join(targets):28} {f:10.0f} {pf:10.0f} {pf / f - 1:+7.1%} {b:10.0f} {pb:10.0f} {pb / b - 1:+7.1%}")


if __name__ == "__main__":
    main()
