"""TensorFlow's PS tutorial, and the models PS users train, under `fit` with TicTac.

A local cluster (``--ps`` PS tasks with TicTac's gate, ``--workers`` workers; on
loopback or on a shaped link, examples/pss_cluster.py), the strategy with the
tutorial's ``variable_partitioner`` (MinSizePartitioner, one shard per PS), and one of
the models of examples/ps_models.py compiled with ``--steps_per_execution`` (the
tutorial uses 10), fed through ``DatasetCreator``, with the tutorial's callbacks
(TensorBoard, ModelCheckpoint, BackupAndRestore) plus ``TicTac()``.

    .venv/bin/python examples/ps_workloads_train.py --model tutorial --network loopback
    .venv/bin/python examples/ps_workloads_train.py --model tied_transformer --ps 2
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf_keras: fit supports PSS
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

import tictac_hooks.flags  # noqa: E402,F401  (defines --tictac_* flags)
import ps_models  # noqa: E402
from pss_cluster import (link_bandwidth, quiet_fit_coordinator,  # noqa: E402
                         run_on_cluster)  # (--network)
from summary import print_summary, write_summary  # noqa: E402

flags.DEFINE_enum("model", "tutorial", sorted(ps_models.BUILDERS),
                  "Which model (examples/ps_models.py).")
flags.DEFINE_integer("steps", 60, "Training steps (all epochs together).", lower_bound=1)
flags.DEFINE_integer("steps_per_epoch", 20, "Steps per epoch.", lower_bound=1)
flags.DEFINE_integer("steps_per_execution", 10, "Training steps per dispatched call "
                     "(compile's steps_per_execution; the tutorial uses 10).", lower_bound=1)
flags.DEFINE_integer("workers", 2, "Worker tasks.", lower_bound=1)
flags.DEFINE_integer("ps", 2, "Parameter-server tasks.", lower_bound=1)
flags.DEFINE_integer("min_shard_bytes", 256 << 10, "The partitioner's smallest shard "
                     "(the tutorial's 256 KiB).", lower_bound=1)
flags.DEFINE_integer("seed", 7, "Random seed for weights and data.")
flags.DEFINE_string("save_weights", None, "Write the trained weights here (.npz).")
flags.DEFINE_string("summary_json", None, "Write TicTac's run summary here (JSON).")
flags.DEFINE_boolean("tictac", True, "Add the TicTac callback (--notictac: plain fit).")
flags.DEFINE_boolean("tutorial_callbacks", True, "Add the tutorial's TensorBoard, "
                     "ModelCheckpoint and BackupAndRestore callbacks.")
FLAGS = flags.FLAGS
FLAGS.set_default("tictac_profile_steps", 20)


def main(argv):
    del argv
    run_on_cluster(train, num_ps=FLAGS.ps, num_workers=FLAGS.workers)


def train(spec: dict) -> None:
    """The coordinator: model.fit under ParameterServerStrategy, the tutorial's way."""
    import tempfile
    quiet_fit_coordinator()
    import tensorflow as tf
    import tf_keras as keras

    from tictac_hooks import TicTac

    log_dir = FLAGS.log_dir or os.path.join("runs", f"ps_{FLAGS.model}")
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=ps_models.tutorial_partitioner(
            tf, FLAGS.ps, FLAGS.min_shard_bytes))
    keras.utils.set_random_seed(FLAGS.seed)
    with strategy.scope():
        model, dataset_fn = ps_models.BUILDERS[FLAGS.model](keras, tf, seed=FLAGS.seed)
        ps_models.compile_model(keras, model, FLAGS.model, FLAGS.steps_per_execution)
    callbacks = []
    work = tempfile.mkdtemp(prefix="ps_workloads_")
    if FLAGS.tutorial_callbacks:
        callbacks += [keras.callbacks.TensorBoard(log_dir=os.path.join(log_dir, "keras")),
                      keras.callbacks.ModelCheckpoint(filepath=os.path.join(work, "ckpt")),
                      keras.callbacks.BackupAndRestore(backup_dir=os.path.join(work, "backup"))]
    tictac = TicTac(log_dir=log_dir, bandwidth=link_bandwidth()) if FLAGS.tictac else None
    if tictac is not None:
        callbacks.append(tictac)
    epochs = max(1, FLAGS.steps // FLAGS.steps_per_epoch)
    try:
        history = model.fit(keras.utils.experimental.DatasetCreator(dataset_fn),
                            epochs=epochs, steps_per_epoch=FLAGS.steps_per_epoch,
                            callbacks=callbacks, verbose=0)
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    if FLAGS.save_weights:
        import numpy as np
        np.savez(FLAGS.save_weights, *model.get_weights())
    print(f"loss per epoch: {' '.join(f'{x:.4f}' for x in history.history['loss'])}")
    if tictac is not None:
        print_summary(tictac, log_dir)
        write_summary(tictac, FLAGS.summary_json)


if __name__ == "__main__":
    app.run(main)
