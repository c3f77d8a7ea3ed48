"""The job specification: what the user wants to train.

A job file (YAML) is parsed and validated once, here, at the edge.  Everything
downstream receives a frozen, typed :class:`Job` (one of
:class:`TransformerJob`, :class:`TabularJob`, :class:`TorchJob`).  Every
rejection is a :class:`~trainplan.errors.SpecError` whose message names the
field and what is allowed.
"""

from __future__ import annotations

import difflib
import math
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainplan.catalog import Catalog, resolve_model
from trainplan.catalog.loader import RELEASE_PATTERN
from trainplan.errors import SpecError
from trainplan.model import STRICT, ModelArch, NonNegativeInt, PositiveFloat, PositiveInt
from trainplan.zoo import FACTORY, ZOO, check_resolution

# --------------------------------------------------------------------------- enums


class JobKind(str, Enum):
    TRANSFORMER = "transformer"
    TABULAR = "tabular"
    TORCH = "torch"
    KERAS = "keras"
    SCRIPT = "script"  # the user's own training script (trainplan run --script); no model to plan


class Task(str, Enum):
    PRETRAIN = "pretrain"
    FINETUNE = "finetune"


class Method(str, Enum):
    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"


class Precision(str, Enum):
    FP32 = "fp32"
    FP16 = "fp16"  # mixed: fp32 master weights, fp16 compute
    BF16 = "bf16"  # mixed: fp32 master weights, bf16 compute
    BF16_PURE = "bf16-pure"  # weights, gradients and optimizer state in bf16
    # bf16 mixed precision with the linear layers' GEMMs in FP8 (torchao float8 dynamic scaling, as torchtitan trains;
    # Transformer Engine likewise): master weights, optimizer, attention and the rest as bf16
    FP8 = "fp8"

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of activations and compute-dtype weights."""
        return 4 if self is Precision.FP32 else 2

    @property
    def mixed(self) -> bool:
        return self in (Precision.FP16, Precision.BF16, Precision.FP8)

    @property
    def half(self) -> str | None:
        """The 16-bit format the tensor cores must support, if any."""
        return {Precision.FP16: "fp16", Precision.BF16: "bf16", Precision.BF16_PURE: "bf16", Precision.FP8: "bf16"}.get(self)


class Optimizer(str, Enum):
    ADAMW = "adamw"
    ADAM8BIT = "adam8bit"
    SGD = "sgd"
    ADAFACTOR = "adafactor"
    LION = "lion"
    # torch.optim.Muon on the hidden 2-D weight matrices, torch.optim.AdamW on the rest (embeddings, output head,
    # norms, biases, 3-D expert tensors): the split torch.optim.Muon's documentation prescribes
    MUON = "muon"


class Checkpointing(str, Enum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class FlashAttention(str, Enum):
    AUTO = "auto"
    TRUE = "true"
    FALSE = "false"


class Stack(str, Enum):
    """The software that trains the job; it decides defaults that change memory (catalog/data/stacks.yaml)."""

    PLAIN = "plain"  # eager PyTorch, as `trainplan run` trains
    HF_TRAINER = "hf-trainer"
    TORCHTUNE = "torchtune"
    LITGPT = "litgpt"
    LLM_FOUNDRY = "llm-foundry"
    ACCELERATE = "accelerate"
    LIGHTNING = "lightning"
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"


class LossImpl(str, Enum):
    """How the language-model loss is computed over the vocabulary."""

    FULL = "full"  # the whole logits tensor up-cast to fp32, then cross-entropy
    CHUNKED = "chunked"  # up-cast and cross-entropy one chunk of tokens at a time
    FUSED = "fused"  # a fused cross-entropy kernel over 16-bit logits (no fp32 copy)
    FUSED_LINEAR = "fused-linear"  # output projection and loss fused: logits never materialised


class FusedKernels(str, Enum):
    """Triton kernels a stack patches into the model (their saved tensors differ from eager PyTorch's)."""

    NONE = "none"
    LIGER = "liger"  # Liger Kernel: RMSNorm, SwiGLU, RoPE and fused linear cross-entropy
    UNSLOTH = "unsloth"  # Unsloth: RMSNorm, SwiGLU / LoRA MLP, RoPE and its cross-entropy kernel


class SelectiveRecompute(str, Enum):
    """What ``activation_checkpointing: selective`` keeps for backward — it differs between the stacks that offer it."""

    ATTENTION_CORE = "attention-core"  # Korthikanti et al. 2022 Sec. 4.2, Megatron-LM --recompute-granularity selective
    MATMUL_OUTPUTS = "matmul-outputs"  # PyTorch selective checkpointing keeping every matmul and attention output
    ALTERNATE_MATMULS = "alternate-matmuls"  # torchtitan's "op" mode: attention outputs and every other matmul's


class RecomputeModule(str, Enum):
    """Megatron-Core's ``recompute_modules`` (``--recompute-granularity selective --recompute-modules …``): the
    submodules a selective layer recomputes (``TransformerConfig.recompute_modules``; default ``["core_attn"]``)."""

    CORE_ATTN = "core_attn"  # the attention core (Korthikanti et al. 2022, Sec. 4.2)
    LAYERNORM = "layernorm"  # input_layernorm / pre_mlp_layernorm outputs, discarded and recomputed
    MOE_ACT = "moe_act"  # the routed experts' activation function, its output discarded and recomputed
    MLP = "mlp"  # a dense layer's whole MLP, checkpointed
    MOE = "moe"  # an MoE layer's router, experts and shared experts, checkpointed
    SHARED_EXPERTS = "shared_experts"  # an MoE layer's shared experts, checkpointed


class StackKnobs(BaseModel):
    """Explicit settings that override the stack's defaults (each ``None`` = the stack's default)."""

    model_config = STRICT
    loss: LossImpl | None = None
    loss_chunks: PositiveInt | None = None  # chunks of the sequence (chunked loss)
    loss_chunk_tokens: PositiveInt | None = None  # or tokens per chunk (LitGPT's lm_head_chunk_size)
    compile: bool | None = None
    optimizer_in_backward: bool | None = None
    activation_offloading: bool | None = None
    fused_optimizer: bool | None = None
    paged_optimizer: bool | None = None
    unsharded_accumulation: bool | None = None  # FSDP: accumulation keeps unsharded gradients (no_sync)
    frozen_weight_gradients: bool | None = None  # FSDP: units mixing frozen and trainable weights give both gradients
    frozen_weights_fp32: bool | None = None  # mixed precision: the frozen (LoRA) base is stored in fp32, autocast casts it
    loss_upcast: bool | None = None  # the loss up-casts 16-bit logits to fp32 even without autocast
    qlora_fp32_params: bool | None = None  # QLoRA: unquantised parameters cast to fp32 (PEFT prepare_model_for_kbit_training)
    fused_kernels: FusedKernels | None = None  # Liger / Unsloth Triton kernels in place of eager norms and MLP
    # fp32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32 = True, or
    # torch.set_float32_matmul_precision("high")); PyTorch leaves it off by default since 1.12
    tf32_matmul: bool | None = None
    # precision fp8 under FSDP: the float8 linears' weights are all-gathered in FP8, cast on each rank's shard (torchao
    # Float8LinearConfig.enable_fsdp_float8_all_gather; torchtitan's float8 enable_fsdp_float8_all_gather, off by default)
    fp8_all_gather: bool | None = None
    # activation_checkpointing: selective — which outputs a checkpointed block keeps (SelectiveRecompute)
    selective_recompute: SelectiveRecompute | None = None
    # MoE: the routed experts' outputs are combined by a bmm over an fp32 copy of them (torchtitan's MoE), which keeps
    # that copy for backward instead of the 16-bit outputs transformers' routing-weight product keeps
    moe_fp32_combine: bool | None = None
    # MoE: the routed experts' activation (its clamps and the routing-weight product included) runs as one fused or
    # compiled function that keeps only its input and the fp32 routing weight (Megatron-Core's weighted_bias_swiglu_impl,
    # NeMo AutoModel's torch.compile'd quick_geglu_deepep / swiglu_oai_deepep), not eager autograd's intermediates
    moe_fused_activation: bool | None = None
    # with compile: whether the loss is compiled too (torchtune's compile_loss, torchtitan's "loss" compile component,
    # an HF model's own loss inside its compiled forward) or runs eagerly after a compiled model (a hand-written loop)
    compile_loss: bool | None = None
    # LoRA through PEFT: adapters in fp32 beside a 16-bit base (get_peft_model's autocast_adapter_dtype, the default
    # since PEFT 0.11), each adapted layer keeping its own copy of its input cast for lora_A
    lora_fp32_adapters: bool | None = None
    # activation_checkpointing: selective the Megatron-Core way — the submodules each layer recomputes (RecomputeModule)
    recompute_modules: list[RecomputeModule] | None = None
    # pipeline parallel: how many blocks' worth of the split the embedding (first) and the output layer (last) take
    # (torchtitan's pipeline_parallel_first_stage_less_layers / _last_stage_less_layers, default 1 each; Megatron-Core's
    # account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split); 0: blocks only
    pipeline_first_stage_less_layers: NonNegativeInt | None = None
    pipeline_last_stage_less_layers: NonNegativeInt | None = None
    # activation_checkpointing: full on a share of the blocks only, the others keeping all their activations: torchtitan's
    # layer-level selective checkpointing (selective_ac_option "N": every N-th block, a share of 1/N), Megatron-Core's
    # recompute_method "block" (the first recompute_num_layers blocks of each pipeline chunk); None: every block
    checkpoint_fraction: Annotated[float, Field(gt=0.0, le=1.0)] | None = None


class TabularLibrary(str, Enum):
    XGBOOST = "xgboost"
    LIGHTGBM = "lightgbm"
    CATBOOST = "catboost"
    SKLEARN_HGB = "sklearn-hgb"
    SKLEARN_RF = "sklearn-rf"
    SKLEARN_LINEAR = "sklearn-linear"


class Cloud(str, Enum):
    AWS = "aws"
    GCP = "gcp"
    AZURE = "azure"
    LOCAL = "local"


# --------------------------------------------------------------------------- parts

_STRICT = STRICT


#: the attention projections a LoRA job may name, by their transformers module names — multi-head latent attention's
#: (DeepSeek-V2 / V3, MiniCPM3 …) included — and the MLP's
LORA_ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
LORA_MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")


class LoraSpec(BaseModel):
    model_config = _STRICT
    rank: PositiveInt = 8
    alpha: PositiveFloat | None = None
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    # PEFT's lora_dropout: each adapter drops its own copy of its input (and keeps the mask) before lora_A
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        allowed = {*LORA_ATTENTION_TARGETS, *LORA_MLP_TARGETS, "all-linear"}
        bad = [t for t in v if t not in allowed]
        if bad:
            raise ValueError(f"unknown target {bad[0]!r}; allowed: {', '.join(sorted(allowed))}")
        if not v:
            raise ValueError("at least one target is needed")
        return v


class DatasetSize(BaseModel):
    model_config = _STRICT
    examples: PositiveInt
    tokens_per_example: PositiveFloat | None = None


class DataStyle(str, Enum):
    """How ``trainplan run`` reads the records of a data file for a pretrained checkpoint (docs/run.md)."""

    AUTO = "auto"  # from the first record: messages → chat, instruction + response → instruction, text → text
    TEXT = "text"  # plain text; loss on every token
    INSTRUCTION = "instruction"  # Alpaca-style instruction / input / response; loss on the response only
    CHAT = "chat"  # a list of {role, content} messages rendered with the tokenizer's chat template; loss on assistant turns


class DataFormat(BaseModel):
    """The fields of a JSONL / Parquet / text data file and how they become training sequences."""

    model_config = _STRICT
    style: DataStyle = DataStyle.AUTO
    text_field: str = "text"
    instruction_field: str = "instruction"
    input_field: str = "input"  # optional context of an instruction record
    response_field: str = "output"
    messages_field: str = "messages"
    packing: bool | None = None  # concatenate examples into full rows; default: true for text, false otherwise
    eval_data: str | None = None  # a second file in the same format, for eval loss
    eval_fraction: Annotated[float, Field(ge=0.0, le=0.5)] = 0.0  # or hold out this share of the examples
    eval_every: PositiveInt | None = None  # steps between eval losses (default: at the end only)

    @model_validator(mode="after")
    def _one_eval_source(self) -> "DataFormat":
        if self.eval_data is not None and self.eval_fraction > 0:
            raise ValueError("give eval_data or eval_fraction, not both")
        return self


class Constraints(BaseModel):
    model_config = _STRICT
    deadline_hours: PositiveFloat | None = None
    budget_usd: PositiveFloat | None = None
    # None: every cloud of the catalog (aws, gcp, azure, local, and the clouds a user's catalog adds)
    clouds: tuple[str, ...] | None = None
    max_gpus: PositiveInt = 64
    spot: bool = False
    # owned hardware the job may run on (local instances: "local:workstation-rtx4090-x2"); the others are listed
    # apart, never ranked against rentals (this machine, once probed, counts as owned)
    owned: tuple[str, ...] = ()

    @field_validator("owned")
    @classmethod
    def _local_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        names = []
        for name in v:
            bare = name.strip().removeprefix("local:")
            if not bare or ":" in bare:
                raise ValueError(f"{name!r} is not owned hardware; name a local instance, e.g. local:workstation-rtx4090-x2")
            names.append(bare)
        return tuple(names)

    @field_validator("clouds")
    @classmethod
    def _cloud_names(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return None
        if not v:
            raise ValueError("at least one cloud is needed (aws, gcp, azure, local, or a cloud of your catalog)")
        names = tuple(str(c).strip().lower() for c in v)
        bad = [c for c in names if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", c)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a cloud name (letters, digits, - and _)")
        return names

    def allows(self, cloud: str) -> bool:
        """Whether an instance of ``cloud`` may be used."""
        return self.clouds is None or cloud in self.clouds


class InputSpec(BaseModel):
    """One model input of a ``kind: torch`` job: per-sample shape and dtype."""

    model_config = _STRICT
    shape: tuple[PositiveInt, ...]
    dtype: Literal["float32", "float16", "bfloat16", "int64", "int32", "bool"] = "float32"
    high: PositiveInt | None = None  # exclusive upper bound for integer inputs (e.g. vocab size)


# A job name becomes run-directory names, cluster job names, bucket paths and comment lines of rendered shell and
# YAML files (run/targets): a safe character set keeps every one of them free of injection.
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class _JobBase(BaseModel):
    model_config = _STRICT
    name: str = "job"

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not JOB_NAME.fullmatch(v):
            raise ValueError(f"must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit, got {v!r} "
                             "(it names run directories, cluster jobs and rendered launch files)")
        return v
    constraints: Constraints = Constraints()
    seed: int = 0
    data: str | None = None  # path, "synthetic", or "sklearn:<name>" (used by `trainplan run`)


class _NeuralJob(_JobBase):
    micro_batch: PositiveInt
    global_batch: PositiveInt | None = None
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAMW
    activation_checkpointing: Checkpointing = Checkpointing.NONE
    steps: PositiveInt | None = None
    learning_rate: PositiveFloat = 1e-4
    stack: Stack = Stack.PLAIN
    knobs: StackKnobs = StackKnobs()

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _yaml_bools(cls, v: Any) -> Any:
        # YAML reads `none`/`true`/`false` loosely; accept booleans for checkpointing.
        if v is True:
            return "full"
        if v is False or v is None:
            return "none"
        return v

    @model_validator(mode="after")
    def _batch_divides(self) -> "_NeuralJob":
        if self.global_batch is not None and self.global_batch % self.micro_batch:
            raise ValueError(
                f"global_batch ({self.global_batch}) must be a multiple of micro_batch ({self.micro_batch})"
            )
        return self


class TransformerJob(_NeuralJob):
    kind: Literal[JobKind.TRANSFORMER] = JobKind.TRANSFORMER
    model: str | ModelArch
    task: Task = Task.FINETUNE
    method: Method = Method.FULL
    lora: LoraSpec | None = None
    seq_len: PositiveInt
    flash_attention: FlashAttention = FlashAttention.AUTO
    tokens: PositiveFloat | None = None
    epochs: PositiveFloat | None = None
    dataset: DatasetSize | None = None
    data_format: DataFormat | None = None  # how `trainplan run` reads `data` for a pretrained checkpoint

    @field_validator("flash_attention", mode="before")
    @classmethod
    def _flash_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            return "true" if v else "false"
        return v

    @model_validator(mode="after")
    def _fp8_trains_full_weights(self) -> "TransformerJob":
        if self.precision is Precision.FP8 and self.method is not Method.FULL:
            raise ValueError("precision fp8 (torchao float8, Transformer Engine) casts trainable weights for their GEMMs; "
                             "LoRA / QLoRA train in bf16 — use precision: bf16")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _length_and_lora(self) -> "TransformerJob":
        given = [k for k in ("tokens", "steps", "epochs") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of tokens, steps, or epochs (with dataset); "
                + (f"got {', '.join(given)}" if given else "got none")
            )
        if self.epochs is not None and self.dataset is None:
            raise ValueError("epochs needs dataset: {examples, tokens_per_example}")
        if self.method is Method.FULL and self.lora is not None:
            raise ValueError("lora settings given but method is full; set method: lora or qlora")
        return self

    @property
    def lora_spec(self) -> LoraSpec | None:
        if self.method is Method.FULL:
            return None
        return self.lora or LoraSpec()

    def total_tokens(self, global_batch: int) -> float:
        """Training tokens for the whole job, given the effective global batch."""
        if self.tokens is not None:
            return float(self.tokens)
        if self.steps is not None:
            return float(self.steps * global_batch * self.seq_len)
        assert self.epochs is not None and self.dataset is not None
        per_example = self.dataset.tokens_per_example or self.seq_len
        return float(self.epochs * self.dataset.examples * min(per_example, self.seq_len))

    def total_steps(self, global_batch: int) -> int:
        """Optimizer steps for the whole job."""
        if self.steps is not None:
            return self.steps
        return max(1, math.ceil(self.total_tokens(global_batch) / (global_batch * self.seq_len)))


class TabularJob(_JobBase):
    kind: Literal[JobKind.TABULAR] = JobKind.TABULAR
    library: TabularLibrary
    rows: PositiveInt
    features: PositiveInt
    trees: PositiveInt = 100
    max_depth: PositiveInt | None = None
    num_leaves: PositiveInt | None = None
    max_bins: Annotated[int, Field(ge=2, le=65536)] = 256
    cv_folds: PositiveInt = 1
    learning_rate: PositiveFloat = 0.1
    objective: Literal["binary", "multiclass", "regression"] = "binary"
    classes: Annotated[int, Field(ge=2)] = 2
    target: str | None = None
    iterations: PositiveInt = 100  # sklearn-linear solver iterations
    # fraction of the rows × features cells a sparse (CSR / CSC) matrix stores: one-hot or bag-of-words data
    density: Annotated[float, Field(gt=0, le=1)] = 1.0
    # how many of the features are categorical columns CatBoost encodes itself (ordered target statistics)
    categorical_features: Annotated[int, Field(ge=0)] = 0
    # the library release that will train (XGBoost, LightGBM): older releases are priced by their measured speed
    # relative to the release the rates were measured with (tabular_releases.csv); None: that release
    library_version: str | None = None

    @field_validator("categorical_features")
    @classmethod
    def _categorical_library(cls, v: int, info: ValidationInfo) -> int:
        library, features = info.data.get("library"), info.data.get("features")
        if v and library is not None and library is not TabularLibrary.CATBOOST:
            raise ValueError(f"{v} categorical columns are planned for catboost, which encodes them itself; for "
                             f"{library.value}, one-hot encode them and give density (the stored fraction)")  # fmt: skip
        if features is not None and v > features:
            raise ValueError(f"{v} is more than the job's {features} features")
        return v

    @field_validator("library_version")
    @classmethod
    def _release_libraries(cls, v: str | None, info: ValidationInfo) -> str | None:
        library = info.data.get("library")
        if v is not None and not RELEASE_PATTERN.fullmatch(v):
            raise ValueError(f"must be a release number like 1.7.6, got {v!r}")
        if v is not None and library is not None and library not in (TabularLibrary.XGBOOST, TabularLibrary.LIGHTGBM):
            raise ValueError(f"releases are measured for xgboost and lightgbm only; {library.value} is priced at the "
                             "release its rate was measured with: leave library_version out")  # fmt: skip
        return v

    @field_validator("density")
    @classmethod
    def _sparse_libraries(cls, v: float, info: ValidationInfo) -> float:
        library = info.data.get("library")
        if v < 1 and library is not None and library not in (TabularLibrary.XGBOOST, TabularLibrary.LIGHTGBM):
            raise ValueError(f"{v:g} (sparse input) is planned for xgboost and lightgbm, which build histograms from "
                             f"the stored values only; {library.value} is planned on dense data: use density: 1")  # fmt: skip
        return v

    @model_validator(mode="after")
    def _depth(self) -> "TabularJob":
        if self.max_depth is not None and self.max_depth > 64:
            raise ValueError(f"max_depth ({self.max_depth}) must be at most 64")
        if self.library is TabularLibrary.CATBOOST and self.depth > 16:  # CatBoost docs, training parameters: depth <= 16
            raise ValueError(f"catboost grows symmetric trees at most 16 deep; the job's depth is {self.depth} "
                             "(max_depth, or log2 of num_leaves)")
        return self

    @property
    def depth(self) -> int:
        """Effective tree depth: max_depth, else log2(num_leaves), else the library default."""
        if self.max_depth is not None:
            return self.max_depth
        if self.num_leaves is not None:
            return max(1, math.ceil(math.log2(self.num_leaves)))
        return {TabularLibrary.XGBOOST: 6, TabularLibrary.LIGHTGBM: 5, TabularLibrary.CATBOOST: 6}.get(self.library, 8)


class _FactoryJob(_NeuralJob):
    """A model built by the user's factory (an import path) from example inputs: ``kind: torch`` and ``kind: keras``."""

    model: str  # "pkg.module:factory"
    model_args: dict[str, Any] = {}
    inputs: tuple[InputSpec, ...]
    samples: PositiveInt | None = None  # samples per epoch, for `epochs`
    epochs: PositiveFloat | None = None

    @field_validator("model")
    @classmethod
    def _import_path(cls, v: str) -> str:
        if ":" not in v or not all(v.split(":", 1)):
            raise ValueError(f"must be an import path 'package.module:factory', got {v!r}")
        return v

    @field_validator("precision")
    @classmethod
    def _no_fp8(cls, v: Precision) -> Precision:
        if v is Precision.FP8:
            raise ValueError("fp8 is planned for kind: transformer jobs (their linear layers' GEMMs); a traced model "
                             "runs bf16, fp16 or fp32 — use bf16")  # fmt: skip
        return v

    @field_validator("inputs")
    @classmethod
    def _non_empty(cls, v: tuple[InputSpec, ...]) -> tuple[InputSpec, ...]:
        if not v:
            raise ValueError("at least one input is needed")
        return v

    @model_validator(mode="after")
    def _length(self) -> "_FactoryJob":
        if self.steps is None and self.epochs is None:
            raise ValueError("give steps, or epochs with samples")
        if self.epochs is not None and self.samples is None:
            raise ValueError("epochs needs samples (samples per epoch)")
        return self

    def total_steps(self, global_batch: int) -> int:
        if self.steps is not None:
            return self.steps
        assert self.epochs is not None and self.samples is not None
        return max(1, math.ceil(self.epochs * self.samples / global_batch))


class TorchJob(_FactoryJob):
    kind: Literal[JobKind.TORCH] = JobKind.TORCH
    loss: str = "mean"
    resolution: PositiveInt | None = None  # built-in models (trainplan.zoo): image side in pixels

    @model_validator(mode="after")
    def _resolution_for_builtin(self) -> "TorchJob":
        if self.resolution is not None and self.model != FACTORY:
            raise ValueError(f"resolution applies to the built-in models ({', '.join(ZOO)}); size your own model's "
                             "inputs with inputs:")
        return self


KERAS_LOSSES = ("mse", "mae", "sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy")


class KerasJob(_FactoryJob):
    """A Keras 3 model from a factory (``kind: keras``), estimated from the model itself (estimate/keras.py)."""

    kind: Literal[JobKind.KERAS] = JobKind.KERAS
    loss: str = "mse"  # a Keras loss name (KERAS_LOSSES) or "pkg.mod:fn" (fn(y_true, y_pred))
    precision: Precision = Precision.FP32

    @field_validator("loss")
    @classmethod
    def _loss(cls, v: str) -> str:
        if v not in KERAS_LOSSES and ":" not in v:
            raise ValueError(f"must be one of {', '.join(KERAS_LOSSES)} or an import path 'pkg.mod:fn', got {v!r}")
        return v

    @field_validator("optimizer")
    @classmethod
    def _keras_optimizer(cls, v: Optimizer) -> Optimizer:
        if v is Optimizer.ADAM8BIT:
            raise ValueError("adam8bit is bitsandbytes (PyTorch only); Keras jobs use adamw, sgd, adafactor or lion")
        if v is Optimizer.MUON:
            raise ValueError("muon is modelled for PyTorch only (torch.optim.Muon); Keras jobs use adamw, sgd, "
                             "adafactor or lion")  # fmt: skip
        return v

    @model_validator(mode="after")
    def _plain_stack(self) -> "KerasJob":
        if self.stack is not Stack.PLAIN:
            raise ValueError(f"stack {self.stack.value} is a PyTorch stack; Keras jobs use stack: plain")
        return self


class ScriptJob(_NeuralJob):
    """``kind: script``: your own training script, run by ``trainplan run --script`` under the chosen strategy.

    It describes no model, so nothing is predicted; ``steps``, the batch split and the precision reach the script
    through :mod:`trainplan.runtime` (``ctx.total_steps``, ``ctx.grad_accum`` …).
    """

    kind: Literal[JobKind.SCRIPT] = JobKind.SCRIPT
    micro_batch: PositiveInt = 1
    precision: Precision = Precision.FP32

    @model_validator(mode="after")
    def _steps(self) -> "ScriptJob":
        if self.steps is None:
            raise ValueError("give steps: the optimizer steps the script runs (ctx.total_steps)")
        return self

    def total_steps(self, global_batch: int) -> int:
        assert self.steps is not None
        return self.steps


Job = Annotated[Union[TransformerJob, TabularJob, TorchJob, KerasJob, ScriptJob], Field(discriminator="kind")]
_JOB_ADAPTER: TypeAdapter[Job] = TypeAdapter(Job)

_MODELS_BY_KIND: dict[str, type[BaseModel]] = {
    "transformer": TransformerJob,
    "tabular": TabularJob,
    "torch": TorchJob,
    "keras": KerasJob,
    "script": ScriptJob,
}

# --------------------------------------------------------------------------- loading


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _fields_at(loc: tuple[Any, ...], kind: str | None) -> list[str]:
    """Allowed field names of the model that owns location ``loc`` (best effort)."""
    model: Any = _MODELS_BY_KIND.get(kind or "", None)
    for part in loc[:-1]:
        if model is None:
            return []
        info = model.model_fields.get(part) if isinstance(part, str) else None
        if info is None:
            return []
        ann = info.annotation
        candidates = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = candidates[0] if candidates else None
    return sorted(model.model_fields) if model is not None else []


def _format_error(err: dict[str, Any], kind: str | None) -> tuple[str, str]:
    """One pydantic error → (field path, message)."""
    loc = tuple(p for p in err["loc"] if p not in ("transformer", "tabular", "torch", "keras", "script"))
    # Drop union-branch names pydantic inserts (e.g. 'str', 'ModelArch', 'function-after[...]').
    loc = tuple(p for p in loc if not (isinstance(p, str) and (p[:1].isupper() or "[" in p or p in ("str", "int"))))
    field = ".".join(str(p) for p in loc) or "job"
    etype = err["type"]
    if etype == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        allowed = _fields_at(loc, kind)
        hint = _did_you_mean(name, allowed)
        return field, f"unknown field{hint}; allowed here: {', '.join(allowed)}" if allowed else "unknown field"
    if etype == "missing":
        return field, "is required"
    if etype in ("enum", "literal_error"):
        expected = err.get("ctx", {}).get("expected", "")
        choices = [c.strip().strip("'") for c in expected.replace(" or ", ", ").split(",") if c.strip()]
        return field, f"must be one of {expected}, got {err.get('input')!r}{_did_you_mean(str(err.get('input')), choices)}"
    if etype in ("greater_than", "greater_than_equal"):
        bound = err.get("ctx", {}).get("gt", err.get("ctx", {}).get("ge"))
        op = ">" if etype == "greater_than" else ">="
        return field, f"must be {op} {bound}, got {err.get('input')!r}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return field, f"{msg} (got {err.get('input')!r})" if etype not in ("value_error", "assertion_error") else msg


def _pick_error(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """Choose the most useful of several errors (pydantic reports every union branch)."""
    order = {"extra_forbidden": 0, "missing": 1}
    # For `str | Mapping` unions (model:), the "not a string" branch error is the least useful one.
    return sorted(errors, key=lambda e: (e["type"] == "string_type", order.get(e["type"], 2), len(e["loc"])))[0]


def parse_job(data: Any, *, source: str | None = None, catalog: Catalog | None = None) -> Job:
    """Validate a parsed job mapping.  Raises :class:`SpecError` with one clear line."""
    if not isinstance(data, dict):
        raise SpecError("the job file must be a mapping of field: value", source=source)
    kind = data.get("kind")
    if kind is None:
        raise SpecError("is required: one of transformer, tabular, torch, keras, script", field="kind", source=source)
    if kind not in _MODELS_BY_KIND:
        raise SpecError(
            f"must be one of transformer, tabular, torch, keras, script, got {kind!r}{_did_you_mean(str(kind), list(_MODELS_BY_KIND))}",
            field="kind",
            source=source,
        )
    if kind == "torch":
        data = _expand_builtin_model(data, source)
    try:
        job = _JOB_ADAPTER.validate_python(data)
    except ValidationError as exc:
        field, msg = _format_error(_pick_error(exc.errors()), kind)
        raise SpecError(msg, field=field, source=source) from None
    _check_references(job, source, catalog)
    return job


def _expand_builtin_model(data: dict[str, Any], source: str | None) -> dict[str, Any]:
    """``model: sd15-unet`` in a ``kind: torch`` job (a :data:`trainplan.zoo.ZOO` name) stands for the zoo's
    factory, its inputs at ``resolution`` and its loss."""
    name = data.get("model")
    if not isinstance(name, str) or ":" in name:
        return data
    if name not in ZOO:
        raise SpecError(f"must be an import path 'package.module:factory' or a built-in model ({', '.join(ZOO)}), "
                        f"got {name!r}{_did_you_mean(name, list(ZOO))}", field="model", source=source)
    for key in ("model_args", "inputs"):
        if key in data:
            raise SpecError(f"is set by the built-in model {name!r}; give resolution instead", field=key, source=source)
    z = ZOO[name]
    r = data.get("resolution", z.default_resolution)
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise SpecError(f"must be a positive whole number of pixels, got {r!r}", field="resolution", source=source)
    try:
        check_resolution(name, r)
    except SpecError as exc:
        raise SpecError(str(exc).split(": ", 1)[-1], field="resolution", source=source) from None
    return {**data, "model": FACTORY, "model_args": {"name": name, "resolution": r}, "inputs": z.inputs(r),
            "loss": data.get("loss", z.loss)}  # fmt: skip


def _check_references(job: Job, source: str | None, catalog: Catalog | None) -> None:
    """Checks that need the catalog: the model preset exists."""
    if isinstance(job, TransformerJob) and isinstance(job.model, str):
        resolve_model(job.model, catalog, source=source)


# A job file is a few hundred bytes; these bound what a typo or a hostile file can cost to read.
MAX_JOB_FILE_BYTES = 1 << 20
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 50


class _JobLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a limit on aliases (a "billion laughs" file expands exponentially when the
    mapping is walked) and on nesting depth (a 20,000-deep file exhausts the recursion limit)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_YAML_ALIASES} aliases (*name); a job file needs none")
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # type: ignore[override]
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r} (the last would win silently)",
                                                        key_node.start_mark)  # fmt: skip
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_job(path: str | Path) -> Job:
    """Read and validate a job file."""
    p = Path(path)
    if not p.exists():
        raise SpecError(f"job file not found: {p}")
    if p.is_dir():
        raise SpecError(f"job file is a directory: {p}")
    if not p.is_file():
        raise SpecError(f"job file is not a regular file (a FIFO, device or socket): {p}")
    if p.stat().st_size > MAX_JOB_FILE_BYTES:
        raise SpecError(f"job file is {p.stat().st_size:,} bytes; a job file is at most {MAX_JOB_FILE_BYTES:,}", source=str(p))
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"not a UTF-8 text file (byte {exc.start})", source=str(p)) from None
    try:
        data = yaml.load(text, Loader=_JobLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise SpecError(f"malformed YAML at {where}: {exc.problem}", source=str(p)) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"malformed YAML: {exc}", source=str(p)) from None
    return parse_job(data, source=str(p))
