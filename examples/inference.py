"""Distributed inference (model.evaluate) under ParameterServerStrategy, with TicTac.

The paper's inference workloads (e.g. RL agents evaluating a policy) pull every
parameter each step and compute only the forward pass, so the transfer order matters
most there. Starts 1 PS (behind the rendezvous) and 2 workers on localhost and runs
tf_keras `model.evaluate` with `callbacks=[TicTac()]`.

    .venv/bin/python examples/inference.py --steps 100 --log_dir runs/inference
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

import tictac_hooks.flags  # noqa: E402,F401  (defines --tictac_* flags)
from pss_cluster import run_on_cluster  # noqa: E402  (--network)
from summary import print_summary, write_summary  # noqa: E402

flags.DEFINE_integer("steps", 100, "Evaluation steps.", lower_bound=1)
flags.DEFINE_integer("workers", 2, "Worker tasks.", lower_bound=1)
flags.DEFINE_integer("ps", 1, "Parameter-server tasks.", lower_bound=1)
flags.DEFINE_integer("batch_size", 16, "Global batch size.", lower_bound=1)
flags.DEFINE_integer("seed", 11, "Random seed.")
flags.DEFINE_string("summary_json", None, "Write TicTac's run summary here (JSON).")
FLAGS = flags.FLAGS
FLAGS.set_default("tictac_profile_steps", 30)


def main(argv):
    del argv
    run_on_cluster(train, num_ps=FLAGS.ps, num_workers=FLAGS.workers)


def train(spec: dict) -> None:
    """The coordinator, against the cluster ``spec``."""
    logging.set_verbosity(logging.WARNING)
    import tensorflow as tf
    import tf_keras as keras

    from tictac_hooks import TicTac

    log_dir = FLAGS.log_dir or os.path.join("runs", "inference")
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    keras.utils.set_random_seed(FLAGS.seed)
    with strategy.scope():
        init = keras.initializers.GlorotUniform(seed=FLAGS.seed)
        model = keras.Sequential(
            [keras.layers.Dense(n, activation="relu", kernel_initializer=init, name=f"fc{i}")
             for i, n in enumerate((1024, 1024, 512, 512))]
            + [keras.layers.Dense(10, kernel_initializer=init, name="logits")], name="policy")
        model.build((None, 128))
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True), metrics=["accuracy"])
    x = tf.random.stateless_normal((512, 128), seed=[FLAGS.seed, 0])
    y = tf.random.stateless_uniform((512,), seed=[FLAGS.seed, 1], maxval=10, dtype=tf.int64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(FLAGS.batch_size)
    tictac = TicTac(log_dir=log_dir)
    results = model.evaluate(dataset, steps=FLAGS.steps, callbacks=[tictac], verbose=0,
                             return_dict=True)
    print("evaluate:", {k: round(float(v), 4) for k, v in results.items()})
    print_summary(tictac, os.path.join(log_dir, "test"))
    write_summary(tictac, FLAGS.summary_json)


if __name__ == "__main__":
    app.run(main)
