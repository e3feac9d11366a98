"""Iteration DAGs and times of the workers of a traced graph-mode step.

:func:`traced_worker_graphs` turns the ``RunMetadata`` of ``FULL_TRACE`` steps (with
partition graphs) into what :meth:`tictac_hooks.run.controller.Controller.switch`
takes: a DAG per worker task (:mod:`tictac_hooks.graph.tf.partition`), compute times
and transfer sizes (:mod:`tictac_hooks.graph.tf.profiler`), and the recvs that are no
parameter reads. Used by ``TicTacHook`` and the benchmark client.
"""

from __future__ import annotations

from typing import Any, Sequence

from tictac_hooks.graph import oracle
from tictac_hooks.graph.dag import GraphError
from tictac_hooks.graph.tf import partition, profiler
from tictac_hooks.graph.tf.declared import graph_mode_positions, with_declared
from tictac_hooks.graph.tf.naming import PARAMETER_READ_OPS, sending_node_name, task_of


class NoWorkerTaskError(GraphError):
    """The traced step ran on no ``worker`` task (no PS cluster); ``TicTacHook`` raises
    it as a ``TicTacSetupError``."""


def gradient_pushes(traced: Sequence[Any], worker: str) -> dict[str, tuple[str, int | None]]:
    """What each PS pulled from ``worker`` in the traced steps (in training, the
    gradients: the PS's RecvTensor calls to the worker): name of the sending node on the
    worker -> (PS task, bytes; None where no record of it carried a size, as the large
    ones often do not)."""
    out: dict[str, tuple[str, int | None]] = {}
    for t in profiler.transfers_from_step_stats([m.step_stats for m in traced], source=worker):
        if (t.destination or "").startswith("ps:"):
            known = out.get(t.name, (t.destination, None))[1]
            out[t.name] = (t.destination, t.bytes if t.bytes is not None else known)
    return out


def traced_worker_graphs(traced: Sequence[Any], workers: Sequence[str] | None = None,
                         declared: tuple[Any, Sequence[Any]] | None = None
                         ) -> tuple[dict[str, Any], dict[str, float], set[str]]:
    """DAG per worker task, compute times and late recvs from traced steps' RunMetadata
    (``FULL_TRACE``, partition graphs): what :meth:`Controller.switch` takes.

    The last traced step's partition graphs give each worker's DAG (with transfer sizes
    from the traced RecvTensor records); ``step_stats`` of every traced step the compute
    times. Only parameter reads are scheduled; other PS-to-worker tensors (control-flow
    values, e.g. of a global-step update) depend on the step's own progress: ``late``.
    ``declared``: (the client's ``tf.Graph``, its variables in declaration order, e.g.
    ``tf.compat.v1.trainable_variables()`` then the other global variables): each
    recv then carries its variable's position (``Op.declared``; declared.py).

    Raises:
      NoWorkerTaskError: no ``workers`` given and the traced step ran on no ``worker``
        task.
      GraphError: a worker not among the partition graphs' tasks, a malformed graph.
    """
    partition_graphs = traced[-1].partition_graphs
    workers = list(workers) if workers else _worker_tasks(partition_graphs)
    step_stats = [m.step_stats for m in traced]
    graphs, late = {}, set()
    compute: dict[str, float] = {}
    for worker in workers:
        ext = partition.extract_partition_graphs(partition_graphs, worker=worker)
        device = "/job:{}/replica:0/task:{}".format(*worker.split(":"))
        transfers = profiler.transfers_from_step_stats(step_stats, destination=device)
        graphs[worker] = partition.with_recv_bytes(
            ext.graph, oracle.recv_bytes_from_transfers(transfers))
        late |= set(ext.dropped_inputs)
        compute.update(profiler.times_from_step_stats(step_stats, name_map=ext.name_map,
                                                      device=device))
    if declared is not None:
        position = graph_mode_positions(*declared)
        graphs = {w: with_declared(g, position) for w, g in graphs.items()}
    reads = _parameter_reads(partition_graphs)
    for graph in graphs.values():
        # A tensor sent over two edges is named by its edge (edge_<n>_<node>): the read
        # is its sending node.
        late |= {op.name for op in graph.recvs if sending_node_name(op.name) not in reads}
    return graphs, compute, late


def _parameter_reads(partition_graphs: Sequence[Any], ps_job: str = "ps") -> set[str]:
    """Names of the PS nodes that read a parameter (what TicTac orders): variable
    reads, and ``Identity`` reads (``<var>/read``) of reference variables."""
    reads = set()
    for graph_def in partition_graphs:
        nodes = {n.name: n for n in graph_def.node}
        for node in graph_def.node:
            if f"/job:{ps_job}/" not in node.device:
                continue
            if node.op in PARAMETER_READ_OPS:
                reads.add(node.name)
            elif node.op == "Identity" and node.input:
                src = nodes.get(node.input[0].split(":")[0].lstrip("^"))
                if src is not None and src.op in ("VariableV2", "Variable"):
                    reads.add(node.name)
    return reads


def _worker_tasks(partition_graphs: Sequence[Any]) -> list[str]:
    """Every ``worker:<i>`` task that ran a partition of the traced step."""
    tasks = set()
    for graph_def in partition_graphs:
        for node in graph_def.node:
            task = task_of(node.device)
            if task and task.startswith("worker:"):
                tasks.add(task)
            break
    if not tasks:
        raise NoWorkerTaskError("the traced step ran on no 'worker' task: TicTacHook needs "
                                "a PS cluster (replica_device_setter, worker and ps jobs)")
    return sorted(tasks, key=lambda t: int(t.split(":")[1]))
