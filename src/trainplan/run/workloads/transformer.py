"""Built-in workload for ``kind: transformer``: a causal LM from the job's architecture.

The model is a Hugging Face ``transformers`` model with random weights (seeded
by the job's ``seed``): Llama-style (``LlamaForCausalLM``) for rotary
positions, GPT-2-style (``GPT2LMHeadModel``) for learned positions.  Training
text is a local file read as bytes (token = byte value, folded into the
vocabulary when it has fewer than 256 entries) or, for ``data: synthetic``
(the default), uniformly random tokens.

Batches are a pure function of ``(seed, step, micro-batch, rank)``: a run
resumed from a checkpoint sees exactly the batches it would have seen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainplan.errors import SpecError
from trainplan.run.workloads.checks import check_supported, resolve_arch
from trainplan.run.workloads.common import NeuralWorkload, batch_generator
from trainplan.model import ModelArch
from trainplan.model import hf_config as model_hf_config
from trainplan.spec import Checkpointing, TransformerJob


def hf_config(arch: ModelArch, seq_len: int) -> Any:
    """The ``transformers`` config of ``arch`` — the one mapping (``trainplan.model.hf_config``) the trace builds too."""
    from transformers import AutoConfig

    kwargs = model_hf_config(arch, seq_len)
    return AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)


def build_model(job: TransformerJob, arch: ModelArch) -> torch.nn.Module:
    """The randomly initialised causal LM, with LoRA adapters and activation checkpointing as the job says."""
    from transformers import AutoModelForCausalLM

    config = hf_config(arch, job.seq_len)
    torch.manual_seed(job.seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if job.activation_checkpointing is not Checkpointing.NONE:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = job.lora_spec
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        targets: Any = "all-linear" if "all-linear" in lora.targets else list(lora.targets)
        if arch.position == "learned":  # GPT-2 names its projections differently
            targets = ["c_attn", "c_proj", "c_fc"]
        model = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha or 2 * lora.rank, target_modules=targets))
    return model


class TokenSource:
    """Token batches from a byte file, or synthetic uniform tokens."""

    def __init__(self, data: str | None, vocab: int, seq_len: int, seed: int) -> None:
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed
        self.tokens: torch.Tensor | None = None
        if data not in (None, "synthetic"):
            path = Path(str(data))
            raw = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).to(torch.int64)
            if raw.numel() < seq_len + 1:
                raise SpecError(f"{path} has {raw.numel()} bytes; needs at least seq_len + 1 = {seq_len + 1}", field="data")
            self.tokens = raw % vocab if vocab < 256 else raw

    def batch(self, rows: int, *key: int) -> torch.Tensor:
        """``rows`` sequences of ``seq_len`` tokens for the batch named by ``key``."""
        gen = batch_generator(self.seed, *key)
        if self.tokens is None:
            return torch.randint(0, self.vocab, (rows, self.seq_len), generator=gen)
        starts = torch.randint(0, self.tokens.numel() - self.seq_len, (rows,), generator=gen)
        return torch.stack([self.tokens[s : s + self.seq_len] for s in starts.tolist()])


def flops_per_token(model: torch.nn.Module, arch: ModelArch, seq_len: int) -> float:
    """Training FLOPs per token: 6·N + 12·L·H·Q·T (Chowdhery et al. 2022, PaLM, App. B).

    N counts the parameters that do matrix multiplies: everything except the
    input embeddings (and learned position embeddings); a tied output head
    still multiplies, so it is counted.
    """
    total = sum(p.numel() for p in model.parameters())
    embeddings = arch.vocab * arch.hidden
    if arch.position == "learned":
        embeddings += max(seq_len, arch.max_seq_len or 0) * arch.hidden
    n = total - embeddings + (arch.vocab * arch.hidden if arch.tied_embeddings or arch.position == "learned" else 0)
    head_dim = arch.head_dim or arch.hidden // arch.heads
    return 6.0 * n + 12.0 * arch.layers * arch.heads * head_dim * seq_len


def transformer_workload(job: TransformerJob, *, world_size: int, micro_batch: int) -> NeuralWorkload:
    """Model, batches and loss of a transformer job."""
    arch = resolve_arch(job)
    check_supported(job, arch)
    model = build_model(job, arch)
    source = TokenSource(job.data, arch.vocab, job.seq_len, job.seed)

    def batch(step: int, micro: int, rank: int) -> dict[str, torch.Tensor]:
        ids = source.batch(micro_batch, step, micro, rank)
        return {"input_ids": ids, "labels": ids}

    def loss(model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(**inputs).loss

    return NeuralWorkload(
        model=model,
        batch=batch,
        loss=loss,
        tokens_per_sample=job.seq_len,
        flops_per_token=flops_per_token(model, arch, job.seq_len),
    )
