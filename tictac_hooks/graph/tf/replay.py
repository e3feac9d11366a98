"""A traced step function, made runnable on its own: the graph of the very step that
trains, with fresh local variables and synthetic inputs in place of the PS variables and
the input iterator (docs/ALGORITHMS.md, "TAC").

TAC needs per-op compute times keyed by the DAG's op names. Running the step's own
graph gives them for any model ``fit`` can train -- subclassed, several inputs, custom
``train_step`` -- with the DAG's names by construction: no model is rebuilt.

* :func:`step_spec` (in the training process) -- what a replay needs from a
  ``ConcreteFunction``: its GraphDef, the variables it captures (dtype, shape), where
  its data comes from, and what to run. Reads nothing from a PS.
* :func:`replay_graph` (anywhere, e.g. a child process) -- rewrites that GraphDef into
  a standalone one: every captured variable becomes a local ``VarHandleOp`` of the same
  name, the ops that take the next element from the input iterator become placeholders,
  device placements are dropped.
* :func:`synthetic_value` -- inputs that are valid by construction: integer ids 0 (a
  row of every table), floats in [0, 1) (cast to an id: 0), empty strings (a lookup's
  out-of-vocabulary id), False.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from tictac_hooks.graph.dag import GraphError
from tictac_hooks.graph.tf.extraction import _input_node

# How a step takes its next element from a tf.data iterator (tf_keras fit under
# ParameterServerStrategy: IteratorGetNextAsOptional, then an If on OptionalHasValue
# whose branches unpack it; elsewhere a plain IteratorGetNext).
_GET_NEXT = "IteratorGetNext"
_GET_NEXT_OPTIONAL = "IteratorGetNextAsOptional"
_HAS_VALUE = "OptionalHasValue"
_IF_OPS = frozenset({"If", "StatelessIf"})
INPUT_PREFIX = "tictac_replay/input_"


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor the replay makes: dtype name (``"float32"``), shape (None: unknown)."""

    dtype: str
    shape: tuple[int | None, ...] | None


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """What :func:`replay_graph` needs, all plain data (JSON-able but the GraphDef).

    Attributes:
      graph_def: the step's serialized GraphDef (bytes), with its function library.
      variables: placeholder node -> the captured variable it stands for.
      iterators: resource placeholders that are neither variables nor known
        resources: the input iterators.
      constants: placeholder node -> a captured non-resource tensor's value (numpy).
      arguments: placeholder node -> a data argument of the function (fed).
      fetches: tensor and op names to run: the function's outputs and control outputs.
    """

    graph_def: bytes
    variables: Mapping[str, Tensor]
    iterators: tuple[str, ...]
    constants: Mapping[str, Any]
    arguments: Mapping[str, Tensor]
    fetches: tuple[str, ...]


def _tensor(t: Any) -> Tensor:
    shape = None if t.shape.rank is None else tuple(t.shape.as_list())
    return Tensor(t.dtype.name, shape)


def step_spec(concrete: Any) -> StepSpec:
    """The :class:`StepSpec` of a traced step (``tf.function(...).get_concrete_function``).

    Raises GraphError, naming the capture, when the step captures something a replay
    cannot make locally (a lookup table, a remote tensor).
    """
    graph = getattr(concrete, "graph", None)
    if graph is None or not hasattr(graph, "as_graph_def"):
        raise GraphError(f"expected a ConcreteFunction, got {type(concrete).__name__}")
    variables = {id(v.handle): v for v in getattr(concrete, "variables", ())}
    spec_vars: dict[str, Tensor] = {}
    constants: dict[str, Any] = {}
    captured = set()
    for external, internal in graph.captures:
        name = internal.op.name
        captured.add(name)
        var = variables.get(id(external))
        if var is not None:
            spec_vars[name] = Tensor(var.dtype.name, tuple(var.shape.as_list()))
        elif internal.dtype.name != "resource" and hasattr(external, "numpy"):
            try:
                constants[name] = external.numpy()
            except Exception as e:  # a tensor on a remote device
                raise GraphError(f"the step captures tensor {name!r} whose value cannot "
                                 f"be read here ({type(e).__name__})") from None
        else:
            raise GraphError(f"the step captures {name!r} ({internal.dtype.name}), which "
                             "is not a variable (a lookup table?): the replay cannot make "
                             "it locally; do lookups in the input pipeline for TAC")
    iterators, arguments = [], {}
    for t in graph.inputs:
        name = t.op.name
        if name in captured:
            continue
        if t.dtype.name == "resource" or t.dtype.name == "variant":
            iterators.append(name)
        else:
            arguments[name] = _tensor(t)
    fetches = tuple([t.name for t in graph.outputs if t is not None]
                    + [op.name for op in graph.control_outputs])
    return StepSpec(graph.as_graph_def().SerializeToString(), spec_vars, tuple(iterators),
                    constants, arguments, fetches)


def _shapes(node: Any, n: int) -> list[tuple[int | None, ...] | None]:
    if "output_shapes" not in node.attr:
        return [None] * n
    out = []
    for s in node.attr["output_shapes"].list.shape:
        out.append(None if s.unknown_rank else tuple(None if d.size < 0 else d.size
                                                     for d in s.dim))
    return out + [None] * (n - len(out))


def replay_graph(spec: StepSpec) -> tuple[Any, dict[str, Tensor]]:
    """(standalone GraphDef, input placeholder name -> the tensor it must be fed).

    The inputs are the function's data arguments and one placeholder per component of
    the iterator's element (named ``tictac_replay/input_<k>``). Raises GraphError when
    the step reads its iterator through an op this does not know.
    """
    import tensorflow as tf

    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(spec.graph_def)
    _strip_placement(graph_def)
    iterators = set(spec.iterators)
    optionals: set[str] = set()
    for node in graph_def.node:
        if node.op == _GET_NEXT_OPTIONAL and _reads(node, iterators):
            optionals.add(node.name)
    feeds: dict[str, Tensor] = dict(spec.arguments)
    new_nodes = []
    for node in graph_def.node:
        if node.name in spec.variables:
            v = spec.variables[node.name]
            _make_variable(node, v)
        elif node.name in spec.constants:
            _make_constant(node, spec.constants[node.name])
        elif node.name in optionals:
            _make_no_op(node)
        elif node.op == _HAS_VALUE and _reads(node, optionals):
            _make_constant(node, True)
        elif node.op == _GET_NEXT and _reads(node, iterators):
            types = list(node.attr["output_types"].list.type)
            new_nodes += _make_inputs(node, types, _shapes(node, len(types)), feeds)
        elif node.op in _IF_OPS and _reads(node, iterators | optionals):
            types = list(node.attr["Tout"].list.type)
            new_nodes += _make_inputs(node, types, _shapes(node, len(types)), feeds)
        elif _reads(node, iterators | optionals):
            raise GraphError(f"the step reads its input through {node.name!r} "
                             f"({node.op}), which the replay does not know")
    graph_def.node.extend(new_nodes)
    return graph_def, feeds


def _reads(node: Any, names: set[str]) -> bool:
    return any(_input_node(i)[0] in names and not i.startswith("^") for i in node.input)


def _strip_placement(graph_def: Any) -> None:
    """The replay runs on one local device: no /job:ps placements, no colocation."""
    nodes = list(graph_def.node)
    for f in graph_def.library.function:
        nodes += list(f.node_def)
    for node in nodes:
        node.device = ""
        if "_class" in node.attr:
            del node.attr["_class"]


def _reset(node: Any, op: str) -> None:
    name = node.name
    controls = [i for i in node.input if i.startswith("^")]
    node.Clear()
    node.name, node.op = name, op
    node.input.extend(controls)


def _make_variable(node: Any, v: Tensor) -> None:
    import tensorflow as tf
    _reset(node, "VarHandleOp")
    node.input[:] = []
    node.attr["dtype"].type = tf.as_dtype(v.dtype).as_datatype_enum
    node.attr["shape"].shape.CopyFrom(tf.TensorShape(v.shape).as_proto())
    node.attr["shared_name"].s = node.name.encode()
    node.attr["container"].s = b""


def _make_constant(node: Any, value: Any) -> None:
    import tensorflow as tf
    proto = tf.make_tensor_proto(value)
    _reset(node, "Const")
    node.input[:] = []
    node.attr["dtype"].type = proto.dtype
    node.attr["value"].tensor.CopyFrom(proto)


def _make_no_op(node: Any) -> None:
    _reset(node, "NoOp")


def _make_inputs(node: Any, types: Sequence[int], shapes: Sequence[Any],
                 feeds: dict[str, Tensor]) -> list[Any]:
    """Turns ``node`` into an IdentityN of new placeholders, one per output."""
    import tensorflow as tf
    placeholders = []
    names = []
    for dtype_enum, shape in zip(types, shapes):
        ph = tf.compat.v1.NodeDef()
        ph.name = f"{INPUT_PREFIX}{len(feeds)}"
        ph.op = "Placeholder"
        ph.attr["dtype"].type = dtype_enum
        if shape is not None:
            ph.attr["shape"].shape.CopyFrom(tf.TensorShape(list(shape)).as_proto())
        feeds[ph.name] = Tensor(tf.as_dtype(dtype_enum).name, shape)
        placeholders.append(ph)
        names.append(ph.name)
    _reset(node, "IdentityN")
    node.input[:] = names  # the element is fed, so nothing else waits for the iterator
    node.attr["T"].list.type.extend(types)
    return placeholders


def synthetic_value(t: Tensor, batch_size: int, seed: int = 0) -> Any:
    """A value for an input (unknown dimensions: ``batch_size``), valid by construction:
    integer ids 0, floats uniform in [0, 1), False, empty strings."""
    import numpy as np
    if t.shape is None:
        raise GraphError(f"an input of the step has unknown rank ({t.dtype}): its shape "
                         "cannot be made up")
    shape = tuple(batch_size if d is None else d for d in t.shape)
    if t.dtype in ("string",):
        return np.full(shape, b"", dtype=object)
    if t.dtype == "bool":
        return np.zeros(shape, dtype=bool)
    if t.dtype.startswith(("float", "bfloat", "half", "complex")):
        value = np.random.default_rng(seed).random(shape)
        return value.astype("float32" if t.dtype == "bfloat16" else t.dtype)
    return np.zeros(shape, dtype=t.dtype)


def initial_value(t: Tensor, seed: int = 0) -> Any:
    """A local variable's starting value: floats uniform in [-0.05, 0.05), else 0."""
    import numpy as np
    shape = tuple(t.shape or ())
    if t.dtype.startswith(("float", "half")):
        value = np.random.default_rng(seed).uniform(-0.05, 0.05, size=shape)
        return value.astype(t.dtype)
    if t.dtype == "string":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=t.dtype if t.dtype != "bfloat16" else "float32")
