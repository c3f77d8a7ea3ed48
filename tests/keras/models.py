"""Keras 3 model factories for the kind: keras tests: dense, CNN, transformer block, RNN, a functional model."""

from __future__ import annotations

import keras
from keras import layers


def dense(features: int = 64, hidden: int = 256, classes: int = 10) -> keras.Model:
    return keras.Sequential([keras.Input((features,)), layers.Dense(hidden, activation="relu"),
                             layers.Dense(hidden, activation="relu"), layers.Dense(classes)])


def cnn(size: int = 32, channels: int = 3, filters: int = 16, classes: int = 10) -> keras.Model:
    return keras.Sequential([
        keras.Input((size, size, channels)),
        layers.Conv2D(filters, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(2 * filters, 3, padding="same", activation="relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(classes),
    ])


def transformer_block(seq: int = 32, vocab: int = 500, dim: int = 64, heads: int = 4) -> keras.Model:
    tokens = keras.Input((seq,), dtype="int32")
    h = layers.Embedding(vocab, dim)(tokens)
    a = layers.MultiHeadAttention(heads, dim // heads)(h, h)
    h = layers.LayerNormalization()(h + a)
    f = layers.Dense(4 * dim, activation="gelu")(h)
    h = layers.LayerNormalization()(h + layers.Dense(dim)(f))
    return keras.Model(tokens, layers.Dense(vocab)(h))


def rnn(seq: int = 20, features: int = 16, units: int = 64, classes: int = 5) -> keras.Model:
    return keras.Sequential([keras.Input((seq, features)), layers.LSTM(units), layers.Dense(classes)])


def two_tower(a_features: int = 32, b_features: int = 16, hidden: int = 128) -> keras.Model:
    """A functional-API model of our own: two inputs, two towers, concatenated, one regression head."""
    a = keras.Input((a_features,), name="a")
    b = keras.Input((b_features,), name="b")
    ta = layers.Dense(hidden, activation="relu")(a)
    tb = layers.Dense(hidden // 2, activation="tanh")(b)
    h = layers.Concatenate()([ta, tb])
    h = layers.Dense(hidden, activation="relu")(h)
    return keras.Model([a, b], layers.Dense(1)(h))


def not_a_model() -> object:
    return object()
