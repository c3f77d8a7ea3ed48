"""Built-in vision and diffusion models for ``kind: torch`` jobs, built from their public configs (no weights).

``model: sd15-unet`` (with an optional ``resolution:``) in a ``kind: torch`` job stands for the factory
``trainplan.zoo:build`` and the example inputs the model takes at that resolution, so a user plans a Stable
Diffusion fine-tune or a ViT pre-training without writing a factory.  The models come from the libraries made
for them, installed as extras: transformers (ResNet-50, ViT; ``trainplan[torch]``) and diffusers (the UNets and
DiT; ``trainplan[diffusion]``).  Each is traced on the fake device like any other ``kind: torch`` model, so
parameters, FLOPs and activation memory are those of one real training step of the library's module.

This module imports neither torch nor the model libraries until a model is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainplan.errors import SpecError

FACTORY = "trainplan.zoo:build"


@dataclass(frozen=True)
class ZooModel:
    """One built-in model: what it is, where its config comes from, what it takes as input."""

    title: str
    library: str  # the package that builds it
    extra: str  # the trainplan extra that installs it
    default_resolution: int  # pixels (images) — latents are resolution / 8 for the Stable Diffusion VAE
    loss: str  # the trace's loss: cross_entropy for classifiers, mse for denoisers (noise prediction)
    params: int  # published parameter count
    source: str
    inputs: Callable[[int], list[dict[str, Any]]]  # resolution -> the job's `inputs:` entries


def _image(r: int) -> list[dict[str, Any]]:
    return [{"shape": [3, r, r], "dtype": "float32"}]


def _latent(r: int, text_len: int, text_dim: int) -> list[dict[str, Any]]:
    # the SD VAE downsamples 8×; 4 latent channels; one timestep per sample; the text encoder's hidden states
    return [{"shape": [4, r // 8, r // 8], "dtype": "float32"}, {"shape": [], "dtype": "int64", "high": 1000},
            {"shape": [text_len, text_dim], "dtype": "float32"}]  # fmt: skip


ZOO: dict[str, ZooModel] = {
    "resnet-50": ZooModel(
        "ResNet-50 (He et al. 2016) image classifier", "transformers", "torch", 224, "cross_entropy", 25_557_032,
        "transformers ResNetConfig defaults = microsoft/resnet-50 config.json; 25.6M in the paper (Table 1, 3.8 GFLOPs)",
        _image),
    "vit-b-16": ZooModel(
        "ViT-B/16 (Dosovitskiy et al. 2021) image classifier", "transformers", "torch", 224, "cross_entropy", 86_567_656,
        "google/vit-base-patch16-224 config.json; ViT paper Table 1: 86M", _image),
    "vit-l-16": ZooModel(
        "ViT-L/16 image classifier", "transformers", "torch", 224, "cross_entropy", 304_326_632,
        "google/vit-large-patch16-224 config.json; ViT paper Table 1: 307M", _image),
    "sd15-unet": ZooModel(
        "Stable Diffusion 1.5 UNet (latent denoiser, CLIP ViT-L text states 77 x 768)", "diffusers", "diffusion", 512,
        "mse", 859_520_964,
        "runwayml/stable-diffusion-v1-5 unet/config.json; Rombach et al. 2022 (LDM), SD model card: 860M UNet",
        lambda r: _latent(r, 77, 768)),
    "sdxl-unet": ZooModel(
        "Stable Diffusion XL base UNet (text states 77 x 2048, pooled text and size conditioning)", "diffusers",
        "diffusion", 1024, "mse", 2_567_463_684,
        "stabilityai/stable-diffusion-xl-base-1.0 unet/config.json; Podell et al. 2023 (SDXL) Table 1: 2.6B UNet",
        lambda r: [*_latent(r, 77, 2048), {"shape": [1280], "dtype": "float32"}, {"shape": [6], "dtype": "float32"}]),
    "dit-xl-2": ZooModel(
        "DiT-XL/2 class-conditional latent diffusion transformer", "diffusers", "diffusion", 256, "mse", 749_826_464,
        "facebook/DiT-XL-2-256 transformer/config.json; Peebles & Xie 2023 (DiT) Table 4: 675M with the timestep and "
        "class embedders shared; diffusers' DiTTransformer2DModel keeps one embedder per block (28 copies, +74.7M)",
        lambda r: [{"shape": [4, r // 8, r // 8], "dtype": "float32"}, {"shape": [], "dtype": "int64", "high": 1000},
                   {"shape": [], "dtype": "int64", "high": 1000}]),
}


def zoo_model(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        raise SpecError(f"unknown built-in model {name!r}; built in: {', '.join(ZOO)}", field="model") from None


def check_resolution(name: str, resolution: int) -> None:
    step = 16 if name.startswith("vit") else (64 if name.endswith("unet") else (16 if name.startswith("dit") else 32))
    if resolution % step:
        raise SpecError(f"{name} needs a resolution that is a multiple of {step}, got {resolution}", field="resolution")


# ----------------------------------------------------------------------------- builders (import torch lazily)


def _require(library: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(library)
    except ImportError:
        raise SpecError(f"this built-in model needs {library}: pip install 'trainplan[{extra}]'", field="model") from None


def build(name: str, resolution: int | None = None) -> Any:
    """The model ``name`` at ``resolution``, randomly initialised, wrapped so that its forward takes the zoo's
    inputs and returns one tensor (the logits, or the predicted noise)."""
    spec = zoo_model(name)
    r = resolution or spec.default_resolution
    check_resolution(name, r)
    lib = _require(spec.library, spec.extra)
    return _BUILDERS[name](lib, r)


def _classifier(model: Any) -> Any:
    from torch import nn

    class Logits(nn.Module):
        """pixel_values -> logits (the trace's cross-entropy takes the logits against a class)."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            return self.model(pixel_values=pixel_values).logits

    return Logits()


def _denoiser(model: Any, *, sdxl: bool = False, class_conditional: bool = False) -> Any:
    from torch import nn

    class Noise(nn.Module):
        """(latents, timestep, conditioning...) -> predicted noise, as the diffusers training scripts call it."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, sample: Any, timestep: Any, cond: Any, *extra: Any) -> Any:
            if class_conditional:
                return self.model(sample, timestep=timestep, class_labels=cond).sample
            kwargs = {"added_cond_kwargs": {"text_embeds": extra[0], "time_ids": extra[1]}} if sdxl else {}
            return self.model(sample, timestep, encoder_hidden_states=cond, **kwargs).sample

    return Noise()


def _resnet50(transformers: Any, r: int) -> Any:
    # ResNetConfig's defaults are ResNet-50: bottleneck blocks, depths (3, 4, 6, 3), widths 256-2048
    return _classifier(transformers.ResNetForImageClassification(transformers.ResNetConfig(num_labels=1000)))


def _vit(hidden: int, layers: int, heads: int, ffn: int) -> Callable[[Any, int], Any]:
    def make(transformers: Any, r: int) -> Any:
        cfg = transformers.ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                     intermediate_size=ffn, patch_size=16, image_size=r, num_labels=1000)
        return _classifier(transformers.ViTForImageClassification(cfg))
    return make


def _sd15(diffusers: Any, r: int) -> Any:
    unet = diffusers.UNet2DConditionModel(sample_size=r // 8, cross_attention_dim=768, attention_head_dim=8,
                                          block_out_channels=(320, 640, 1280, 1280))  # fmt: skip
    return _denoiser(unet)


def _sdxl(diffusers: Any, r: int) -> Any:
    unet = diffusers.UNet2DConditionModel(
        sample_size=r // 8, block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
        use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816)  # fmt: skip
    return _denoiser(unet, sdxl=True)


def _dit_xl_2(diffusers: Any, r: int) -> Any:
    dit = diffusers.DiTTransformer2DModel(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8,
                                          num_layers=28, sample_size=r // 8, patch_size=2, num_embeds_ada_norm=1000)
    return _denoiser(dit, class_conditional=True)


_BUILDERS: dict[str, Callable[[Any, int], Any]] = {
    "resnet-50": _resnet50,
    "vit-b-16": _vit(768, 12, 12, 3072),
    "vit-l-16": _vit(1024, 24, 16, 4096),
    "sd15-unet": _sd15,
    "sdxl-unet": _sdxl,
    "dit-xl-2": _dit_xl_2,
}
