"""Graph-mode (tf.compat.v1) PS training with TicTac as a session hook.

Starts a local cluster (1 PS behind the TicTac rendezvous, 2 workers by default) and
trains an MLP inside `MonitoredTrainingSession(hooks=[TicTacHook(...)])`, with either
replication the paper used:

* in-graph (default): one client builds a tower on every worker, averages their
  gradients and applies them to the variables on the PS (synchronous);
* between-graph (`--replication=between`): one client process per worker, each with
  its own graph and hook; the chief's hook installs the schedule, every worker's steps
  follow it (asynchronous updates).

    .venv/bin/python examples/graph_mode_train.py --steps 60 --log_dir runs/graph
    .venv/bin/python examples/graph_mode_train.py --replication=between
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

import tictac_hooks.flags  # noqa: E402,F401  (defines --tictac_* flags)

flags.DEFINE_integer("steps", 60, "Training steps.", lower_bound=1)
flags.DEFINE_integer("workers", 2, "Worker tasks (one tower each).", lower_bound=1)
flags.DEFINE_integer("ps", 1, "Parameter-server tasks (variables placed round-robin).",
                     lower_bound=1)
flags.DEFINE_integer("batch_size", 64, "Per-tower batch size.", lower_bound=1)
flags.DEFINE_integer("seed", 3, "Graph-level random seed.")
flags.DEFINE_string("save_weights", None, "Write the trained weights here (.npz).")
flags.DEFINE_string("summary_json", None, "Write TicTac's run summary here (JSON).")
flags.DEFINE_boolean("tictac", True, "Add the TicTac hook (--notictac: plain training).")
flags.DEFINE_enum("replication", "in-graph", ["in-graph", "between"],
                  "in-graph: one client, a tower per worker; between: a client per worker.")
flags.DEFINE_string("cluster_spec", None, "(between-graph child) the cluster to join, JSON.")
flags.DEFINE_integer("task_index", 0, "(between-graph child) this client's worker task.",
                     lower_bound=0)
FLAGS = flags.FLAGS
FLAGS.set_default("tictac_profile_steps", 15)

LAYERS = (256, 512, 512, 512, 256, 10)


def make_weights(tf, seed: int):
    """The MLP's variables (created under the caller's device function)."""
    weights = []
    for i, (n_in, n_out) in enumerate(zip(LAYERS[:-1], LAYERS[1:])):
        weights.append(tf.compat.v1.get_variable(
            f"dense{i}/kernel", [n_in, n_out],
            initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed + i)))
        weights.append(tf.compat.v1.get_variable(
            f"dense{i}/bias", [n_out], initializer=tf.compat.v1.zeros_initializer()))
    return weights


def tower_loss(tf, weights, batch_size: int, seed: int, task: int):
    """Synthetic batch of worker ``task`` through the MLP; mean cross-entropy."""
    x = tf.random.stateless_normal([batch_size, LAYERS[0]], seed=[seed, task])
    labels = tf.random.stateless_uniform([batch_size], seed=[seed, 100 + task],
                                         maxval=LAYERS[-1], dtype=tf.int32)
    h = x
    for i in range(0, len(weights), 2):
        h = tf.matmul(h, weights[i]) + weights[i + 1]
        if i + 2 < len(weights):
            h = tf.nn.relu(h)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=h))


def build(tf, num_workers: int, num_ps: int, batch_size: int, seed: int):
    """In-graph: variables on the PS tasks, one tower per worker, averaged gradients."""
    tf.compat.v1.set_random_seed(seed)
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(ps_tasks=num_ps)):
        weights = make_weights(tf, seed)
        global_step = tf.compat.v1.train.get_or_create_global_step()
    tower_grads, losses = [], []
    for w in range(num_workers):
        with tf.device(f"/job:worker/task:{w}"), tf.name_scope(f"tower{w}"):
            loss = tower_loss(tf, weights, batch_size, seed, w)
            losses.append(loss)
            tower_grads.append(tf.gradients(loss, weights))
    with tf.device("/job:worker/task:0"):
        grads = [tf.add_n(list(g)) / num_workers for g in zip(*tower_grads)]
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).apply_gradients(
            zip(grads, weights), global_step=global_step)
        mean_loss = tf.add_n(losses) / num_workers
    return train_op, mean_loss, weights


def build_between(tf, task: int, num_ps: int, batch_size: int, seed: int):
    """Between-graph: this worker's own graph, variables on the PS, its own updates."""
    tf.compat.v1.set_random_seed(seed)
    setter = tf.compat.v1.train.replica_device_setter(
        ps_tasks=num_ps, worker_device=f"/job:worker/task:{task}")
    with tf.compat.v1.device(setter):
        weights = make_weights(tf, seed)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        loss = tower_loss(tf, weights, batch_size, seed, task)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(
            loss, global_step=global_step)
    return train_op, loss, weights


class FinalValues:
    """A hook that reads tensors once, when the session ends (not every step)."""

    def __init__(self, tensors):
        self.tensors, self.values = tensors, None

    def begin(self):
        pass

    def after_create_session(self, session, coord):
        pass

    def before_run(self, run_context):
        return None

    def after_run(self, run_context, run_values):
        pass

    def end(self, session):
        self.values = session.run(self.tensors)


def train(tf, cluster_spec, task: int, is_chief: bool, log_dir: str, between: bool):
    """One client's MonitoredTrainingSession; returns (losses, final weights, hook)."""
    from tictac_hooks import TicTacHook
    if between:
        train_op, loss, weights = build_between(tf, task, FLAGS.ps, FLAGS.batch_size, FLAGS.seed)
    else:
        train_op, loss, weights = build(tf, FLAGS.workers, FLAGS.ps, FLAGS.batch_size, FLAGS.seed)
    final = FinalValues(weights)
    # Between-graph clients each run their own --steps (the global step counts all).
    hooks = [final] if between else [tf.compat.v1.train.StopAtStepHook(last_step=FLAGS.steps),
                                     final]
    tictac = TicTacHook(cluster_spec=cluster_spec, log_dir=log_dir, is_chief=is_chief)
    if FLAGS.tictac:
        hooks.append(tictac)
    losses = []
    with tf.compat.v1.train.MonitoredTrainingSession(
            master="grpc://" + cluster_spec["worker"][task], is_chief=is_chief, hooks=hooks,
            checkpoint_dir=None, save_summaries_steps=None,
            save_summaries_secs=None, log_step_count_steps=None) as sess:
        while not sess.should_stop() and not (between and len(losses) >= FLAGS.steps):
            _, value = sess.run([train_op, loss])
            losses.append(value)
    return losses, final.values, tictac


def report(tf_losses, final, tictac, log_dir: str) -> None:
    print(f"loss: first {tf_losses[0]:.4f}, last {tf_losses[-1]:.4f} ({len(tf_losses)} steps)")
    if FLAGS.save_weights:
        import numpy as np
        np.savez(FLAGS.save_weights, *final)
    if FLAGS.tictac:
        from summary import print_summary, write_summary
        print_summary(tictac, log_dir)
        write_summary(tictac, FLAGS.summary_json)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()

    from tictac_hooks.cluster.launcher import LocalCluster

    log_dir = FLAGS.log_dir or os.path.join("runs", "graph_mode_train")
    if FLAGS.cluster_spec:  # a client, started by the parent below
        spec = json.loads(FLAGS.cluster_spec)
        if FLAGS.replication == "in-graph":
            report(*train(tf, spec, 0, True, log_dir, between=False), log_dir)
            return
        task = FLAGS.task_index
        losses, final, tictac = train(tf, spec, task, task == 0,
                                      os.path.join(log_dir, f"client_{task}"), between=True)
        print(f"[worker {task}]", end=" ")
        report(losses, final, tictac, os.path.join(log_dir, f"client_{task}"))
        return
    # The clients run in child processes, so that a PS that dies cannot hang this one:
    # LocalCluster.run_clients stops them, naming the task, within a few seconds.
    from tictac_hooks.cluster.launcher import ClusterError
    with LocalCluster(num_ps=FLAGS.ps, num_workers=FLAGS.workers, rendezvous=True) as cluster:
        me = [sys.executable, os.path.abspath(__file__), *sys.argv[1:],
              f"--cluster_spec={json.dumps(cluster.spec)}"]
        if FLAGS.replication == "in-graph":
            argvs = [me]
        else:
            argvs = []
            for task in range(FLAGS.workers):
                extra = [f"--task_index={task}"]
                if task and FLAGS.summary_json:  # the chief's summary is the one asked for
                    extra.append(f"--summary_json={FLAGS.summary_json}.worker{task}")
                if task and FLAGS.save_weights:
                    extra.append("--save_weights=")
                argvs.append(me + extra)
        try:
            codes = cluster.run_clients(argvs, dead_task_grace_s=10.0, timeout_s=1800)
        except ClusterError as e:
            raise SystemExit(f"error: {e}") from None
        if any(codes):
            raise SystemExit(f"error: graph-mode clients exited with {codes}")


if __name__ == "__main__":
    app.run(main)
