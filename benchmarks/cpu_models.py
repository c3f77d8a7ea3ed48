"""Small models for ``benchmarks/cpu_neural.py`` beyond ``examples/models.py``: factories for ``kind: torch`` jobs.

Each factory returns an ``nn.Module`` whose ``forward`` takes the job's inputs; sizes are the factory's
arguments so one factory serves several job sizes.
"""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """A VGG-style stack: ``blocks`` × (conv 3×3, BatchNorm, ReLU, max-pool), then a linear classifier."""

    def __init__(self, channels: int = 32, blocks: int = 3, in_channels: int = 3, image: int = 32, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in, c = in_channels, channels
        for _ in range(blocks):
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2)]
            c_in, c = c, c * 2
        self.features = nn.Sequential(*layers)
        side = image // 2**blocks
        self.head = nn.Linear(c_in * side * side, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def build_cnn(channels: int = 32, blocks: int = 3, image: int = 32, classes: int = 10) -> nn.Module:
    return SmallCNN(channels=channels, blocks=blocks, image=image, classes=classes)


class _Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class TinyResNet(nn.Module):
    """A ResNet-style network (He et al. 2016): a stem, ``stages`` of residual blocks with downsampling, a head."""

    def __init__(self, width: int = 16, stages: int = 3, blocks: int = 1, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers: list[nn.Module] = []
        c = width
        for s in range(stages):
            if s:
                layers += [nn.Conv2d(c, c * 2, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c * 2), nn.ReLU()]
                c *= 2
            layers += [_Residual(c) for _ in range(blocks)]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)).mean(dim=(2, 3)))


def build_resnet(width: int = 16, stages: int = 3, blocks: int = 1, classes: int = 10) -> nn.Module:
    return TinyResNet(width=width, stages=stages, blocks=blocks, classes=classes)


class RecurrentClassifier(nn.Module):
    """Token ids → embedding → LSTM or GRU (``cell``) → the last hidden state → classes."""

    def __init__(self, cell: str = "lstm", vocab: int = 1000, embed: int = 128, hidden: int = 256, layers: int = 2,
                 classes: int = 10) -> None:  # fmt: skip
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = rnn(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out[:, -1])


def build_lstm(vocab: int = 1000, embed: int = 128, hidden: int = 256, layers: int = 2) -> nn.Module:
    return RecurrentClassifier("lstm", vocab=vocab, embed=embed, hidden=hidden, layers=layers)


def build_gru(vocab: int = 1000, embed: int = 128, hidden: int = 256, layers: int = 2) -> nn.Module:
    return RecurrentClassifier("gru", vocab=vocab, embed=embed, hidden=hidden, layers=layers)


class EncoderClassifier(nn.Module):
    """Token ids → embedding + learned positions → ``nn.TransformerEncoder`` → mean pool → classes."""

    def __init__(self, vocab: int = 1000, d_model: int = 128, heads: int = 4, layers: int = 2, seq: int = 64,
                 classes: int = 10) -> None:  # fmt: skip
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.encoder(h).mean(dim=1))


def build_encoder(vocab: int = 1000, d_model: int = 128, heads: int = 4, layers: int = 2, seq: int = 64) -> nn.Module:
    return EncoderClassifier(vocab=vocab, d_model=d_model, heads=heads, layers=layers, seq=seq)


class TemporalConvNet(nn.Module):
    """1-D convolutions over a multichannel series (a TCN without dilation): conv, ReLU, then a linear head."""

    def __init__(self, channels: int = 16, hidden: int = 64, layers: int = 4, length: int = 256, classes: int = 10) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        c = channels
        for _ in range(layers):
            mods += [nn.Conv1d(c, hidden, 5, padding=2), nn.ReLU()]
            c = hidden
        self.body = nn.Sequential(*mods)
        self.head = nn.Linear(hidden * length, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


def build_tcn(channels: int = 16, hidden: int = 64, layers: int = 4, length: int = 256) -> nn.Module:
    return TemporalConvNet(channels=channels, hidden=hidden, layers=layers, length=length)


def build_autoencoder(inputs: int = 784, hidden: int = 512, code: int = 32) -> nn.Module:
    """A dense autoencoder: inputs → hidden → code → hidden → inputs (trained with mse)."""
    return nn.Sequential(
        nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, code), nn.ReLU(),
        nn.Linear(code, hidden), nn.ReLU(), nn.Linear(hidden, inputs),
    )  # fmt: skip
