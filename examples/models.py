"""Example model factories for `kind: torch` jobs (see examples/unet.yaml, examples/mlp.yaml)."""

from __future__ import annotations

import torch
from torch import nn


def build_mlp(width: int = 256, depth: int = 4, inputs: int = 64, outputs: int = 10) -> nn.Module:
    layers: list[nn.Module] = []
    d = inputs
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.GELU()]
        d = width
    layers.append(nn.Linear(d, outputs))
    return nn.Sequential(*layers)


class _Block(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(8, c_out), nn.SiLU(),
            nn.Conv2d(c_out, c_out, 3, padding=1), nn.GroupNorm(8, c_out), nn.SiLU(),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class UNet(nn.Module):
    """A small U-Net: `levels` down/up stages with skip connections."""

    def __init__(self, channels: int = 32, levels: int = 3, in_channels: int = 3) -> None:
        super().__init__()
        self.inp = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.down = nn.ModuleList()
        self.up = nn.ModuleList()
        c = channels
        for _ in range(levels):
            self.down.append(_Block(c, c * 2))
            c *= 2
        for _ in range(levels):
            self.up.append(_Block(c + c // 2, c // 2))
            c //= 2
        self.out = nn.Conv2d(c, in_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        skips = []
        for block in self.down:
            skips.append(h)
            h = block(nn.functional.avg_pool2d(h, 2) if skips[:-1] else h)
        for block, skip in zip(self.up, reversed(skips)):
            h = nn.functional.interpolate(h, size=skip.shape[-2:])
            h = block(torch.cat([h, skip], dim=1))
        return self.out(h)


def build_unet(channels: int = 32, levels: int = 3) -> nn.Module:
    return UNet(channels=channels, levels=levels)
