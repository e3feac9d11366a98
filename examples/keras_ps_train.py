"""Train a Keras model with ParameterServerStrategy on a local cluster, with TicTac.

Starts 1 PS (with TicTac's gate) and 2 workers, each in its own network namespace
behind a shaped link where root and tc are available (else on loopback; see
examples/pss_cluster.py), trains a small convolutional network on synthetic data with
tf_keras `model.fit`, and switches TicTac on with one line: `callbacks=[TicTac()]`.
Prints, per worker, the step time in TensorFlow's order and in TicTac's, measured in
interleaved blocks of the same run (TicTac's order check), and where the TensorBoard
logs are.

    .venv/bin/python examples/keras_ps_train.py --steps 60 --log_dir runs/keras
    .venv/bin/python examples/keras_ps_train.py --tictac_algorithm=tac --network=loopback
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf_keras: fit supports PSS
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

import tictac_hooks.flags  # noqa: E402,F401  (defines --tictac_* flags)
from pss_cluster import (link_bandwidth, quiet_fit_coordinator,  # noqa: E402
                         run_on_cluster)  # (--network)
from summary import print_summary, write_summary  # noqa: E402

flags.DEFINE_integer("steps", 100, "Training steps (all epochs together).", lower_bound=1)
flags.DEFINE_integer("steps_per_epoch", 10, "Steps per epoch (statistics are read per epoch).",
                     lower_bound=1)
# --log_dir is absl's own flag (absl.logging defines it); here it is the TensorBoard
# directory (default: runs/keras_ps_train).
flags.DEFINE_integer("steps_per_execution", 1, "Training steps per dispatched call "
                     "(compile's steps_per_execution); TicTac orders every one.",
                     lower_bound=1)
flags.DEFINE_integer("workers", 2, "Worker tasks.", lower_bound=1)
flags.DEFINE_integer("ps", 1, "Parameter-server tasks.", lower_bound=1)
flags.DEFINE_integer("batch_size", 256, "Global batch size.", lower_bound=1)
flags.DEFINE_integer("seed", 7, "Random seed for weights and data.")
flags.DEFINE_string("save_weights", None, "Write the trained weights here (.npz).")
flags.DEFINE_string("summary_json", None, "Write TicTac's run summary here (JSON).")
flags.DEFINE_boolean("tictac", True, "Add the TicTac callback (--notictac: plain fit).")
flags.DEFINE_string("backup_dir", None, "Add BackupAndRestore with this directory: a job "
                    "restarted after a PS loss resumes from it, and TicTac restores its "
                    "order from it (no profiling).")
flags.DEFINE_boolean("pacing", True, "On a shaped link, give TicTac the link's rate "
                     "(bandwidth=), so the native gate paces the transfers to it "
                     "(--nopacing: ordered, not paced; to measure what pacing does).")
FLAGS = flags.FLAGS
# Steps are shared among the workers: profile long enough for each to show its own
# order-dependent step time before the switch.
FLAGS.set_default("tictac_profile_steps", 30)


flags.DEFINE_enum("model", "mlp", ["mlp", "cnn"],
                  "mlp: 6 dense layers of 1024 (24 MiB of parameters, each layer's "
                  "transfer about as long as its compute on a 1 Gbit/s link); cnn: a small "
                  "convolutional network (5.6 MiB, most of it in one dense layer).")


def build_model(keras, seed: int, kind: str = "mlp"):
    """A model whose parameters take about as long to move as to use: the setting in
    which the order of the transfers decides how much of the two overlaps."""
    init = keras.initializers.GlorotUniform(seed=seed)
    if kind == "mlp":
        return keras.Sequential(
            [keras.Input((INPUT_DIM,))]
            + [keras.layers.Dense(1024, activation="relu", kernel_initializer=init,
                                  name=f"fc{i}") for i in range(1, 7)]
            + [keras.layers.Dense(10, kernel_initializer=init, name="logits")], name="mlp")
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


INPUT_DIM = 1024


def synthetic_dataset(tf, batch_size: int, seed: int, kind: str = "mlp"):
    rng = tf.random.Generator.from_seed(seed)
    x = rng.normal((512, INPUT_DIM) if kind == "mlp" else (512, 32, 32, 3))
    y = rng.uniform((512,), maxval=10, dtype=tf.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch_size)


def main(argv):
    del argv
    run_on_cluster(train, num_ps=FLAGS.ps, num_workers=FLAGS.workers)


def train(spec: dict) -> None:
    """The coordinator: model.fit under ParameterServerStrategy with TicTac."""
    quiet_fit_coordinator()
    import tensorflow as tf
    import tf_keras as keras

    from tictac_hooks import TicTac

    log_dir = FLAGS.log_dir or os.path.join("runs", "keras_ps_train")
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    keras.utils.set_random_seed(FLAGS.seed)
    with strategy.scope():
        model = build_model(keras, FLAGS.seed, FLAGS.model)
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=FLAGS.steps_per_execution)
    tictac = TicTac(log_dir=log_dir, bandwidth=link_bandwidth() if FLAGS.pacing else None)
    epochs = max(1, FLAGS.steps // FLAGS.steps_per_epoch)
    callbacks = [tictac] if FLAGS.tictac else []
    if FLAGS.backup_dir:
        callbacks.append(keras.callbacks.BackupAndRestore(FLAGS.backup_dir))
    import time
    started = time.perf_counter()
    history = model.fit(synthetic_dataset(tf, FLAGS.batch_size, FLAGS.seed, FLAGS.model),
                        epochs=epochs, steps_per_epoch=FLAGS.steps_per_epoch,
                        callbacks=callbacks, verbose=0)
    # The whole fit, TicTac's profiling, switch and check included: what a user times.
    print(f"fit: {epochs * FLAGS.steps_per_epoch} steps in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    if FLAGS.save_weights:
        import numpy as np
        np.savez(FLAGS.save_weights, *model.get_weights())
    print(f"loss per epoch: {' '.join(f'{x:.4f}' for x in history.history['loss'])}")
    if FLAGS.tictac:
        print_summary(tictac, log_dir)
        write_summary(tictac, FLAGS.summary_json)


if __name__ == "__main__":
    app.run(main)
