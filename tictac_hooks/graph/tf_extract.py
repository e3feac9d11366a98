"""Iteration DAGs from real TensorFlow graphs (docs/ALGORITHMS.md, "Model").

Three sources, one result (:class:`Extraction`, whose ``graph`` is the
:class:`~tictac_hooks.graph.dag.Graph` a scheduler orders):

* :func:`extract_partition_graphs` -- TF1 graph mode: the worker's partition graphs
  from ``RunMetadata.partition_graphs`` (what the runtime really ran, after grappler).
* :func:`extract_concrete_function` -- a TF2 ``tf.function`` concrete graph: reads of
  variables that live on a PS are the recvs.
* :func:`graph_from_keras_model` -- traces a tf_keras or Keras 3 model's train (or
  predict) step and extracts it, returning the function so a profiler can run it.

TensorFlow is imported inside the functions only: the package stays importable, and the
rest of ``tictac_hooks.graph`` usable, without it.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

from tictac_hooks.graph.dag import COMPUTE, DEFAULT_CHANNEL, RECV, Graph, GraphError, Op

# Ops that read a variable's value out of its resource: colocated with the variable, so
# on a PS they run there and their output is the tensor sent to the worker.
READ_OPS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd"})
# Ops that only forward a resource handle.
HANDLE_FORWARDING_OPS = frozenset({"Identity"})
# Function-call ops whose bodies are inlined (TF inlines them before running too).
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
_RECV_NODE_OPS = frozenset({"_Recv", "_HostRecv"})
_SEND_NODE_OPS = frozenset({"_Send", "_HostSend"})
_EDGE_PREFIX = re.compile(r"^edge_\d+_")
# Ops that read only their input's shape: their edges from recvs are not scheduling uses.
SHAPE_ONLY_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
_TASK = re.compile(r"/job:([^/]+)(?:/replica:\d+)?/task:(\d+)")


@dataclasses.dataclass(frozen=True)
class Extraction:
    """A DAG extracted from TensorFlow, with what is needed to match it to traces.

    Attributes:
      graph: the iteration DAG (recvs are roots, times unset).
      name_map: TensorFlow node name -> DAG op name, for every node that became an op
        whose name differs from the node's (e.g. the partition node
        ``MatMul/ReadVariableOp_S1`` -> recv ``MatMul/ReadVariableOp``). Pass it to
        :func:`tictac_hooks.graph.oracle.times_from_step_stats`.
      op_types: DAG op name -> TensorFlow op type.
      ps_side: compute ops that in a PS deployment run on the PS, not on the worker
        (writes to remote variables, e.g. ``AssignSubVariableOp``, ``ResourceApply*``).
        They stay in the DAG, so that dependencies are faithful, and should get time 0
        on the worker's compute resource.
      dropped_inputs: recv op name -> the inputs it had in TensorFlow, dropped because
        a recv must be a root (e.g. a read ordered after a write to the same variable:
        in the real partition graph that ordering lives on the PS side too).
      warnings: things the extraction could not model exactly, in words.
      recv_variables: recv op name -> name of the variable it reads (concrete
        functions only; partition graphs do not say).
    """

    graph: Graph
    name_map: Mapping[str, str]
    op_types: Mapping[str, str]
    ps_side: frozenset[str] = frozenset()
    dropped_inputs: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    recv_variables: Mapping[str, str] = dataclasses.field(default_factory=dict)


def task_of(device: str) -> str | None:
    """``"/job:ps/replica:0/task:1/device:CPU:0"`` -> ``"ps:1"``; None if no job/task."""
    m = _TASK.search(device or "")
    return f"{m.group(1)}:{m.group(2)}" if m else None


def sending_node_name(tensor_name: str) -> str:
    """``"edge_74_sequential/d1/MatMul/ReadVariableOp"`` -> the sending node's name."""
    return _EDGE_PREFIX.sub("", tensor_name, count=1)


def _input_node(name: str) -> tuple[str, bool]:
    """A GraphDef input (``"x"``, ``"x:1"``, ``"^x"``) -> (node name, is_control)."""
    if name.startswith("^"):
        return name[1:], True
    return name.split(":", 1)[0], False


# --- (a) graph mode: partition graphs ---------------------------------------------

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
      to it. Recv nodes that have control inputs in the GraphDef lose them (a recv is a
      root of the DAG), recorded in ``dropped_inputs``. When TensorFlow sends one
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
    for n in ps_recvs:
        src = task_of(n.attr["send_device"].s.decode())
        tensor_name = n.attr["tensor_name"].s.decode()
        name = sending_node_name(tensor_name)
        if copies[name] > 1:
            warnings.append(f"{name} is received {copies[name]} times; its reception "
                            f"{n.name} is scheduled as {tensor_name}")
            name = tensor_name
        recvs[name] = Op(name=name, kind=RECV, channel=src, bytes=_node_bytes(n))
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


# --- (b) TF2: concrete functions ----------------------------------------------------

def extract_concrete_function(concrete_fn: Any, remote_variables: Any = None) -> Extraction:
    """The iteration DAG of a traced ``tf.function`` (a ``ConcreteFunction``).

    Args:
      concrete_fn: ``f.get_concrete_function(...)`` of a ``tf.function``.
      remote_variables: which captured variables live on a PS. None: all of them (for
        offline analysis of a model as it would run under ParameterServerStrategy,
        where every variable is on a PS). Otherwise a predicate ``variable -> bool``, or
        an iterable of variables, variable handles, or device substrings (e.g.
        ``"/job:ps"``).

    Returns:
      An :class:`Extraction`. Modelling choices:

      * Each read of a remote variable (``ReadVariableOp``, ``ResourceGather``...) is a
        recv named after the read node (as the rendezvous key names it), ``bytes`` the
        variable's size (None for gathers), channel ``"<job>:<task>"`` from the
        variable's device, ``"ps:0"`` for a local variable (``/job:localhost``). A variable read twice is two transfers.
        Inputs of a read other than the handle (control edges from automatic control
        dependencies, gather indices) are dropped and listed in ``dropped_inputs``.
      * Ops that consume a remote handle otherwise (``AssignVariableOp``,
        ``AssignSubVariableOp``, ``ResourceApply*``...) run on the PS: they are KEPT as
        compute ops (their inputs are what the worker pushes, their consumers wait on
        them) and listed in ``ps_side``, to be given time 0.
      * The resource-handle placeholders of remote variables (and ``Identity`` ops
        forwarding them) are not worker work and are left out, with their edges.
      * ``PartitionedCall``/``StatefulPartitionedCall`` bodies are inlined, their nodes
        named ``<call node>/<body node>`` (remote handles passed as arguments are
        followed inside). ``While``/``If``/``Case`` and other function-valued ops stay
        single compute ops; a remote variable they take is read inside them, which is
        not modelled as a recv (listed in ``warnings``).
      * Constants, placeholders and NoOps are kept as compute ops (profiling gives them
        ~0); data and control edges are both dependencies.

    Raises:
      GraphError: the argument is not a concrete function, or a malformed graph.
    """
    graph = getattr(concrete_fn, "graph", None)
    if graph is None or not hasattr(graph, "as_graph_def"):
        raise GraphError(f"expected a ConcreteFunction (tf.function(...).get_concrete_"
                         f"function(...)), got {type(concrete_fn).__name__}")
    is_remote = _remote_predicate(remote_variables)
    variables = {id(v.handle): v for v in getattr(concrete_fn, "variables", ())}
    remote_handles: dict[str, Any] = {}
    for external, internal in graph.captures:
        var = variables.get(id(external))
        if var is not None and is_remote(var, external):
            remote_handles[internal.op.name] = var
    graph_def = graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}
    builder = _Builder(library)
    builder.add_nodes(
        [_Node(n.name, n.op, list(n.input), n.attr) for n in graph_def.node],
        prefix="", arg_map={}, remote={k: v for k, v in remote_handles.items()})
    return builder.finish()


def graph_from_concrete_function(concrete_fn: Any, remote_variables: Any = None) -> Graph:
    """The iteration DAG of a ``ConcreteFunction``; see :func:`extract_concrete_function`."""
    return extract_concrete_function(concrete_fn, remote_variables).graph


def _remote_predicate(remote_variables: Any) -> Callable[[Any, Any], bool]:
    if remote_variables is None:
        return lambda var, handle: True
    if callable(remote_variables):
        return lambda var, handle: bool(remote_variables(var))
    if isinstance(remote_variables, (str, bytes)) or not isinstance(remote_variables, Iterable):
        raise GraphError("remote_variables must be None, a predicate, or an iterable of "
                         f"variables, handles or device strings; got {remote_variables!r}")
    items = list(remote_variables)
    devices = [x for x in items if isinstance(x, str)]
    objects = [x for x in items if not isinstance(x, str)]

    def check(var: Any, handle: Any) -> bool:
        if any(d in (var.device or "") for d in devices):
            return True
        return any(o is var or o is handle or o is getattr(var, "handle", None)
                   for o in objects)
    return check


@dataclasses.dataclass
class _Node:
    name: str
    op: str
    inputs: list[str]
    attr: Any


class _Builder:
    """Walks a GraphDef (and inlined function bodies) into DAG ops."""

    def __init__(self, library: Mapping[str, Any]):
        self.library = library
        self.ops: list[Op] = []
        self.names: set[str] = set()
        self.op_types: dict[str, str] = {}
        self.ps_side: set[str] = set()
        self.dropped: dict[str, tuple[str, ...]] = {}
        self.warnings: list[str] = []
        self.recv_variables: dict[str, str] = {}
        # Per inlined call: how a consumer of "<call>:<k>" / "^<call>" resolves.
        self.outputs: dict[str, list[list[str]]] = {}
        self.control_outputs: dict[str, list[str]] = {}

    def add_nodes(self, nodes: list[_Node], prefix: str,
                  arg_map: Mapping[str, list[str]], remote: dict[str, Any]) -> None:
        """``arg_map``: function argument name -> the op names it stands for.
        ``remote``: node or argument name (unprefixed) -> remote variable."""
        for node in nodes:
            full = prefix + node.name
            deps: list[str] = []
            remote_inputs = []
            for raw in node.inputs:
                src, control = _input_node(raw)
                if src in remote:
                    remote_inputs.append(remote[src])
                    continue
                deps.extend(self._resolve(src, raw, prefix, arg_map, control))
            deps = list(dict.fromkeys(deps))
            if node.name in remote:                        # a remote handle placeholder
                continue
            if remote_inputs and node.op in HANDLE_FORWARDING_OPS:
                remote[node.name] = remote_inputs[0]
                continue
            if remote_inputs and node.op in READ_OPS:
                var = remote_inputs[0]
                nbytes = (_variable_bytes(var) if node.op == "ReadVariableOp" else None)
                self._add(Op(name=full, kind=RECV, channel=_channel(var),
                             bytes=nbytes), node.op)
                self.recv_variables[full] = var.name
                if deps:
                    self.dropped[full] = tuple(deps)
                continue
            if node.op in CALL_OPS and node.attr["f"].func.name in self.library:
                self._inline(node, full, remote, prefix, arg_map)
                continue
            if remote_inputs:
                if _has_function_attr(node):
                    self.warnings.append(
                        f"{full} ({node.op}) takes remote variable(s) "
                        f"{[v.name for v in remote_inputs][:3]}; their reads inside it "
                        "are not modelled as recvs")
                else:
                    self.ps_side.add(full)
            self._add(Op(name=full, kind=COMPUTE, inputs=tuple(deps)), node.op)

    def _resolve(self, src: str, raw: str, prefix: str, arg_map: Mapping[str, list[str]],
                 control: bool) -> list[str]:
        if src in arg_map and not prefix + src in self.names:
            return list(arg_map[src])
        full = prefix + src
        if full in self.outputs:                           # an inlined call
            if control:
                return list(self.control_outputs[full])
            outs = self.outputs[full]
            index = _output_index(raw)
            if index is not None and index < len(outs):
                return list(outs[index])
            return [d for out in outs for d in out] or list(self.control_outputs[full])
        return [full]

    def _inline(self, node: _Node, full: str, remote: dict[str, Any], prefix: str,
                arg_map: Mapping[str, list[str]]) -> None:
        fdef = self.library[node.attr["f"].func.name]
        sig = fdef.signature
        data_inputs = [i for i in node.inputs if not i.startswith("^")]
        control_deps = [d for i in node.inputs if i.startswith("^")
                        for d in self._resolve(i[1:], i, prefix, arg_map, True)]
        body_args: dict[str, list[str]] = {}
        body_remote: dict[str, Any] = {}
        simple = len(data_inputs) == len(sig.input_arg)
        for k, arg in enumerate(sig.input_arg):
            if simple:
                raw = data_inputs[k]
                src, _ = _input_node(raw)
                if src in remote:
                    body_remote[arg.name] = remote[src]
                    deps = []
                else:
                    deps = self._resolve(src, raw, prefix, arg_map, False)
            else:
                deps = [d for raw in data_inputs if _input_node(raw)[0] not in remote
                        for d in self._resolve(_input_node(raw)[0], raw, prefix, arg_map, False)]
            body_args[arg.name] = list(dict.fromkeys(deps + control_deps))
        body_prefix = full + "/"
        before = len(self.ops)
        body = [_Node(n.name, n.op, [_body_input(i) for i in n.input], n.attr)
                for n in fdef.node_def]
        self.add_nodes(body, body_prefix, body_args, body_remote)
        added = [op.name for op in self.ops[before:]]
        outs = []
        for arg in sig.output_arg:
            ret = fdef.ret.get(arg.name, "")
            src = ret.split(":", 1)[0]
            outs.append(self._resolve(src, ret, body_prefix, body_args, False) if src else [])
        self.outputs[full] = outs
        # A control edge on the call waits for the whole body.
        self.control_outputs[full] = added or [d for a in body_args.values() for d in a]

    def _add(self, op: Op, op_type: str) -> None:
        if op.name in self.names:
            raise GraphError(f"duplicate node name {op.name!r} after inlining")
        self.names.add(op.name)
        self.ops.append(op)
        self.op_types[op.name] = op_type

    def finish(self) -> Extraction:
        return Extraction(graph=Graph(self.ops), name_map={}, op_types=self.op_types,
                          ps_side=frozenset(self.ps_side), dropped_inputs=self.dropped,
                          warnings=tuple(self.warnings),
                          recv_variables=self.recv_variables)


def _body_input(raw: str) -> str:
    """A FunctionDef input ``node:out_arg:idx`` -> ``node:idx`` (arguments unchanged)."""
    control = raw.startswith("^")
    parts = raw.lstrip("^").split(":")
    name = parts[0] if len(parts) < 3 else f"{parts[0]}:{parts[2]}"
    return ("^" if control else "") + name


def _output_index(raw: str) -> int | None:
    if raw.startswith("^"):
        return None
    parts = raw.split(":")
    return int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 0


def _has_function_attr(node: _Node) -> bool:
    return any(v.HasField("func") for v in node.attr.values())


def _channel(var: Any) -> str:
    """The PS task of a variable; ``"ps:0"`` for a local one (offline analysis)."""
    task = task_of(getattr(var, "device", "") or "")
    return DEFAULT_CHANNEL if task is None or task.startswith("localhost:") else task


def _variable_bytes(var: Any) -> int | None:
    n = var.shape.num_elements()
    return None if n is None else int(n) * var.dtype.size


# --- (c) Keras models --------------------------------------------------------------

def keras_step_function(model: Any, batch_size: int, training: bool = True,
                        input_shape: Sequence[int] | None = None,
                        num_classes: int | None = None) -> tuple[Any, tuple[Any, ...]]:
    """A concrete function of one train (or predict) step of a Keras model, and its args.

    Training traces ``model.train_step((x, y))`` inside a ``tf.function``: forward,
    loss, gradients and the optimizer update, the same call that ``fit``'s per-step
    function makes (fit adds only the iterator's ``get_next`` and, in tf_keras, a step
    counter). Inference traces ``model.predict_step(x)``. Inputs are random tensors of
    the model's input shape (``input_shape`` overrides it, batch dimension excluded);
    labels are integer classes when the loss is sparse, else tensors shaped like the
    output. The model must be compiled for training.

    Works for tf_keras (``TF_USE_LEGACY_KERAS=1``) and Keras 3 with the TensorFlow
    backend.
    """
    import numpy as np
    import tensorflow as tf

    if batch_size < 1:
        raise GraphError(f"batch_size must be >= 1, got {batch_size}")
    if training and getattr(model, "optimizer", None) is None:
        raise GraphError("the model is not compiled: call model.compile(optimizer=..., "
                         "loss=...) before extracting its training step")
    shape = tuple(input_shape) if input_shape is not None else tuple(model.inputs[0].shape[1:])
    if any(d is None for d in shape):
        raise GraphError(f"model input shape {shape} has unknown dimensions: pass "
                         "input_shape=(...) without the batch dimension")
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch_size,) + shape).astype("float32"))
    if not training:
        fn = tf.function(lambda x: model.predict_step(x))
        return fn.get_concrete_function(x), (x,)
    out_shape = tuple(model.outputs[0].shape[1:])
    classes = num_classes or (out_shape[-1] if out_shape else 1)
    if _sparse_loss(model):
        y = tf.constant(rng.integers(0, classes, size=(batch_size,)).astype("int64"))
    else:
        y = tf.constant(rng.random((batch_size,) + out_shape).astype("float32"))
    fn = tf.function(lambda x, y: model.train_step((x, y)))
    return fn.get_concrete_function(x, y), (x, y)


def _sparse_loss(model: Any) -> bool:
    loss = getattr(model, "loss", None)
    name = loss if isinstance(loss, str) else type(loss).__name__ + getattr(loss, "__name__", "")
    return "sparse" in str(name).lower()


def graph_from_keras_model(model: Any, batch_size: int, training: bool = True,
                           input_shape: Sequence[int] | None = None,
                           remote_variables: Any = None
                           ) -> tuple[Graph, Any, tuple[Any, ...]]:
    """(DAG, concrete function, example args) of one step of a Keras model.

    The function and args can be handed to
    :func:`tictac_hooks.graph.oracle.measure_compute_times`. See
    :func:`keras_step_function` for what is traced and
    :func:`extract_concrete_function` for how it becomes a DAG (by default every
    variable, optimizer and metric variables included, counts as living on a PS).
    """
    ext, fn, args = extract_keras_model(model, batch_size, training, input_shape,
                                        remote_variables)
    return ext.graph, fn, args


def extract_keras_model(model: Any, batch_size: int, training: bool = True,
                        input_shape: Sequence[int] | None = None,
                        remote_variables: Any = None
                        ) -> tuple[Extraction, Any, tuple[Any, ...]]:
    """Like :func:`graph_from_keras_model`, with the full :class:`Extraction`."""
    fn, args = keras_step_function(model, batch_size, training, input_shape)
    return extract_concrete_function(fn, remote_variables), fn, args
