"""A pretrained checkpoint directory (``model: ./path``) as ``save_pretrained`` writes it.

Checked before anything runs: ``config.json`` (read by :mod:`trainplan.hfconfig`
like any config), safetensors weights (one file or an index of shards) whose
parameter count equals the config's, and tokenizer files.  Loaded in the
workers either whole on every rank (single, DDP, DeepSpeed) or, under FSDP on
several processes, built on the meta device, sharded, and each rank reads only
its rows of each tensor from the safetensors files (``safe_open(...).get_slice``)
— a model never materialises whole on one rank.  The result is saved back with
``save_pretrained`` (safetensors) beside the tokenizer, or the LoRA adapter with
peft's ``save_pretrained``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from trainplan.catalog import checkpoint_dir
from trainplan.errors import SpecError

WEIGHTS_INDEX = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    weight_files: tuple[Path, ...]
    has_tokenizer: bool


# where the job's ``model:`` names a checkpoint directory (torch-free, for the planner and the launch renders)
checkpoint_path = checkpoint_dir


def _weight_files(path: Path) -> tuple[Path, ...]:
    index = path / WEIGHTS_INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise SpecError(f"{index} is not a safetensors index (a JSON object with 'weight_map')", field="model") from None
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise SpecError(f"{path}: the weight shard {missing[0]} named in {WEIGHTS_INDEX} is missing", field="model")
        return tuple(path / n for n in names)
    if (path / WEIGHTS_FILE).is_file():
        return (path / WEIGHTS_FILE,)
    if any(path.glob("pytorch_model*.bin")):
        raise SpecError(f"{path} holds pickled weights (pytorch_model*.bin); trainplan reads safetensors only — "
                        "re-save them with save_pretrained(safe_serialization=True)", field="model")
    raise SpecError(f"{path} has no weights ({WEIGHTS_FILE} or {WEIGHTS_INDEX} with its shards)", field="model")


def weight_shapes(files: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape, read from the safetensors headers only."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    shapes[key] = tuple(f.get_slice(key).get_shape())
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a damaged header
            raise SpecError(f"{file} is not a readable safetensors file ({str(exc).splitlines()[0][:160]})",
                            field="model") from None
    return shapes


def inspect_checkpoint(path: Path, *, expected_params: int | tuple[int, ...] | None, need_tokenizer: bool) -> Checkpoint:
    """Refuse, in one line, a checkpoint directory that cannot be trained from.

    ``expected_params`` is the parameter count of the model its config describes
    (embeddings tied to the head counted once), or the counts allowed; the
    weights must hold exactly that many values.
    """
    if not (path / "config.json").is_file():
        raise SpecError(f"{path} has no config.json", field="model")
    files = _weight_files(path)
    if expected_params is not None:
        allowed = (expected_params,) if isinstance(expected_params, int) else tuple(expected_params)
        held = sum(math.prod(s) for s in weight_shapes(files).values())
        if held not in allowed:
            raise SpecError(f"the weights in {path} hold {held:,} values but its config.json describes a model of "
                            f"{allowed[0]:,} parameters; they do not belong together", field="model")
    has_tokenizer = any((path / name).is_file() for name in TOKENIZER_MARKERS)
    if need_tokenizer and not has_tokenizer:
        raise SpecError(f"{path} has no tokenizer ({', '.join(TOKENIZER_MARKERS)}); save it beside the weights "
                        "with tokenizer.save_pretrained", field="model")
    return Checkpoint(path, files, has_tokenizer)


# --------------------------------------------------------------------------- loading in a worker


def quantization_config(compute_dtype: torch.dtype) -> Any:
    """QLoRA's storage of the frozen linear weights (Dettmers et al. 2023, "QLoRA", Sec. 3): 4-bit NormalFloat with
    double quantization of the block scales, de-quantized to ``compute_dtype`` for each matmul — what the estimate
    counts (``QLORA_BITS_PER_PARAM``).  bitsandbytes quantizes each ``nn.Linear`` but the output head."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype)


def load_full(path: Path, dtype: torch.dtype, *, quantize_on: torch.device | None = None,
              attention: str = "sdpa") -> torch.nn.Module:
    """The whole model from its safetensors, on the CPU; missing or unexpected tensors fail loudly.  ``attention``:
    its ``attn_implementation`` (checks.attention).

    ``quantize_on``: QLoRA — the linear weights are stored in 4 bit on that device (bitsandbytes quantizes
    as it places them) and computed in ``dtype``, which the other parameters keep."""
    from transformers import AutoModelForCausalLM

    quantized: dict[str, Any] = {}
    if quantize_on is not None:
        quantized = dict(quantization_config=quantization_config(dtype), device_map={"": str(quantize_on)})
    model, info = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=dtype, attn_implementation=attention, output_loading_info=True, **quantized
    )
    missing = info.get("missing_keys") or []
    unexpected = info.get("unexpected_keys") or []
    mismatched = info.get("mismatched_keys") or []
    if missing or unexpected or mismatched:
        what = (f"missing {sorted(missing)[:3]}" if missing else
                f"unexpected {sorted(unexpected)[:3]}" if unexpected else f"wrong shape {list(mismatched)[:3]}")
        raise RuntimeError(f"the weights in {path} do not match its config.json: {what}")
    return model


def load_partitioned(path: Path, dtype: torch.dtype, ds_config: dict[str, Any], *,
                     attention: str = "sdpa") -> torch.nn.Module:
    """ZeRO-3 on several processes: ``from_pretrained`` under ``deepspeed.zero.Init`` — each parameter is
    partitioned over the ranks as it is created and filled from the checkpoint one module at a time
    (transformers' DeepSpeed integration, enabled by a live ``HfDeepSpeedConfig``), so no rank holds the
    whole model."""
    from transformers.integrations import HfDeepSpeedConfig

    keep = HfDeepSpeedConfig(dict(ds_config))  # transformers reads it through a weak reference while loading
    try:
        return load_full(path, dtype, attention=attention)
    finally:
        del keep


def cast_unquantized_to_fp32(model: torch.nn.Module) -> int:
    """What PEFT's ``prepare_model_for_kbit_training`` does to a 4-bit model's other parameters (v0.21.2, "cast all
    non INT8 parameters to fp32"): every 16-bit parameter — embeddings, norms, the head — becomes fp32; the packed
    4-bit weights (uint8) stay.  Returns how many parameters it cast (knobs.qlora_fp32_params)."""
    cast = 0
    for param in model.parameters():
        if param.dtype in (torch.float16, torch.bfloat16):
            param.data = param.data.float()
            cast += 1
    return cast


def build_on_meta(path: Path, dtype: torch.dtype, *, attention: str = "sdpa") -> torch.nn.Module:
    """The model's structure without storage: parameters on the meta device, buffers (rotary tables) real."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(path))
    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)


def _file_key(name: str) -> str:
    """The checkpoint's name of a parameter of the (possibly peft-wrapped) model."""
    if name.startswith("base_model.model."):
        name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


def _local_rows(param: Any) -> tuple[int, int]:
    """Rows of dim 0 this rank holds of an FSDP2 (``Shard(0)``) parameter, as torch.chunk splits them."""
    mesh = param.device_mesh
    world, rank = mesh.size(), mesh.get_local_rank()
    rows = param.shape[0]
    per = math.ceil(rows / world)
    start = min(rows, rank * per)
    return start, min(rows, start + per)


def materialize_sharded(model: torch.nn.Module, files: Iterable[Path], device: torch.device, seed: int) -> None:
    """Give a sharded meta model storage on ``device`` and fill each rank's rows from the checkpoint.

    Tensors the checkpoint lacks are LoRA adapters (initialised as peft does by
    default: A Kaiming-uniform with a = √5, B zero; peft ``LoraLayer.reset_lora_parameters``)
    or a head tied to the embeddings (tied again after loading).  Anything else
    missing is an error.
    """
    from safetensors import safe_open

    from trainplan.run.workloads.common import batch_generator

    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in buffers:
                b.copy_(buffers[name])
    where: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            where.update(dict.fromkeys(f.keys(), file))
    handles: dict[Path, Any] = {}

    def rows_of(key: str, start: int, end: int) -> torch.Tensor:
        """Rows ``start:end`` of the checkpoint tensor ``key``, each shard file opened once."""
        file = where[key]
        if file not in handles:
            handles[file] = safe_open(str(file), framework="pt").__enter__()
        return handles[file].get_slice(key)[start:end]

    try:
        with torch.no_grad():
            for name, param in model.named_parameters():
                local = param.to_local() if hasattr(param, "to_local") else param.data
                start, end = _local_rows(param) if hasattr(param, "device_mesh") else (0, param.shape[0])
                if local.shape[0] != end - start:
                    raise RuntimeError(f"{name}: local shard has {local.shape[0]} rows, expected {end - start}")
                key = _file_key(name)
                if key in where:
                    local.copy_(rows_of(key, start, end).to(local.dtype))
                elif ".lora_A." in name:
                    full = torch.empty(tuple(param.shape), dtype=torch.float32)
                    torch.nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=batch_generator(seed, -3, hash(name) & 0xFFFF))
                    local.copy_(full[start:end].to(local.dtype))
                elif ".lora_B." in name:
                    local.zero_()
                elif key == "lm_head.weight" and "model.embed_tokens.weight" in where:  # a head tied to the embeddings
                    local.copy_(rows_of("model.embed_tokens.weight", start, end).to(local.dtype))
                else:
                    raise RuntimeError(f"the checkpoint has no tensor {key!r} for parameter {name}")
    finally:
        for handle in handles.values():
            handle.__exit__(None, None, None)


def sharded_loading_possible(model: torch.nn.Module, files: Iterable[Path]) -> bool:
    """Every parameter of ``model`` (a peft model too) is a checkpoint tensor of the same shape, an adapter, or a tied head."""
    shapes = weight_shapes(files)
    for name, param in model.named_parameters():
        key = _file_key(name)
        if ".lora_A." in name or ".lora_B." in name:
            continue
        if key == "lm_head.weight" and key not in shapes:
            key = "model.embed_tokens.weight"
        if shapes.get(key) != tuple(param.shape):
            return False
    return True


# --------------------------------------------------------------------------- saving the result


def save_final(state: dict[str, torch.Tensor], checkpoint: Path, out: Path, *, lora: Any | None,
               lora_targets: Any = None) -> Path:
    """``out/final/``: the model (``save_pretrained``, safetensors) or the LoRA adapter, and the tokenizer.

    ``state`` is the full state dict rank 0 gathered.  A model is built on the
    meta device from the checkpoint's config and given these tensors (no copy),
    so what is saved does not depend on how the run was wrapped.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    final = out / "final"
    tmp = out / "final.partial"
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    config = AutoConfig.from_pretrained(str(checkpoint))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha or 2 * lora.rank,
                                                 lora_dropout=getattr(lora, "dropout", 0.0), target_modules=lora_targets))
    if lora is not None:
        # only the adapter is saved: the base stays the checkpoint's (a QLoRA base is held in 4 bit, which
        # an adapter is not saved against — it loads onto the checkpoint, quantized again or not)
        adapter = {k for k in model.state_dict() if ".lora_" in k}
        state = {k: v for k, v in state.items() if k in adapter}
        if set(state) != adapter:
            raise RuntimeError(f"the trained state lacks adapter tensors: {sorted(adapter - set(state))[:3]}")
    dtype = next(iter(state.values())).dtype
    model.load_state_dict(state, strict=lora is None, assign=True)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    if lora is None:
        model.config.dtype = dtype
    model.save_pretrained(str(tmp), safe_serialization=True)
    try:
        AutoTokenizer.from_pretrained(str(checkpoint)).save_pretrained(str(tmp))
    except Exception:  # noqa: BLE001 - a checkpoint without a tokenizer still gets its weights saved
        pass
    if final.exists():
        import shutil

        shutil.rmtree(final)
    tmp.replace(final)
    return final
