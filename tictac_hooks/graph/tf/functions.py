"""Iteration DAGs of TF2 ``tf.function`` graphs (docs/ALGORITHMS.md, "Model").

:func:`extract_concrete_function` -- a traced ``tf.function`` (a ``ConcreteFunction``):
reads of variables that live on a PS are the recvs. Returns an
:class:`~tictac_hooks.graph.tf.extraction.Extraction`, whose ``graph`` is the
:class:`~tictac_hooks.graph.dag.Graph` a scheduler orders.

No TensorFlow is imported here: the functions work on the objects TensorFlow handed in.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping

from tictac_hooks.graph.dag import COMPUTE, DEFAULT_CHANNEL, RECV, Graph, GraphError, Op
from tictac_hooks.graph.tf.declared import (creation_order, declaration_positions,
                                            declared_variables, parameter_name, with_declared)
from tictac_hooks.graph.tf.extraction import Extraction, _input_node
from tictac_hooks.graph.tf.naming import PARAMETER_READ_OPS, task_of

# Ops that only forward a resource handle.
HANDLE_FORWARDING_OPS = frozenset({"Identity"})
# Function-call ops whose bodies are inlined (TF inlines them before running too).
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
WHILE_OPS = frozenset({"While", "StatelessWhile"})
# Ops that take the next batch: a loop whose body takes one runs a training step per
# iteration (Keras's steps_per_execution > 1).
NEXT_BATCH_OPS = frozenset({"IteratorGetNext", "IteratorGetNextAsOptional",
                            "IteratorGetNextSync"})


def extract_concrete_function(concrete_fn: Any, remote_variables: Any = None,
                              declared: Any = None) -> Extraction:
    """The iteration DAG of a traced ``tf.function`` (a ``ConcreteFunction``).

    Args:
      concrete_fn: ``f.get_concrete_function(...)`` of a ``tf.function``.
      remote_variables: which captured variables live on a PS. None: all of them (for
        offline analysis of a model as it would run under ParameterServerStrategy,
        where every variable is on a PS). Otherwise a predicate ``variable -> bool``, or
        an iterable of variables, variable handles, or device substrings (e.g.
        ``"/job:ps"``).
      declared: the model (its ``trainable_variables``, then its other variables), or
        the variables in declaration order. Given, every recv carries the position of
        the variable it reads (``Op.declared``, for the ``declared`` order): the shards
        of one ShardedVariable share one; variables the model does not list (optimizer
        slots, counters) follow, in creation order (declared.py).

    Returns:
      An :class:`Extraction`. Modelling choices:

      * Each read of a remote variable (``ReadVariableOp``, ``ResourceGather``...) is a
        recv named after the read node (as the rendezvous key names it), ``bytes`` the
        variable's size; for a gather (whose size follows the ids, not the variable),
        its output's size in the traced function (shape x dtype size, e.g. an
        embedding lookup's [batch, ..., dim] rows), None where the trace left a
        dimension unknown (a batch of unknown size). Channel ``"<job>:<task>"`` from
        the variable's device, ``"ps:0"`` for a local variable (``/job:localhost``). A
        variable read twice is two transfers.
        Inputs of a read other than the handle (control edges from automatic control
        dependencies, gather indices) are dropped and listed in ``dropped_inputs``.
      * Ops that consume a remote handle otherwise (``AssignVariableOp``,
        ``AssignSubVariableOp``, ``ResourceApply*``...) run on the PS: they are KEPT as
        compute ops (their inputs are what the worker pushes, their consumers wait on
        them) and listed in ``ps_side``, to be given time 0. They wait on no recv (a
        read they take, as data or by a control edge, runs on the PS: dropped, listed
        in ``dropped_inputs``), and a read whose value only they take is one of them,
        not a recv.
      * The resource-handle placeholders of remote variables (and ``Identity`` ops
        forwarding them) are not worker work and are left out, with their edges.
      * ``PartitionedCall``/``StatefulPartitionedCall`` bodies are inlined, their nodes
        named ``<call node>/<body node>`` (remote handles passed as arguments are
        followed inside). ``While``/``If``/``Case`` and other function-valued ops stay
        single compute ops; a remote variable they take is read inside them, which is
        not modelled as a recv (listed in ``warnings``).
      * Constants, placeholders and NoOps are kept as compute ops (profiling gives them
        ~0); data and control edges are both dependencies.
      * A step loop: when the function runs its training steps in a top-level
        ``While`` whose body takes the next batch and reads remote variables (tf_keras's
        ``steps_per_execution > 1``), the DAG is ONE iteration of the loop body, its
        nodes named ``<while node>/body/<body node>`` (TensorFlow names the lowered
        body ``<while node>/body/_<n>/...``; ``naming.canonical_transfer_name`` maps
        both to one name). Every iteration is a training step that follows one order;
        what the function does once per call outside the loop is left out (its
        transfers pass the gate unlisted). Loop-carried and loop-invariant inputs of
        the body are available when its iteration starts.

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
    builder = _Builder(library, function_graphs(graph))
    nodes = [_Node(n.name, n.op, list(n.input), n.attr) for n in graph_def.node]
    loop = _step_loop(nodes, library, remote_handles)
    if loop is not None:
        builder.add_loop_body(loop, dict(remote_handles))
    else:
        builder.add_nodes(nodes, prefix="", arg_map={},
                          remote={k: v for k, v in remote_handles.items()}, traced=graph)
    extraction = builder.finish()
    if declared is None:
        return extraction
    return dataclasses.replace(extraction, graph=_with_declared(
        extraction.graph, builder.recv_objects, declared))


def _with_declared(graph: Graph, recv_objects: Mapping[str, Any], declared: Any) -> Graph:
    """``graph`` with each recv's declaration position: the model's variables first,
    then the other variables the recvs read, in creation order."""
    positions = declaration_positions(declared)
    read = {id(v): v for v in recv_objects.values()}
    others = [v for v in read.values() if positions.of(v) is None]
    if others:
        positions = declaration_positions(declared_variables(declared) + creation_order(others))
    return with_declared(graph, lambda name: (positions.of(recv_objects[name])
                                              if name in recv_objects else None))


def _step_loop(nodes: list["_Node"], library: Mapping[str, Any],
               remote: Mapping[str, Any]) -> "_Node | None":
    """The top-level ``While`` that runs the training steps, if the function has one:
    its body takes the next batch and reads a remote variable. None otherwise."""
    for node in nodes:
        if node.op not in WHILE_OPS or "body" not in node.attr:
            continue
        body = library.get(node.attr["body"].func.name)
        if body is None:
            continue
        takes_remote = any(_input_node(i)[0] in remote
                           for i in node.inputs if not i.startswith("^"))
        if takes_remote and _calls(body, library, NEXT_BATCH_OPS):
            return node
    return None


def _calls(fdef: Any, library: Mapping[str, Any], ops: frozenset[str], depth: int = 0) -> bool:
    """Whether a function (or one it calls) has a node of one of ``ops``."""
    for n in fdef.node_def:
        if n.op in ops:
            return True
        if depth < 8 and n.op in CALL_OPS and n.attr["f"].func.name in library:
            if _calls(library[n.attr["f"].func.name], library, ops, depth + 1):
                return True
    return False


def function_graphs(graph: Any) -> dict[str, Any]:
    """The traced graphs (``FuncGraph``) of the functions ``graph`` calls, directly or
    not, by their library name (``graph._functions``: TensorFlow's registry of the
    functions a graph calls; the GraphDef's FunctionDefs carry no output shapes)."""
    out: dict[str, Any] = {}
    todo = [graph]
    while todo:
        for name, fn in dict(getattr(todo.pop(), "_functions", None) or {}).items():
            inner = getattr(fn, "graph", None)
            if inner is not None and name not in out:
                out[name] = inner
                todo.append(inner)
    return out


def traced_output_bytes(traced: Any, node_name: str) -> int | None:
    """Bytes of ``node_name``'s first output in the traced graph ``traced`` (its static
    shape x its dtype's size), or None: no such graph or node, or a dimension the trace
    left unknown."""
    if traced is None:
        return None
    try:
        out = traced.get_operation_by_name(node_name).outputs[0]
    except (KeyError, ValueError, IndexError):
        return None
    if not out.shape.is_fully_defined() or not out.dtype.size:
        return None
    return int(out.shape.num_elements()) * out.dtype.size


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

    def __init__(self, library: Mapping[str, Any],
                 traced: Mapping[str, Any] | None = None):
        self.library = library
        self.traced = traced or {}  # function name -> its traced graph (output shapes)
        self.ops: list[Op] = []
        self.names: set[str] = set()
        self.op_types: dict[str, str] = {}
        self.ps_side: set[str] = set()
        self.dropped: dict[str, tuple[str, ...]] = {}
        self.control_edges: set[tuple[str, str]] = set()  # (op, the op it waits for)
        self.warnings: list[str] = []
        self.recv_variables: dict[str, str] = {}
        self.recv_objects: dict[str, Any] = {}  # recv -> the variable object it reads
        # Per inlined call: how a consumer of "<call>:<k>" / "^<call>" resolves.
        self.outputs: dict[str, list[list[str]]] = {}
        self.control_outputs: dict[str, list[str]] = {}

    def add_nodes(self, nodes: list[_Node], prefix: str,
                  arg_map: Mapping[str, list[str]], remote: dict[str, Any],
                  traced: Any = None) -> None:
        """``arg_map``: function argument name -> the op names it stands for.
        ``remote``: node or argument name (unprefixed) -> remote variable. ``traced``:
        the traced graph the nodes come from (their output shapes), if known."""
        for node in nodes:
            full = prefix + node.name
            deps: list[str] = []
            data_deps: list[str] = []
            remote_inputs = []
            for raw in node.inputs:
                src, control = _input_node(raw)
                if src in remote:
                    remote_inputs.append(remote[src])
                    continue
                resolved = self._resolve(src, raw, prefix, arg_map, control)
                if control:
                    self.control_edges.update((full, d) for d in resolved)
                else:
                    data_deps.extend(resolved)
                deps.extend(resolved)
            deps = list(dict.fromkeys(deps))
            if node.name in remote:                        # a remote handle placeholder
                continue
            if remote_inputs and node.op in HANDLE_FORWARDING_OPS:
                remote[node.name] = remote_inputs[0]
                continue
            if remote_inputs and node.op in PARAMETER_READ_OPS:
                # A read that takes worker data (a gather's ids) runs on the PS once
                # that data came: a recv with inputs. Ordering (control) inputs are
                # dropped: the PS keeps that ordering itself.
                var = remote_inputs[0]
                nbytes = (_variable_bytes(var) if node.op == "ReadVariableOp"
                          else traced_output_bytes(traced, node.name))
                inputs = tuple(dict.fromkeys(data_deps))
                self._add(Op(name=full, kind=RECV, inputs=inputs, channel=_channel(var),
                             bytes=nbytes, param=parameter_name(var.name)), node.op)
                self.recv_variables[full] = var.name
                self.recv_objects[full] = var
                dropped = tuple(d for d in deps if d not in inputs)
                if dropped:
                    self.dropped[full] = dropped
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

    def add_loop_body(self, loop: _Node, remote: dict[str, Any]) -> None:
        """One iteration of the step loop ``loop`` (a top-level While): its body's
        nodes, named ``<loop>/body/<node>``; a body argument is a remote variable where
        the loop's input is one, else available at the iteration's start (no
        dependency)."""
        fdef = self.library[loop.attr["body"].func.name]
        data_inputs = [i for i in loop.inputs if not i.startswith("^")]
        body_remote: dict[str, Any] = {}
        for k, arg in enumerate(fdef.signature.input_arg):
            if k >= len(data_inputs):
                break
            src = _input_node(data_inputs[k])[0]
            var = remote.get(src)
            if var is not None:
                body_remote[arg.name] = var
        body_args = {arg.name: [] for arg in fdef.signature.input_arg
                     if arg.name not in body_remote}
        body = _body_nodes(fdef)
        self.add_nodes(body, f"{loop.name}/body/", body_args, body_remote,
                       self.traced.get(fdef.signature.name))

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
        body = _body_nodes(fdef)
        self.add_nodes(body, body_prefix, body_args, body_remote,
                       self.traced.get(sig.name))
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
        """The DAG, with what runs on the PS kept off the worker's transfers: a PS-side
        op waits on no transfer to the worker (the reads it takes, data or ordering,
        run on a PS too), and a read whose value only PS-side ops take never leaves the
        PS (tf_keras' SGD reads its momentum slot after updating it only to add it to
        the variable; the function's final NoOp waits for it by a control edge, which
        needs no tensor), so it is a PS-side op, not a recv."""
        recvs = {op.name for op in self.ops if op.kind == RECV}
        data_consumers: dict[str, list[str]] = {}
        for op in self.ops:
            for name in op.inputs:
                if name in recvs and (op.name, name) not in self.control_edges:
                    data_consumers.setdefault(name, []).append(op.name)
        local = {r for r, cs in data_consumers.items() if all(c in self.ps_side for c in cs)}
        recvs -= local
        ops = []
        for op in self.ops:
            if op.name in local:  # a PS op again: the ordering inputs it had come back
                op = dataclasses.replace(
                    op, kind=COMPUTE, channel=None, bytes=None, param=None, declared=None,
                    inputs=tuple(dict.fromkeys(op.inputs + self.dropped.pop(op.name, ()))))
                self.recv_variables.pop(op.name, None)
                self.recv_objects.pop(op.name, None)
            elif op.name in self.ps_side and any(i in recvs for i in op.inputs):
                self.dropped[op.name] = tuple(i for i in op.inputs if i in recvs)
                op = dataclasses.replace(
                    op, inputs=tuple(i for i in op.inputs if i not in recvs))
            ops.append(op)
        self.ps_side |= local
        return Extraction(graph=Graph(ops), name_map={}, op_types=self.op_types,
                          ps_side=frozenset(self.ps_side), dropped_inputs=self.dropped,
                          warnings=tuple(self.warnings),
                          recv_variables=self.recv_variables)


def _body_nodes(fdef: Any) -> list[_Node]:
    """A FunctionDef's nodes, their inputs named as in a GraphDef."""
    return [_Node(n.name, n.op, [_body_input(i) for i in n.input], n.attr)
            for n in fdef.node_def]


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
