"""Built-in workloads of `tictac bench --model`: what PS users train, small enough for a
laptop, each a ``FUNCTION(batch_size)`` returning ``(model, inputs, targets)`` as a
user's file does (bench/user_model.py).

- :func:`dlrm`: a DLRM-style click model. Several embedding tables of different sizes,
  declared in feature-name order (``ad_id``, ``advertiser``, ``country``, ...) and used
  in the model's own order (``user_id`` first, ...); the two large ones (2.6 and 3.8 MB)
  are sharded over the PSes by the strategy's ``MinSizePartitioner`` (``tictac bench
  --min-shard-bytes``, default 256 KiB). A bottom MLP on the dense features, the
  feature interaction (dot products of every pair of the bottom MLP's output and the
  embeddings), a top MLP. Compiled here: SGD, binary cross-entropy on the logit.
- :func:`transformer`: a small subclassed Transformer language model (two blocks)
  whose output layer reuses the token embedding (tied input/output embeddings).
  Not compiled: the bench's SGD and sparse categorical cross-entropy on logits.

Built under the strategy's scope when the bench calls them; nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

SEED = 7

# feature -> rows; every table has DLRM_DIM columns.
DLRM_TABLES = {"ad_id": 40000, "advertiser": 2000, "country": 200, "device": 16,
               "hour": 24, "user_id": 60000}
# The order the model uses them in (its own), unlike their declaration (by name).
DLRM_USE_ORDER = ("user_id", "ad_id", "hour", "device", "advertiser", "country")
DLRM_DIM = 16
DLRM_DENSE = 13


def _dlrm_class(keras: Any, tf: Any) -> type:
    class DLRM(keras.Model):
        """Embedding tables declared by feature name, used in DLRM_USE_ORDER."""

        def __init__(self, seed: int = SEED, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.tables = {}
            for k, (name, rows) in enumerate(sorted(DLRM_TABLES.items())):
                init = keras.initializers.RandomUniform(-0.05, 0.05, seed=seed + k)
                self.tables[name] = keras.layers.Embedding(
                    rows, DLRM_DIM, embeddings_initializer=init, name=f"{name}_table")
            glorot = keras.initializers.GlorotUniform
            self.bottom = [keras.layers.Dense(units, activation="relu", name=f"bottom{i}",
                                              kernel_initializer=glorot(seed + 10 + i))
                           for i, units in enumerate((64, DLRM_DIM), 1)]
            self.top = [keras.layers.Dense(units, activation="relu", name=f"top{i}",
                                           kernel_initializer=glorot(seed + 20 + i))
                        for i, units in enumerate((128, 64), 1)]
            self.logit = keras.layers.Dense(1, name="logit",
                                            kernel_initializer=glorot(seed + 30))
            n = 1 + len(DLRM_TABLES)
            self._pairs = [i * n + j for i in range(n) for j in range(i + 1, n)]

        def call(self, inputs: Any) -> Any:
            x = inputs["dense"]
            for layer in self.bottom:
                x = layer(x)
            features = [x] + [self.tables[name](inputs[name]) for name in DLRM_USE_ORDER]
            stacked = tf.stack(features, axis=1)                    # (B, F, D)
            dots = tf.matmul(stacked, stacked, transpose_b=True)    # (B, F, F)
            n = len(features)
            flat = tf.reshape(dots, (-1, n * n))
            interaction = tf.gather(flat, self._pairs, axis=1)      # i < j pairs
            z = tf.concat([x, interaction], axis=1)
            for layer in self.top:
                z = layer(z)
            return self.logit(z)
    return DLRM


def dlrm(batch_size: int) -> tuple[Any, Any, Any]:
    """DLRM (see the module docstring); inputs a dict of ``dense`` (float) and one int64
    id per table, targets clicks (0/1, shape (batch, 1))."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    model = _dlrm_class(keras, tf)(name="dlrm")
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    rng = np.random.default_rng(SEED)
    inputs = {"dense": rng.normal(size=(batch_size, DLRM_DENSE)).astype("float32")}
    for name, rows in sorted(DLRM_TABLES.items()):
        inputs[name] = rng.integers(0, rows, size=(batch_size,), dtype="int64")
    targets = (rng.random((batch_size, 1)) < 0.25).astype("float32")
    return model, inputs, targets


TRANSFORMER = dict(vocab=4000, dim=128, heads=4, seq=32, blocks=2)


def _transformer_class(keras: Any, tf: Any) -> type:
    class TiedTransformer(keras.Model):
        """``blocks`` Transformer blocks; logits = hidden x token embedding^T (tied)."""

        def __init__(self, vocab: int, dim: int, heads: int, seq: int, blocks: int,
                     seed: int = SEED, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            init = keras.initializers.RandomNormal(stddev=0.02, seed=seed)
            self.token = keras.layers.Embedding(vocab, dim, embeddings_initializer=init,
                                                name="token_embedding")
            self.position = keras.layers.Embedding(seq, dim, embeddings_initializer=init,
                                                   name="position_embedding")
            self.blocks = []
            for b in range(blocks):
                self.blocks.append((
                    keras.layers.MultiHeadAttention(heads, dim // heads,
                                                    kernel_initializer=init,
                                                    name=f"attention{b}"),
                    keras.layers.LayerNormalization(name=f"norm{b}a"),
                    keras.layers.Dense(4 * dim, activation="relu", kernel_initializer=init,
                                       name=f"ff{b}a"),
                    keras.layers.Dense(dim, kernel_initializer=init, name=f"ff{b}b"),
                    keras.layers.LayerNormalization(name=f"norm{b}b")))

        def call(self, tokens: Any) -> Any:
            x = self.token(tokens) + self.position(tf.range(tf.shape(tokens)[1]))
            for attention, norm_a, ff_a, ff_b, norm_b in self.blocks:
                x = norm_a(x + attention(x, x, use_causal_mask=True))
                x = norm_b(x + ff_b(ff_a(x)))
            return tf.matmul(x, self.token.embeddings, transpose_b=True)  # tied
    return TiedTransformer


def transformer(batch_size: int) -> tuple[Any, Any, Any]:
    """The tied-embedding Transformer (not compiled); inputs token ids (batch, seq),
    targets the next tokens (batch, seq)."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    model = _transformer_class(keras, tf)(name="transformer", **TRANSFORMER)
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(0, TRANSFORMER["vocab"], size=(batch_size, TRANSFORMER["seq"] + 1),
                          dtype="int64")
    return model, tokens[:, :-1], tokens[:, 1:]


def cnn(batch_size: int) -> tuple[Any, Any, Any]:
    """A small CNN (the main job's ``--model=cnn``, examples/keras_ps_train.py): three
    convolutions and three dense layers, 5.6 MiB of parameters, most in the first
    dense layer; 32x32x3 images, 10 classes. Not compiled: the bench's SGD and sparse
    categorical cross-entropy on logits."""
    import numpy as np
    import tf_keras as keras
    init = lambda: keras.initializers.GlorotUniform(seed=SEED)  # noqa: E731
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu", kernel_initializer=init(), name="conv1"),
        keras.layers.Conv2D(64, 3, strides=2, activation="relu", kernel_initializer=init(),
                            name="conv2"),
        keras.layers.Conv2D(64, 3, strides=2, activation="relu", kernel_initializer=init(),
                            name="conv3"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(512, activation="relu", kernel_initializer=init(), name="fc1"),
        keras.layers.Dense(256, activation="relu", kernel_initializer=init(), name="fc2"),
        keras.layers.Dense(10, kernel_initializer=init(), name="logits"),
    ], name="cnn")
    rng = np.random.default_rng(SEED)
    inputs = rng.normal(size=(batch_size, 32, 32, 3)).astype("float32")
    targets = rng.integers(0, 10, size=(batch_size,), dtype="int64")
    return model, inputs, targets


BUILDERS = {"dlrm": dlrm, "transformer": transformer, "cnn": cnn}
DEFAULT_BATCH = {"dlrm": 256, "transformer": 16, "cnn": 32}
