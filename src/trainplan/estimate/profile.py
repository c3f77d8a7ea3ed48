"""The step profile: what one training step of a job costs, before any hardware or strategy.

Two producers make one: the analytic formulas (``estimate/transformer.py``)
and the trace of the real model (``estimate/torchjob.py``).  One consumer
applies hardware × strategy to any profile (``estimate/compose.py``).  A new
way to learn a job's step (another framework, a measured profile) only has to
produce a :class:`StepProfile`; a new strategy or hardware kind only changes
the composer.

All quantities are for one micro-batch on one device, as plain PyTorch would
run it: fp32 master weights under AMP, nothing sharded, nothing offloaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from trainplan.estimate.compute import StepFlops
from trainplan.estimate.parallel import ModelSplit
from trainplan.strategies import Engine


class ProfileSource(str, Enum):
    ANALYTIC = "analytic"  # formulas over the architecture (docs/estimates.md)
    TRACE = "trace"  # one real step of the model on the fake device (docs/trace.md)


@dataclass(frozen=True)
class Params:
    """Parameters by trainability and storage."""

    total: int
    trainable: int
    frozen_bytes: float  # storage of the frozen weights (LoRA/QLoRA base), unsharded
    # Optimizer state elements per trainable parameter where the shapes decide it (Adafactor's factored second
    # moment; Muon's one buffer on hidden matrices beside AdamW's two on the rest); 0 means: the optimizer's fixed
    # count (memory.optimizer_state_elems_per_param).
    shaped_state_elems: float = 0.0
    # FLOPs of one optimizer step on every rank that steps the whole model (Muon's Newton-Schulz iterations); 0 for
    # optimizers that only stream their state
    optimizer_flops: float = 0.0
    largest_block: int = 0  # parameters of the unit FSDP / ZeRO-3 gather at once
    largest_tensor: int = 0  # parameters of the largest single weight (its gradient is what an in-backward step holds)
    # the part of frozen_bytes kept in fp32 under mixed precision (knobs.frozen_weights_fp32); a DeepSpeed engine
    # casts the whole module to its 16-bit type, so there it counts half
    frozen_fp32_bytes: float = 0.0

    @property
    def frozen(self) -> int:
        return self.total - self.trainable


@dataclass(frozen=True)
class StepMemory:
    """Bytes of one micro-batch step by category, on one device (plain PyTorch conventions)."""

    activations: float  # kept from forward for backward on the device, the logits and loss included
    autocast_copies: float = 0.0  # 16-bit weight copies AMP autocast caches over fp32 weights (PyTorch engine only)
    optimizer_temporaries: float = 0.0  # foreach temporaries of the optimizer step, unsharded
    forward_temporaries: float = 0.0  # transient buffers of the forward pass (dequantised 4-bit weights)
    host_activations: float = 0.0  # activations offloaded to host RAM (per rank)
    transient_gradients: bool = False  # the optimizer steps inside backward: gradients never accumulate
    pageable_optimizer_state: bool = False  # paged 8-bit optimizer: its state pages out to host RAM under pressure
    # FSDP only (the composer applies them to fsdp strategies, memory.model_state_bytes): gradients FSDP allocates
    # for frozen weights sharing a unit with trainable ones (knobs.frozen_weight_gradients), unsharded bytes;
    # and whether gradient accumulation keeps the gradients unsharded (knobs.unsharded_accumulation)
    frozen_gradient_bytes: float = 0.0
    unsharded_accumulation: bool = False
    # the caching allocator's reserve beyond the allocated peak of this step on one device, in bytes, when
    # simulated (a traced profile: estimate/allocator.py over the trace's allocations); None: the catalog's fraction
    reserve_bytes: float | None = None
    expandable_reserve_bytes: float | None = None
    single_device_peak: float | None = None  # the traced allocated peak those bytes belong to
    # on CPUs: what glibc's heap keeps resident beyond the live tensors (a trace for a CPU target: estimate/heap.py
    # over the traced step repeated); None: not simulated
    heap_retention_bytes: float | None = None


@dataclass(frozen=True)
class EagerOps:
    """What an eager step dispatches, from a trace (``trace/flops.py``): operators, and the bytes the memory-bound
    ones (no FLOP formula, not views) read and write; per micro-step (forward + backward) and per optimizer step;
    and the shares of the micro-step's FLOPs in convolutions and in fused recurrent layers."""

    ops: float
    memory_bytes: float
    optimizer_ops: float
    optimizer_memory_bytes: float
    conv_flops: float = 0.0
    rnn_flops: float = 0.0


@dataclass(frozen=True)
class StepProfile:
    """One micro-batch training step of a job: parameters, FLOPs and memory, hardware-free."""

    source: ProfileSource
    params: Params
    flops: StepFlops  # one micro-batch, by phase (compute.py)
    memory: StepMemory
    items_per_sample: int = 1  # tokens per sample (seq_len) for language models, else 1
    throughput_unit: str = "samples_per_s"  # "tokens_per_s" | "samples_per_s"
    mfu_width: int | None = None  # model width for the default efficiency curve; None: the traced default MFU
    notes: tuple[str, ...] = ()
    engines: tuple[Engine, ...] = (Engine.TORCH, Engine.FSDP, Engine.DEEPSPEED)  # what the job's stack can run on
    stack: str = "plain"
    trace: dict[str, Any] | None = field(default=None, compare=False)  # the traced single-device step, for reports
    eager: EagerOps | None = None  # a traced profile's operators (the CPU time model prices them); None: analytic
    # what tensor / pipeline / context / expert parallelism divides (analytic transformer profiles only;
    # estimate/parallel.py); None: the profile is planned data parallel only
    split: ModelSplit | None = None
    # the job's PyTorch optimizer is the default multi-tensor (foreach) one, not a fused kernel nor one stepping inside
    # backward (the stack's knobs, catalog/data/stacks.yaml): its step moves more bytes (steptime.optimizer_bytes_touched)
    foreach_optimizer: bool = False
    tf32_matmul: bool = False  # fp32 matmuls on TF32 tensor cores (knobs.tf32_matmul)
    # the share of the parameters FSDP all-gathers in FP8 (knobs.fp8_all_gather: the float8 linears' weights)
    fp8_gather_fraction: float = 0.0

    # Names the tests and reports know from the trace result.
    @property
    def trainable_params(self) -> int:
        return self.params.trainable
