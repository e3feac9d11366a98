"""The models people train with ParameterServerStrategy, small enough for a laptop.

Each builder takes the Keras module (``tf_keras`` for ``fit`` under
ParameterServerStrategy), TensorFlow and a seed, and returns ``(model, dataset_fn)``:
build it inside ``strategy.scope()``, compile it yourself, and feed
``keras.utils.experimental.DatasetCreator(dataset_fn)`` to ``fit``. The datasets are
made here from a seed (no download).

- :func:`tutorial`: TensorFlow's PS tutorial model (StringLookup ids, one Embedding
  table of 16384 columns sharded over the PSes by the strategy's
  ``variable_partitioner``, a Dense head).
- :func:`recommender`: several embedding tables of different sizes (feature-keyed,
  a dict of inputs) and an MLP tower.
- :func:`tied_transformer`: a subclassed one-block Transformer language model whose
  output layer reuses the token embedding (logits = hidden x embedding^T).
- :func:`sharded_mlp`: an MLP whose kernels the partitioner shards.
- :func:`reverse_declared`: a subclassed MLP that declares its layers in the opposite
  order of their use.

The partitioner TensorFlow's tutorial uses is :func:`tutorial_partitioner`.
"""

from __future__ import annotations

from typing import Any, Callable

VOCAB = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"]


def tutorial_partitioner(tf: Any, num_ps: int, min_shard_bytes: int = 256 << 10) -> Any:
    """The tutorial's ``variable_partitioner``: shards of at least 256 KiB, one per PS."""
    return tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_shard_bytes, max_shards=num_ps)


def tutorial(keras: Any, tf: Any, seed: int = 7, batch_size: int = 32
             ) -> tuple[Any, Callable[[Any], Any]]:
    """The tutorial's model: three string features -> ids -> Embedding(16384) -> mean
    -> Dense(1, sigmoid); label "yes" when "avenger" is among the features."""
    import random
    rng = random.Random(seed)
    features = [rng.sample(VOCAB, 3) for _ in range(200)]
    labels = [[1.0 if "avenger" in f else 0.0] for f in features]
    lookup = keras.layers.StringLookup(vocabulary=VOCAB, mask_token=None)
    init = keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
    ids = keras.Input(shape=(3,), dtype=tf.int64, name="features")
    emb = keras.layers.Embedding(len(VOCAB) + 1, 16384, embeddings_initializer=init,
                                 name="embedding")(ids)
    out = keras.layers.Dense(1, activation="sigmoid",
                             kernel_initializer=keras.initializers.GlorotUniform(seed),
                             kernel_regularizer=keras.regularizers.L2(1e-4),
                             name="dense")(tf.reduce_mean(emb, axis=1))
    model = keras.Model({"features": ids}, out, name="tutorial")

    def dataset_fn(context: Any = None) -> Any:
        ds = tf.data.Dataset.from_tensor_slices(({"features": features}, labels))
        ds = ds.map(lambda x, y: ({"features": lookup(x["features"])}, y))
        return ds.shuffle(200, seed=seed).batch(batch_size).repeat()
    return model, dataset_fn


RECOMMENDER_TABLES = {"user": (5000, 64), "item": (20000, 64), "category": (50, 16)}


def recommender(keras: Any, tf: Any, seed: int = 7, batch_size: int = 64
                ) -> tuple[Any, Callable[[Any], Any]]:
    """Feature-keyed embedding tables (user 5000x64, item 20000x64, category 50x16)
    concatenated into a 256-128-1 MLP tower; a dict of int64 inputs."""
    inputs, parts = {}, []
    for name, (rows, dim) in RECOMMENDER_TABLES.items():
        inputs[name] = keras.Input(shape=(), dtype=tf.int64, name=name)
        init = keras.initializers.RandomUniform(-0.05, 0.05, seed=seed + rows)
        parts.append(keras.layers.Embedding(rows, dim, embeddings_initializer=init,
                                            name=f"{name}_embedding")(inputs[name]))
    x = keras.layers.Concatenate(name="features")(parts)
    for i, units in enumerate((256, 128), 1):
        x = keras.layers.Dense(units, activation="relu", name=f"tower{i}",
                               kernel_initializer=keras.initializers.GlorotUniform(seed + i))(x)
    out = keras.layers.Dense(1, activation="sigmoid", name="click",
                             kernel_initializer=keras.initializers.GlorotUniform(seed))(x)
    model = keras.Model(inputs, out, name="recommender")

    def dataset_fn(context: Any = None) -> Any:
        n = 1024
        feats = {name: tf.random.stateless_uniform((n,), (seed, k), maxval=rows,
                                                   dtype=tf.int64)
                 for k, (name, (rows, _)) in enumerate(RECOMMENDER_TABLES.items())}
        label = tf.cast((feats["user"] + feats["item"]) % 3 == 0, tf.float32)
        ds = tf.data.Dataset.from_tensor_slices((feats, label))
        return ds.batch(batch_size).repeat()
    return model, dataset_fn


def _tied_transformer_class(keras: Any, tf: Any) -> type:
    class TiedTransformer(keras.Model):
        """One Transformer block; logits reuse the token embedding (tied weights)."""

        def __init__(self, vocab: int = 2000, dim: int = 128, heads: int = 4,
                     seq: int = 32, seed: int = 7, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            init = keras.initializers.RandomNormal(stddev=0.02, seed=seed)
            self.vocab, self.dim, self.heads, self.seq, self.seed = vocab, dim, heads, seq, seed
            self.token = keras.layers.Embedding(vocab, dim, embeddings_initializer=init,
                                                name="token_embedding")
            self.position = keras.layers.Embedding(seq, dim, embeddings_initializer=init,
                                                   name="position_embedding")
            self.attention = keras.layers.MultiHeadAttention(
                heads, dim // heads, kernel_initializer=init, name="attention")
            self.norm1 = keras.layers.LayerNormalization(name="norm1")
            self.ff1 = keras.layers.Dense(4 * dim, activation="relu",
                                          kernel_initializer=init, name="ff1")
            self.ff2 = keras.layers.Dense(dim, kernel_initializer=init, name="ff2")
            self.norm2 = keras.layers.LayerNormalization(name="norm2")

        def call(self, tokens: Any) -> Any:
            x = self.token(tokens) + self.position(tf.range(tf.shape(tokens)[1]))
            x = self.norm1(x + self.attention(x, x, use_causal_mask=True))
            x = self.norm2(x + self.ff2(self.ff1(x)))
            return tf.matmul(x, self.token.embeddings, transpose_b=True)  # tied

        def get_config(self) -> dict[str, Any]:
            return {"vocab": self.vocab, "dim": self.dim, "heads": self.heads,
                    "seq": self.seq, "seed": self.seed, "name": self.name}
    return TiedTransformer


def tied_transformer(keras: Any, tf: Any, seed: int = 7, batch_size: int = 16,
                     vocab: int = 2000, seq: int = 32
                     ) -> tuple[Any, Callable[[Any], Any]]:
    """A subclassed language model, next-token targets on random token streams."""
    model = _tied_transformer_class(keras, tf)(vocab=vocab, seq=seq, seed=seed,
                                               name="tied_transformer")
    model.build((None, seq))  # built before fit (BackupAndRestore needs its weights)

    def dataset_fn(context: Any = None) -> Any:
        tokens = tf.random.stateless_uniform((256, seq + 1), (seed, 0), maxval=vocab,
                                             dtype=tf.int64)
        ds = tf.data.Dataset.from_tensor_slices((tokens[:, :-1], tokens[:, 1:]))
        return ds.batch(batch_size).repeat()
    return model, dataset_fn


def sharded_mlp(keras: Any, tf: Any, seed: int = 7, batch_size: int = 64,
                width: int = 512, depth: int = 3) -> tuple[Any, Callable[[Any], Any]]:
    """fc1..fc<depth> of ``width`` units and a 10-way head; 1 MiB kernels, which a
    64 KiB MinSizePartitioner shards over the PSes."""
    init = keras.initializers.GlorotUniform(seed)
    model = keras.Sequential(
        [keras.Input((width,))]
        + [keras.layers.Dense(width, activation="relu", kernel_initializer=init,
                              name=f"fc{i}") for i in range(1, depth + 1)]
        + [keras.layers.Dense(10, kernel_initializer=init, name="logits")],
        name="sharded_mlp")

    def dataset_fn(context: Any = None) -> Any:
        x = tf.random.stateless_normal((512, width), (seed, 0))
        y = tf.random.stateless_uniform((512,), (seed, 1), maxval=10, dtype=tf.int64)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).repeat()
    return model, dataset_fn


def _reverse_declared_class(keras: Any) -> type:
    class ReverseDeclared(keras.Model):
        """Declares its layers head first; calls them input first."""

        def __init__(self, width: int = 256, seed: int = 7, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            init = keras.initializers.GlorotUniform(seed)
            self.width, self.seed = width, seed
            self.head = keras.layers.Dense(10, kernel_initializer=init, name="head")
            self.fc3 = keras.layers.Dense(width, "relu", kernel_initializer=init, name="fc3")
            self.fc2 = keras.layers.Dense(width, "relu", kernel_initializer=init, name="fc2")
            self.fc1 = keras.layers.Dense(width, "relu", kernel_initializer=init, name="fc1")

        def call(self, x: Any) -> Any:
            return self.head(self.fc3(self.fc2(self.fc1(x))))

        def get_config(self) -> dict[str, Any]:
            return {"width": self.width, "seed": self.seed, "name": self.name}
    return ReverseDeclared


def reverse_declared(keras: Any, tf: Any, seed: int = 7, batch_size: int = 64,
                     width: int = 256) -> tuple[Any, Callable[[Any], Any]]:
    model = _reverse_declared_class(keras)(width=width, seed=seed, name="reverse_declared")
    model.build((None, width))

    def dataset_fn(context: Any = None) -> Any:
        x = tf.random.stateless_normal((512, width), (seed, 0))
        y = tf.random.stateless_uniform((512,), (seed, 1), maxval=10, dtype=tf.int64)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).repeat()
    return model, dataset_fn


BUILDERS = {"tutorial": tutorial, "recommender": recommender,
            "tied_transformer": tied_transformer, "sharded_mlp": sharded_mlp,
            "reverse_declared": reverse_declared}
# What each model is compiled with (loss, whether the label is a class index).
LOSSES = {"tutorial": "binary_crossentropy", "recommender": "binary_crossentropy",
          "tied_transformer": "sparse_categorical_crossentropy_logits",
          "sharded_mlp": "sparse_categorical_crossentropy_logits",
          "reverse_declared": "sparse_categorical_crossentropy_logits"}


def compile_model(keras: Any, model: Any, kind: str, steps_per_execution: int = 1,
                  learning_rate: float = 0.05) -> None:
    """SGD and the model's loss, as the tests and the examples compile it."""
    loss = LOSSES[kind]
    if loss == "sparse_categorical_crossentropy_logits":
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss=loss,
                  steps_per_execution=steps_per_execution)
