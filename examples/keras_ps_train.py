"""Train a Keras model with ParameterServerStrategy on a local cluster, with TicTac.

Starts 1 PS (behind the TicTac rendezvous) and 2 workers on localhost, trains a small
convolutional network on synthetic data with tf_keras `model.fit`, and switches TicTac
on with one line: `callbacks=[TicTac()]`. Prints the median step time before and after
the switch, per worker, and where the TensorBoard logs are.

    .venv/bin/python examples/keras_ps_train.py --steps 60 --log_dir runs/keras
    .venv/bin/python examples/keras_ps_train.py --tictac_algorithm=tac
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf_keras: fit supports PSS
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

import tictac_hooks.flags  # noqa: E402,F401  (defines --tictac_* flags)

flags.DEFINE_integer("steps", 100, "Training steps (all epochs together).", lower_bound=1)
flags.DEFINE_integer("steps_per_epoch", 10, "Steps per epoch (statistics are read per epoch).",
                     lower_bound=1)
# --log_dir is absl's own flag (absl.logging defines it); here it is the TensorBoard
# directory (default: runs/keras_ps_train).
flags.DEFINE_integer("workers", 2, "Worker tasks.", lower_bound=1)
flags.DEFINE_integer("ps", 1, "Parameter-server tasks.", lower_bound=1)
flags.DEFINE_integer("batch_size", 32, "Global batch size.", lower_bound=1)
flags.DEFINE_integer("seed", 7, "Random seed for weights and data.")
flags.DEFINE_string("save_weights", None, "Write the trained weights here (.npz).")
flags.DEFINE_string("summary_json", None, "Write TicTac's run summary here (JSON).")
flags.DEFINE_boolean("tictac", True, "Add the TicTac callback (--notictac: plain fit).")
FLAGS = flags.FLAGS
# Steps are shared among the workers: profile long enough for each to show its own
# order-dependent step time before the switch.
FLAGS.set_default("tictac_profile_steps", 30)


def build_model(keras, seed: int):
    """A small CNN whose parameters (about 8 MiB) take as long to move as to use."""
    init = keras.initializers.GlorotUniform(seed=seed)
    return keras.Sequential([
        keras.layers.Conv2D(32, 3, activation="relu", input_shape=(32, 32, 3),
                            kernel_initializer=init, name="conv1"),
        keras.layers.Conv2D(64, 3, strides=2, activation="relu", kernel_initializer=init, name="conv2"),
        keras.layers.Conv2D(64, 3, strides=2, activation="relu", kernel_initializer=init, name="conv3"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(512, activation="relu", kernel_initializer=init, name="fc1"),
        keras.layers.Dense(256, activation="relu", kernel_initializer=init, name="fc2"),
        keras.layers.Dense(10, kernel_initializer=init, name="logits"),
    ], name="cnn")


def synthetic_dataset(tf, batch_size: int, seed: int):
    rng = tf.random.Generator.from_seed(seed)
    x = rng.normal((512, 32, 32, 3))
    y = rng.uniform((512,), maxval=10, dtype=tf.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch_size)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # TF's cluster set-up chatter
    import tensorflow as tf
    import tf_keras as keras

    from tictac_hooks import TicTac
    from tictac_hooks.enforce.launcher import LocalCluster

    log_dir = FLAGS.log_dir or os.path.join("runs", "keras_ps_train")
    with LocalCluster(num_ps=FLAGS.ps, num_workers=FLAGS.workers, rendezvous=True,
                      chief=True) as cluster:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster.spec), task_type="chief", task_id=0, rpc_layer="grpc")
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        keras.utils.set_random_seed(FLAGS.seed)
        with strategy.scope():
            model = build_model(keras, FLAGS.seed)
            model.compile(optimizer=keras.optimizers.SGD(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        tictac = TicTac(log_dir=log_dir)
        epochs = max(1, FLAGS.steps // FLAGS.steps_per_epoch)
        history = model.fit(synthetic_dataset(tf, FLAGS.batch_size, FLAGS.seed),
                            epochs=epochs, steps_per_epoch=FLAGS.steps_per_epoch,
                            callbacks=[tictac] if FLAGS.tictac else [], verbose=0)
        if FLAGS.save_weights:
            import numpy as np
            np.savez(FLAGS.save_weights, *model.get_weights())
        print(f"loss per epoch: {' '.join(f'{x:.4f}' for x in history.history['loss'])}")
        if FLAGS.tictac:
            from common import print_summary, write_summary
            print_summary(tictac, log_dir)
            write_summary(tictac, FLAGS.summary_json)


if __name__ == "__main__":
    app.run(main)
