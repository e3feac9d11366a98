"""Where the PSS examples' cluster runs (their printed summary: examples/summary.py).

Each example is one coordinator program (``train(spec)``). :func:`run_on_cluster` starts
the cluster (1 PS with TicTac's gate, the workers) and runs that coordinator in a child
process, so that the coordinator has exited, cleanly, before the cluster is stopped
(stopping the cluster first makes TensorFlow print ``Failed to remove function
remotely`` errors at exit). With ``--network=shaped`` (the default where root and tc
are available) every task runs in its own network namespace behind a link shaped to
``--rate``: communication then costs what it costs on a real cluster, and the order
matters. Elsewhere the cluster runs on loopback, where it barely does.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

from absl import flags


flags.DEFINE_enum("network", "auto", ["auto", "shaped", "loopback"],
                  "Where the cluster runs: shaped (network namespaces and tc; needs root), "
                  "loopback, or auto (shaped where possible).")
flags.DEFINE_string("rate", "2gbit", "Link rate of every task with --network=shaped (tc "
                    "syntax, e.g. 300mbit, 1gbit).")
flags.DEFINE_string("cluster_spec", None, "Internal: run only the coordinator, against "
                    "this cluster (JSON {job: [addresses]}).")
flags.DEFINE_integer("link_bytes_per_s", None, "Internal: the shaped link's rate, which "
                     "the parent passes to the coordinator it runs there.")
flags.DEFINE_integer("gate_workers", None, "Size each PS's gate for this many workers "
                     "(its record history: 64 records per worker); default: the "
                     "cluster's, at least 64. A small value makes the history short, as "
                     "a test of the reading under it does.", lower_bound=1)
FLAGS = flags.FLAGS

DEAD_TASK_GRACE_S = 10.0  # a coordinator whose cluster task died gets this long to fail

LOOPBACK_NOTE = ("loopback: transfers cost almost nothing here, so TicTac's order cannot "
                 "gain much and the figures below are mostly noise ({why})")


def run_on_cluster(train: Callable[[dict], None], num_ps: int, num_workers: int) -> None:
    """Runs ``train(cluster_spec)`` as a PSS coordinator on a local cluster (see the
    module docstring). Exits non-zero when the coordinator fails or a PS dies."""
    if FLAGS.cluster_spec:  # the child: the coordinator itself
        train(json.loads(FLAGS.cluster_spec))
        return
    from tictac_hooks.cluster import netns
    from tictac_hooks.cluster.launcher import LocalCluster
    shaped, why = (False, "--network=loopback") if FLAGS.network == "loopback" \
        else netns.available()
    if FLAGS.network == "shaped" and not shaped:
        raise SystemExit(f"--network=shaped: {why}")
    kwargs = dict(num_ps=num_ps, num_workers=num_workers, rendezvous=True, chief=True,
                  gate_workers=FLAGS.gate_workers)
    if shaped:
        hosts = netns.cluster_hosts(num_ps, num_workers, chief=True, clients=())
        print(f"[cluster] shaped network: {num_ps} PS and {num_workers} workers, each in its "
              f"own network namespace, links at {FLAGS.rate}", flush=True)
        with netns.ShapedNetwork(hosts, rate=FLAGS.rate) as net, \
                LocalCluster(network=net, **kwargs) as cluster:
            code = _coordinate(cluster, "chief", netns.rate_bits(FLAGS.rate) // 8)
    else:
        print(f"[cluster] {LOOPBACK_NOTE.format(why=why)}", flush=True)
        with LocalCluster(**kwargs) as cluster:
            code = _coordinate(cluster, None)
    if code:
        raise SystemExit(code)


def quiet_fit_coordinator() -> None:
    """What a tf_keras ``fit`` coordinator prints: no TensorFlow cluster set-up chatter
    unless ``--verbosity`` is given (then TicTac's details too), and not tf_keras's
    warning about tf.data options on its ParameterServerStrategy path (harmless; it
    comes on every run)."""
    import warnings

    from absl import logging
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def link_bandwidth() -> float | None:
    """Bytes/s of every link of the shaped network the coordinator runs in (None on
    loopback): TicTac's ``bandwidth``, for TAC's transfer times and the gate's pacing."""
    return float(FLAGS.link_bytes_per_s) if FLAGS.link_bytes_per_s else None


def _coordinate(cluster: Any, host: str | None, link_bytes_per_s: int | None = None) -> int:
    """Runs this program again as the coordinator against ``cluster``; returns its exit
    code. If a PS dies, or every worker, the coordinator is stopped within
    DEAD_TASK_GRACE_S, with one line naming the task (LocalCluster.run_clients); a
    worker's death alone it survives, as ParameterServerStrategy does."""
    from tictac_hooks.cluster.launcher import ClusterError
    argv = [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:],
            f"--cluster_spec={json.dumps(cluster.spec)}"]
    if link_bytes_per_s:
        argv.append(f"--link_bytes_per_s={link_bytes_per_s}")
    try:
        # ParameterServerStrategy trains on without a dead worker (not without a PS).
        (code,) = cluster.run_clients([argv], host=host, dead_task_grace_s=DEAD_TASK_GRACE_S,
                                      workers_may_die=True)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    return code
