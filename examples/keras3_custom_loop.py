"""Keras 3 + ParameterServerStrategy in a custom ClusterCoordinator loop, with TicTac.

Keras 3's `model.fit` does not support ParameterServerStrategy, but Keras 3 models train
under it in a custom loop; `TicTacLoop` switches such a loop to one transfer order.
Starts 1 PS (behind the rendezvous) and 2 workers on localhost.

    .venv/bin/python examples/keras3_custom_loop.py --steps 80 --log_dir runs/keras3
"""

from __future__ import annotations

import os

os.environ.pop("TF_USE_LEGACY_KERAS", None)  # Keras 3
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

import tictac_hooks.flags  # noqa: E402,F401  (defines --tictac_* flags)
from pss_cluster import run_on_cluster  # noqa: E402  (--network)
from summary import print_summary, write_summary  # noqa: E402

flags.DEFINE_integer("steps", 80, "Training steps.", lower_bound=1)
flags.DEFINE_integer("workers", 2, "Worker tasks.", lower_bound=1)
flags.DEFINE_integer("ps", 1, "Parameter-server tasks.", lower_bound=1)
flags.DEFINE_integer("batch_size", 32, "Per-worker batch size.", lower_bound=1)
flags.DEFINE_integer("seed", 5, "Random seed.")
flags.DEFINE_string("summary_json", None, "Write TicTac's run summary here (JSON).")
FLAGS = flags.FLAGS
FLAGS.set_default("tictac_profile_steps", 20)


def main(argv):
    del argv
    run_on_cluster(train, num_ps=FLAGS.ps, num_workers=FLAGS.workers)


def train(spec: dict) -> None:
    """The coordinator, against the cluster ``spec``."""
    logging.set_verbosity(logging.WARNING)
    import keras
    import tensorflow as tf

    from tictac_hooks import TicTacLoop

    log_dir = FLAGS.log_dir or os.path.join("runs", "keras3_custom_loop")
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    keras.utils.set_random_seed(FLAGS.seed)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(512, activation="relu", name="fc1"),
            keras.layers.Dense(512, activation="relu", name="fc2"),
            keras.layers.Dense(256, activation="relu", name="fc3"),
            keras.layers.Dense(10, name="logits")], name="mlp")
        optimizer = keras.optimizers.SGD(0.01)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=optimizer, loss=loss_fn)  # for TAC's compute profile

    def dataset_fn():
        x = tf.random.stateless_normal((256, 64), seed=[FLAGS.seed, 0])
        y = tf.random.stateless_uniform((256,), seed=[FLAGS.seed, 1], maxval=10,
                                        dtype=tf.int64)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(FLAGS.batch_size)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(iterator):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        x, y = next(iterator)
        return strategy.run(replica_step, args=(x, y))

    with TicTacLoop(coordinator, train_step, log_dir=log_dir, model=model,
                    batch_size=FLAGS.batch_size) as tictac:
        for _ in range(FLAGS.steps):
            loss = coordinator.schedule(train_step, args=(iterator,))
            tictac.step()
    print(f"last loss {loss.fetch():.4f}")
    print_summary(tictac, log_dir)
    write_summary(tictac, FLAGS.summary_json)


if __name__ == "__main__":
    app.run(main)
