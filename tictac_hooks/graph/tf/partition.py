"""Iteration DAGs from TF1 graph mode's partition graphs (docs/ALGORITHMS.md, "Model").

:func:`extract_partition_graphs` -- the worker's partition graphs from
``RunMetadata.partition_graphs`` (what the runtime really ran, after grappler) -> an
:class:`~tictac_hooks.graph.tf.extraction.Extraction`, whose ``graph`` is the
:class:`~tictac_hooks.graph.dag.Graph` a scheduler orders; :func:`with_recv_bytes`
fills the recvs' sizes from the step's transfer records.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Mapping, Sequence

from tictac_hooks.graph.dag import COMPUTE, RECV, Graph, GraphError, Op
from tictac_hooks.graph.tf.extraction import Extraction, _input_node
from tictac_hooks.graph.tf.naming import sending_node_name, task_of

_RECV_NODE_OPS = frozenset({"_Recv", "_HostRecv"})
_SEND_NODE_OPS = frozenset({"_Send", "_HostSend"})
# Ops that read only their input's shape: their edges from recvs are not scheduling uses.
SHAPE_ONLY_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


def extract_partition_graphs(partition_graphs: Sequence[Any], worker: str | None = None,
                             ps_job: str = "ps") -> Extraction:
    """The DAG of one worker task from graph-mode ``RunMetadata.partition_graphs``.

    Args:
      partition_graphs: ``GraphDef`` protos, one per device that took part in the step
        (``RunOptions(output_partition_graphs=True)``).
      worker: the task whose DAG to build, ``"worker:0"`` or a device string such as
        ``"/job:worker/task:0"``. Default: the only non-PS task, or the first in sorted
        order when there are several.
      ps_job: the job name of the parameter servers.

    Returns:
      An :class:`Extraction`. In the worker's partitions, each ``_Recv`` whose
      ``send_device`` is a ``ps_job`` task is a recv op, named after the sending node
      (the ``tensor_name`` attr without its ``edge_<n>_`` prefix, as in the rendezvous
      key), on channel ``"<ps_job>:<task>"``; ``name_map`` maps the partition node name
      to it. Recv nodes that have control inputs in the GraphDef lose them (recorded in
      ``dropped_inputs``). A recv whose sending node on the PS computes on data this
      worker sent (an embedding gather on the worker's ids, through data edges of the
      PS's partition) waits for the worker's ``_Send`` nodes of that data: a recv with
      inputs. When TensorFlow sends one
      tensor over two partition edges (a kernel read for the forward pass and again for
      its gradient), each reception is its own recv named by its full ``tensor_name``
      (``edge_<n>_<name>``, stable for a partitioned graph), so that a schedule orders
      the two copies separately; the rendezvous matches such names against the
      rendezvous key's full tensor name (see ``Gate.arrive``). A warning records it.
      Every other node is a compute op with its data and control inputs, except that
      shape-only ops (``SHAPE_ONLY_OPS``: ``Shape`` of a kernel for its gradient) do not
      depend on recvs, which would otherwise make a kernel look needed by a gradient's
      shape computation at the very start of the step; a ``_Recv``
      fed by a ``_Send`` on another device of the same task depends on that send
      (joined by ``tensor_name``); recvs from other non-PS tasks and client feeds are
      compute ops without inputs. ``bytes`` of a recv comes from its ``_output_shapes``
      and ``tensor_type`` attrs when both are present, else None -- which is what TF
      2.21 gives (partition graphs carry no shapes, even with
      ``GraphOptions.infer_shapes``); fill them from the step's transfer records with
      :func:`with_recv_bytes` and ``oracle.recv_bytes_from_transfers``.

    Raises:
      GraphError: no partition graphs, no such worker, or a malformed graph.
    """
    if not partition_graphs:
        raise GraphError("no partition graphs given: run the step with "
                         "RunOptions(output_partition_graphs=True)")
    by_task: dict[str, list[Any]] = {}
    for gd in partition_graphs:
        tasks = {task_of(n.device) for n in gd.node if n.device}
        tasks.discard(None)
        if not tasks:
            continue
        for t in tasks:
            by_task.setdefault(t, []).append(gd)
    non_ps = sorted(t for t in by_task if not t.startswith(ps_job + ":"))
    if worker is None:
        if not non_ps:
            raise GraphError(f"partition graphs hold no non-{ps_job!r} task: "
                             f"tasks found {sorted(by_task)}")
        worker = non_ps[0]
    wanted = task_of(worker) or worker
    if wanted not in by_task:
        raise GraphError(f"worker {worker!r} not among the partition graphs' tasks "
                         f"{sorted(by_task)}; pass e.g. worker={non_ps[0] if non_ps else 'worker:0'!r}")

    nodes = [n for gd in by_task[wanted] for n in gd.node
             if task_of(n.device) == wanted]
    sends = {n.attr["tensor_name"].s.decode(): n.name for n in nodes
             if n.op in _SEND_NODE_OPS and "tensor_name" in n.attr}
    name_map: dict[str, str] = {}
    op_types: dict[str, str] = {}
    dropped: dict[str, tuple[str, ...]] = {}
    warnings: list[str] = []
    recvs: dict[str, Op] = {}
    ps_recvs = [n for n in nodes if n.op in _RECV_NODE_OPS and "send_device" in n.attr
                and (task_of(n.attr["send_device"].s.decode()) or "").startswith(ps_job + ":")]
    copies = collections.Counter(sending_node_name(n.attr["tensor_name"].s.decode())
                                 for n in ps_recvs)
    fed_by = _worker_data_feeding_ps_nodes(by_task, wanted, ps_job)
    for n in ps_recvs:
        src = task_of(n.attr["send_device"].s.decode())
        tensor_name = n.attr["tensor_name"].s.decode()
        name = sending_node_name(tensor_name)
        if copies[name] > 1:
            warnings.append(f"{name} is received {copies[name]} times; its reception "
                            f"{n.name} is scheduled as {tensor_name}")
            name = tensor_name
        # A PS node that computes on data this worker sent (an embedding gather on
        # the ids): the recv waits for the worker's sends of that data.
        waits_for = tuple(sends[t] for t in sorted(fed_by.get(sending_node_name(tensor_name),
                                                                ()))
                          if t in sends)
        recvs[name] = Op(name=name, kind=RECV, inputs=waits_for, channel=src,
                         bytes=_node_bytes(n))
        if n.input:
            dropped[name] = tuple(_input_node(i)[0] for i in n.input)
        name_map[n.name] = name
        op_types[name] = n.op

    ops: list[Op] = []
    for n in nodes:
        if n.name in name_map:
            ops.append(recvs[name_map[n.name]])
            continue
        inputs = [name_map.get(src, src)
                  for src, _ in (_input_node(i) for i in n.input)]
        if n.op in SHAPE_ONLY_OPS:
            # Reads only the received tensor's shape (for a gradient): not a use that
            # makes the transfer urgent, and every consumer of its output also needs
            # the forward pass, which needs the tensor itself.
            inputs = [i for i in inputs if i not in recvs]
        if n.op in _RECV_NODE_OPS and "tensor_name" in n.attr:
            send = sends.get(n.attr["tensor_name"].s.decode())
            src = task_of(n.attr["send_device"].s.decode()) if "send_device" in n.attr else None
            if send is not None:
                inputs.append(send)
            elif src not in (None, wanted) and not (
                    "client_terminated" in n.attr and n.attr["client_terminated"].b):
                warnings.append(f"{n.name}: recv from task {src} (not a PS) taken as a "
                                "compute op without inputs")
        ops.append(Op(name=n.name, kind=COMPUTE, inputs=tuple(dict.fromkeys(inputs))))
        op_types[n.name] = n.op
    return Extraction(graph=Graph(ops), name_map=name_map, op_types=op_types,
                      dropped_inputs=dropped, warnings=tuple(warnings))


def _worker_data_feeding_ps_nodes(by_task: Mapping[str, list[Any]], worker: str,
                                  ps_job: str) -> dict[str, set[str]]:
    """PS node name -> the tensor names (``edge_<n>_<node>``) of data ``worker`` sent
    to the PS that the node computes on, through data edges of the PS's partition
    (an embedding gather on ids the worker computed: ``ResourceGather`` <- ``_Recv``
    from the worker). Control edges are not followed: a read ordered after an update
    that the worker's gradients feed is still a read of what is on the PS."""
    out: dict[str, set[str]] = {}
    for task, graph_defs in by_task.items():
        if not task.startswith(ps_job + ":"):
            continue
        nodes = {n.name: n for gd in graph_defs for n in gd.node if task_of(n.device) == task}
        memo: dict[str, frozenset[str]] = {}

        def fed(name: str, depth: int = 0) -> frozenset[str]:
            if name in memo:
                return memo[name]
            memo[name] = frozenset()  # cycles (loops) end here
            node = nodes.get(name)
            if node is None or depth > 200:
                return frozenset()
            if node.op in _RECV_NODE_OPS and "send_device" in node.attr:
                found = frozenset({node.attr["tensor_name"].s.decode()}) \
                    if task_of(node.attr["send_device"].s.decode()) == worker else frozenset()
            else:
                found = frozenset().union(*(fed(_input_node(i)[0], depth + 1)
                                            for i in node.input if not i.startswith("^")))
            memo[name] = found
            return found
        for name in nodes:
            if fed(name):
                out.setdefault(name, set()).update(fed(name))
    return out


def graph_from_partition_graphs(partition_graphs: Sequence[Any], worker: str | None = None,
                                ps_job: str = "ps") -> Graph:
    """The worker's iteration DAG; see :func:`extract_partition_graphs`."""
    return extract_partition_graphs(partition_graphs, worker, ps_job).graph


def with_recv_bytes(graph: Graph, recv_bytes: Mapping[str, int]) -> Graph:
    """A copy of ``graph`` whose recvs named in ``recv_bytes`` get those sizes."""
    return Graph([dataclasses.replace(op, bytes=int(recv_bytes[op.name]))
                  if op.is_recv and op.name in recv_bytes else op for op in graph.ops])


def _node_bytes(node: Any) -> int | None:
    """Bytes of a node's single output from ``_output_shapes`` and a dtype attr."""
    import tensorflow as tf

    dtype_attr = next((k for k in ("tensor_type", "dtype", "T") if k in node.attr), None)
    if dtype_attr is None or "_output_shapes" not in node.attr:
        return None
    shapes = node.attr["_output_shapes"].list.shape
    if len(shapes) != 1 or shapes[0].unknown_rank or any(d.size < 0 for d in shapes[0].dim):
        return None
    try:
        size = tf.dtypes.as_dtype(node.attr[dtype_attr].type).size
    except (TypeError, ValueError):
        return None
    count = 1
    for d in shapes[0].dim:
        count *= d.size
    return count * size
