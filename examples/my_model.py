"""Your own model in `tictac bench`: a file with a function ``make(batch_size)``.

    tictac bench --frontend fit --model examples/my_model.py:make --workers 2 --ps 2

``make`` returns ``(model, inputs, targets)``: a tf_keras model (built and compiled
inside the benchmark's ParameterServerStrategy scope, since the bench calls ``make``
there), and one batch of inputs and targets, arrays or dicts of arrays, that the bench
repeats. This model is not compiled, so the bench compiles it with SGD and sparse
categorical cross-entropy on logits (and says so); compile it here to choose your own.

The model: a subclassed two-input classifier that declares its layers in another order
than it uses them (as subclassed models often do), so that the variable-list order of
BytePS and ByteScheduler (``declared``) differs from the order the step needs them in.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf_keras as keras

VOCAB, TOKENS, DENSE, CLASSES = 5000, 8, 32, 10


class TwoInputClassifier(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        init = keras.initializers.GlorotUniform(seed=7)
        # Declared head first...
        self.head = keras.layers.Dense(CLASSES, kernel_initializer=init, name="head")
        self.hidden = keras.layers.Dense(256, activation="relu", kernel_initializer=init,
                                         name="hidden")
        self.dense_in = keras.layers.Dense(64, activation="relu", kernel_initializer=init,
                                           name="dense_in")
        self.tokens = keras.layers.Embedding(VOCAB, 32, name="tokens",
                                             embeddings_initializer=keras.initializers
                                             .RandomUniform(-0.05, 0.05, seed=7))

    def call(self, inputs):
        # ...used input first.
        words = tf.reduce_mean(self.tokens(inputs["tokens"]), axis=1)
        x = keras.layers.concatenate([words, self.dense_in(inputs["dense"])])
        return self.head(self.hidden(x))


def make(batch_size):
    rng = np.random.default_rng(7)
    inputs = {"tokens": rng.integers(0, VOCAB, size=(batch_size, TOKENS), dtype="int64"),
              "dense": rng.normal(size=(batch_size, DENSE)).astype("float32")}
    targets = rng.integers(0, CLASSES, size=(batch_size,), dtype="int64")
    return TwoInputClassifier(name="my_model"), inputs, targets
