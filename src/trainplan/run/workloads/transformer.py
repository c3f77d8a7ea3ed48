"""Built-in workload for ``kind: transformer``: a causal LM, pretrained or from the job's architecture.

``model: ./checkpoint`` (a directory as ``save_pretrained`` writes it): the
checkpoint's weights, trained on the job's data tokenized by its tokenizer
(:mod:`.textdata`, prepared by the parent process), saved back to ``DIR/final/``
(:mod:`.pretrained`).

Otherwise the model is a Hugging Face ``transformers`` model with random weights (seeded
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

from trainplan.catalog import get_catalog
from trainplan.errors import SpecError
from trainplan.estimate.stack import effective_knobs
from trainplan.run.workloads.checks import attention, check_random_init_split, check_supported, resolve_arch
from trainplan.run.workloads.common import NeuralWorkload, batch_generator, parameter_count
from trainplan.model import ModelArch
from trainplan.run.config import RunConfig
from trainplan.strategies import Engine
from trainplan.model import hf_config as model_hf_config
from trainplan.spec import Checkpointing, Method, Precision, TransformerJob


def hf_config(arch: ModelArch, seq_len: int) -> Any:
    """The ``transformers`` config of ``arch`` — the one mapping (``trainplan.model.hf_config``) the trace builds too."""
    from transformers import AutoConfig

    kwargs = model_hf_config(arch, seq_len)
    return AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)


def lora_targets(job: TransformerJob, arch: ModelArch) -> Any:
    """peft's ``target_modules`` for the job's LoRA targets."""
    assert job.lora_spec is not None
    if arch.position == "learned":  # GPT-2 names its projections differently
        return ["c_attn", "c_proj", "c_fc"]
    return "all-linear" if "all-linear" in job.lora_spec.targets else list(job.lora_spec.targets)


def finish_model(model: torch.nn.Module, job: TransformerJob, arch: ModelArch) -> torch.nn.Module:
    """Activation checkpointing and LoRA adapters as the job says."""
    if job.activation_checkpointing is not Checkpointing.NONE:
        # what the trace of the same job does (estimate/trace/checkpointing.py): full recomputes every layer;
        # selective saves the matmul and attention outputs and recomputes the cheap ops between them (PyTorch's
        # selective activation checkpointing, torchtitan's "op" mode) — it used to recompute everything, as full
        from trainplan.estimate.trace.checkpointing import apply_activation_checkpointing

        apply_activation_checkpointing(model, job.activation_checkpointing,
                                       effective_knobs(job, get_catalog()).checkpoint_fraction)
    lora = job.lora_spec
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha or 2 * lora.rank,
                                                 lora_dropout=lora.dropout, target_modules=lora_targets(job, arch)))
    return model


def build_model(job: TransformerJob, arch: ModelArch) -> torch.nn.Module:
    """The randomly initialised causal LM, with LoRA adapters and activation checkpointing as the job says."""
    from transformers import AutoModelForCausalLM

    config = hf_config(arch, job.seq_len)
    torch.manual_seed(job.seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention(job, arch))
    return finish_model(model, job, arch)


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
    total = parameter_count(model)
    embeddings = arch.vocab * arch.hidden
    if arch.position == "learned":
        embeddings += max(seq_len, arch.max_seq_len or 0) * arch.hidden
    n = total - embeddings + (arch.vocab * arch.hidden if arch.tied_embeddings or arch.position == "learned" else 0)
    head_dim = arch.head_dim or arch.hidden // arch.heads
    return 6.0 * n + 12.0 * arch.layers * arch.heads * head_dim * seq_len


def load_dtype(job: TransformerJob, config: RunConfig) -> torch.dtype:
    """The dtype the checkpoint is loaded in: fp32 master weights, except a frozen LoRA base on a GPU in
    16-bit precision (kept in that 16-bit type, as the estimate counts it) and bf16-pure."""
    if config.precision is Precision.BF16_PURE:
        return torch.bfloat16
    if job.method is not Method.FULL and config.accelerator.value == "cuda":
        if config.precision is Precision.BF16:
            return torch.bfloat16
        if config.precision is Precision.FP16:
            return torch.float16
    return torch.float32


def pretrained_workload(job: TransformerJob, checkpoint: Path, config: RunConfig) -> NeuralWorkload:
    """A checkpoint fine-tuned on the job's tokenized data (``DIR/data``, written by the parent)."""
    from trainplan.run.workloads import pretrained, textdata

    arch = resolve_arch(job)
    check_supported(job, arch)
    dtype = load_dtype(job, config)
    attn = attention(job, arch)
    torch.manual_seed(job.seed)  # LoRA adapters are drawn from the global generator: the same on every rank and run
    out = Path(config.out_dir)
    files = pretrained._weight_files(checkpoint)
    materialize = None
    note = "whole on every rank (from_pretrained)"
    if config.strategy.engine is Engine.FSDP and config.world_size > 1:
        model = finish_model(pretrained.build_on_meta(checkpoint, dtype, attention=attn), job, arch)
        if pretrained.sharded_loading_possible(model, files):
            def materialize(m: torch.nn.Module, device: torch.device) -> None:
                pretrained.materialize_sharded(m, files, device, job.seed)

            note = "sharded: built on meta, each rank read its rows of each tensor"
        else:  # names differ from the checkpoint's (a converted layout): load it whole on every rank
            model = finish_model(pretrained.load_full(checkpoint, dtype, attention=attn), job, arch)
    elif config.strategy.engine is Engine.DEEPSPEED and config.strategy.shards_parameters and config.deepspeed:
        model = finish_model(pretrained.load_partitioned(checkpoint, dtype, config.deepspeed, attention=attn), job, arch)
        note = "partitioned as created (deepspeed.zero.Init)"
    elif job.method is Method.QLORA:  # single or DDP (checks.QLORA_STRATEGIES): the 4-bit base whole on each rank
        from trainplan.run.runtime.process import ProcessInfo, choose_device

        device = choose_device(config.accelerator, ProcessInfo.from_env().local_rank)
        base = pretrained.load_full(checkpoint, dtype, quantize_on=device, attention=attn)
        from trainplan.catalog import get_catalog
        from trainplan.estimate.stack import effective_knobs

        if effective_knobs(job, get_catalog()).qlora_fp32_params:  # the job's stack (or knob) does, as estimated
            pretrained.cast_unquantized_to_fp32(base)
        model = finish_model(base, job, arch)
        for module in model.modules():
            if getattr(module, "support_avx512bf16_for_cpu", False):
                # bitsandbytes (0.48+) repacks a CPU weight for its bf16 inference kernel at the first forward in
                # eval mode without gradients — in place, for good: the eval loss would change the training that
                # follows it.  One kernel (de-quantize, then matmul in the compute dtype) for both.
                module.support_avx512bf16_for_cpu = False
        note = f"whole on every rank, linear weights quantized to 4-bit NF4 on {device.type} (bitsandbytes)"
    else:
        model = finish_model(pretrained.load_full(checkpoint, dtype, attention=attn), job, arch)
    model.train()  # from_pretrained returns a model in eval mode: dropout trains as the Trainer trains it
    train, evaluation = textdata.read_cache(out)
    sampler = textdata.RowSampler(train, seed=job.seed, world_size=config.world_size,
                                  micro_batch=config.micro_batch, grad_accum=config.grad_accum)

    def loss(model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(**inputs).loss

    evaluate = None
    if evaluation is not None:
        def evaluate(model: Any, ctx: Any) -> float:
            return eval_loss(model, ctx, evaluation, config.micro_batch)

    lora = job.lora_spec
    targets = lora_targets(job, arch) if lora is not None else None

    def save_final(state: dict[str, torch.Tensor]) -> Path:
        return pretrained.save_final(state, checkpoint, out, lora=lora, lora_targets=targets)

    return NeuralWorkload(
        model=model,
        batch=sampler.batch,
        loss=loss,
        tokens_per_sample=job.seq_len,
        flops_per_token=flops_per_token(model, arch, job.seq_len),
        materialize=materialize,
        evaluate=evaluate,
        eval_every=job.data_format.eval_every if job.data_format else None,
        save_final=save_final,
        load_note=note,
    )


def eval_loss(model: Any, ctx: Any, rows: Any, micro_batch: int) -> float:
    """Collective: mean cross-entropy per target token over every eval row (rows striped over the ranks).

    Every rank runs the same number of forward passes (FSDP and ZeRO-3 gather
    parameters collectively); a rank past the end repeats row 0 with weight 0.
    """
    from trainplan.run.workloads.textdata import IGNORE

    n, world, rank = rows.rows, ctx.world_size, ctx.rank
    passes = -(-n // (world * micro_batch))
    total = torch.zeros(2, dtype=torch.float64)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(passes):
            first = (i * world + rank) * micro_batch
            idx = [j if j < n else 0 for j in range(first, first + micro_batch)]
            weight = torch.tensor([1.0 if j < n else 0.0 for j in range(first, first + micro_batch)])
            ids = rows.input_ids[idx].long().to(ctx.device)
            labels = rows.labels[idx].long()
            with ctx.autocast():
                logits = model(input_ids=ids).logits
            targets = labels[:, 1:]
            per_token = torch.nn.functional.cross_entropy(
                logits[:, :-1].float().cpu().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                ignore_index=IGNORE, reduction="none").view(targets.shape)
            keep = (targets != IGNORE).float() * weight[:, None]
            total += torch.tensor([float((per_token * keep).sum()), float(keep.sum())], dtype=torch.float64)
    if was_training:
        model.train()
    if ctx.distributed:
        from trainplan.run.runtime import process

        t = total.to(process.collective_device(ctx.device))
        torch.distributed.all_reduce(t)
        total = t.cpu()
    return float(total[0] / total[1]) if total[1] > 0 else float("nan")


def transformer_workload(job: TransformerJob, *, world_size: int, micro_batch: int,
                         config: RunConfig | None = None) -> NeuralWorkload:
    """Model, batches and loss of a transformer job."""
    from trainplan.run.workloads.pretrained import checkpoint_path

    checkpoint = checkpoint_path(job.model)
    if config is not None:
        split = next((flag for flag, degree in (("--tp", config.tp), ("--pp", config.pp), ("--ep", config.ep))
                      if degree > 1), None)  # fmt: skip
        check_random_init_split(checkpoint, split)
    if checkpoint is not None:
        if config is None:
            raise ValueError("a pretrained checkpoint is trained through trainplan run (it needs the run's config)")
        return pretrained_workload(job, checkpoint, config)
    arch = resolve_arch(job)
    check_supported(job, arch)
    model = build_model(job, arch)
    source = TokenSource(job.data, arch.vocab, job.seq_len, job.seed)

    sequence_parallel = bool(config is not None and config.sequence_parallel)

    def batch(step: int, micro: int, rank: int) -> dict[str, torch.Tensor]:
        ids = source.batch(micro_batch, step, micro, rank)
        if sequence_parallel:  # the embedding's output is sequence-sharded: positions come from the full sequence
            return {"input_ids": ids, "labels": ids, "position_ids": torch.arange(ids.shape[1]).unsqueeze(0)}
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
