"""The chief of deploy/tfjob.yaml: tf_keras `model.fit` under ParameterServerStrategy with
TicTac, the shape of TensorFlow's parameter-server tutorial. Replace the model and the
data with yours; the lines marked "(TicTac)" and "(TFJob)" are the ones to keep.

The chief is the coordinator: it reads the cluster from TF_CONFIG (the operator sets it
in the container named `tensorflow`), creates the variables on the PS replicas and
dispatches steps to the worker replicas. With --backup_dir, a restarted chief (after a
PS was lost, say) resumes from the last finished epoch.

    python train.py --epochs 10 --steps_per_epoch 40 --backup_dir /ckpt/backup
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # (TicTac) tf_keras: its fit runs PSS

from absl import app, flags, logging  # noqa: E402

import tictac_hooks.flags  # noqa: E402,F401  (TicTac) the --tictac_* flags

flags.DEFINE_integer("epochs", 10, "Epochs to train.", lower_bound=1)
flags.DEFINE_integer("steps_per_epoch", 40, "Training steps per epoch.", lower_bound=1)
flags.DEFINE_integer("batch_size", 64, "Global batch size.", lower_bound=1)
flags.DEFINE_integer("width", 256, "Units of each hidden layer.", lower_bound=1)
flags.DEFINE_boolean("tictac", True, "Add the TicTac callback (--notictac: plain fit, for PS "
                     "replicas started with `tictac ps --tf-config --no-rendezvous`).")
flags.DEFINE_string("backup_dir", None, "Where BackupAndRestore keeps the training state "
                    "(a volume that outlives the container; default: no backup).")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    del argv
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # no cluster chatter; TicTac still says
    import tensorflow as tf
    import tf_keras as keras

    from tictac_hooks import TicTac

    # (TFJob) the cluster and this task's role come from TF_CONFIG.
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    num_ps = len(resolver.cluster_spec().as_dict().get("ps", ()))
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners
        .MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=num_ps))
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,))] + [
            keras.layers.Dense(FLAGS.width, activation="relu", name=f"hidden{i}")
            for i in range(3)] + [keras.layers.Dense(10, name="logits")])
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = input_context.get_per_replica_batch_size(FLAGS.batch_size)
        x = tf.random.stateless_normal((1024, 64), seed=(1, input_context.input_pipeline_id))
        y = tf.random.stateless_uniform((1024,), seed=(2, 0), maxval=10, dtype=tf.int64)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch).prefetch(2)

    tictac = TicTac()  # (TicTac) the one line: profile, order, install on every PS
    callbacks = [tictac] if FLAGS.tictac else []
    if FLAGS.backup_dir:
        callbacks.append(keras.callbacks.BackupAndRestore(backup_dir=FLAGS.backup_dir))
    history = model.fit(keras.utils.experimental.DatasetCreator(dataset_fn),
                        epochs=FLAGS.epochs, steps_per_epoch=FLAGS.steps_per_epoch,
                        callbacks=callbacks, verbose=2)
    print(f"loss per epoch: {' '.join(f'{x:.4f}' for x in history.history['loss'])}")
    if not FLAGS.tictac:
        return
    order = (tictac.summary or {}).get("order", {})
    # The PSes' records of the steps run in TicTac's order (docs/DEPLOYING.md).
    print(f"TicTac order followed: {order.get('followed', 0)} of "
          f"{order.get('scheduled_steps', 0)} scheduled steps (skips "
          f"{order.get('skips', 0)}, violations {order.get('violations', 0)})", flush=True)


if __name__ == "__main__":
    app.run(main)
