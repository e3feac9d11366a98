"""Declaration positions: where each variable stands in the model's variable list, the
order BytePS, ByteScheduler and P3 prioritise by (``declared`` in
:mod:`tictac_hooks.graph.algorithms`; docs/ALGORITHMS.md, "Baselines").

:func:`declaration_positions` -- a model (``trainable_variables``, then its other
variables) or a list of variables -> their positions; :func:`with_declared` sets each
recv's ``Op.declared`` from them. The concrete-function extractor
(``extract_concrete_function(..., declared=model)``) and the graph-mode path
(``traced_worker_graphs(..., declared=variables)``) use them.

No TensorFlow is imported: the functions read the objects TensorFlow handed in.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping

from tictac_hooks.graph.dag import Graph, GraphError

_SHARD = re.compile(r"/part_\d+$")


def parameter_name(variable_name: str) -> str:
    """The parameter a variable holds: its name without ``:0`` and without the
    ``/part_<k>`` of a shard (a ShardedVariable's shards are one parameter)."""
    return _SHARD.sub("", variable_name.split(":", 1)[0])


@dataclasses.dataclass(frozen=True)
class Positions:
    """Declaration positions of a model's variables.

    ``by_id``: ``id()`` of each variable, of its handle where it has one, and of a
    ShardedVariable and each of its shards -> position. ``by_name``: parameter name ->
    position, for names that one parameter alone holds (TensorFlow 2 does not make
    variable names unique).
    """

    by_id: Mapping[int, int]
    by_name: Mapping[str, int]

    def of(self, variable: Any) -> int | None:
        """The position of ``variable`` (by identity, its handle's, then its name);
        None where it is not declared."""
        for obj in (variable, _handle(variable)):
            if obj is not None and id(obj) in self.by_id:
                return self.by_id[id(obj)]
        name = getattr(variable, "name", None)
        return None if not isinstance(name, str) else self.by_name.get(parameter_name(name))


def declared_variables(declared: Any) -> list[Any]:
    """The variables in declaration order: a model's ``trainable_variables``, then the
    rest of its ``variables`` (non-trainable ones, in the model's order); or the given
    iterable of variables as it is."""
    if hasattr(declared, "trainable_variables"):
        out = list(declared.trainable_variables)
        seen = {id(v) for v in out}
        rest = getattr(declared, "variables", None)
        if rest is None:
            rest = getattr(declared, "non_trainable_variables", ())
        out += [v for v in rest if id(v) not in seen]
        return out
    if isinstance(declared, (str, bytes)) or not isinstance(declared, Iterable):
        raise GraphError("declared must be a model (with trainable_variables) or the "
                         f"variables in declaration order; got {type(declared).__name__}")
    return list(declared)


def declaration_positions(declared: Any) -> Positions:
    """Positions of :func:`declared_variables`: one per parameter, in order. A
    ShardedVariable (an object with ``variables``, as ``MinSizePartitioner`` makes),
    and shards listed one by one (names ``<name>/part_<k>``, next to each other), take
    one position for all their shards; a variable listed twice keeps its first."""
    by_id: dict[int, int] = {}
    names: dict[str, set[int]] = {}
    count = 0
    last_shard: str | None = None
    for var in declared_variables(declared):
        if id(var) in by_id:
            continue
        shards = list(getattr(var, "variables", ()) or ()) if _is_sharded(var) else []
        name = getattr(var, "name", None) or (getattr(shards[0], "name", None)
                                              if shards else None)
        param = parameter_name(name) if name else None
        shard_name = name is not None and bool(_SHARD.search(name.split(":", 1)[0]))
        if shard_name and param == last_shard:
            position = count - 1  # the next shard of the parameter just declared
        else:
            position = count
            count += 1
        last_shard = param if shard_name or shards else None
        for obj in [var] + shards:
            by_id.setdefault(id(obj), position)
            handle = _handle(obj)
            if handle is not None:
                by_id.setdefault(id(handle), position)
        for n in [name] + [getattr(s, "name", None) for s in shards]:
            if n:
                names.setdefault(parameter_name(n), set()).add(position)
    by_name = {n: next(iter(ps)) for n, ps in names.items() if len(ps) == 1}
    return Positions(by_id, by_name)


def _is_sharded(var: Any) -> bool:
    """A ShardedVariable (tf.distribute): holds its shards in ``variables``."""
    return any(c.__name__ in ("ShardedVariable", "ShardedVariableMixin")
               for c in type(var).__mro__)


def _handle(var: Any) -> Any:
    """The variable's resource handle; None where it has none (or will not say: a
    distributed or mirrored variable may raise anything outside its context)."""
    try:
        return var.handle
    except Exception:  # noqa: BLE001
        return None


def with_declared(graph: Graph,
                  position_of: Mapping[str, int | None] | Callable[[str], int | None]
                  ) -> Graph:
    """A copy of ``graph`` whose recvs carry their declaration position (``declared``).

    ``position_of``: recv name -> position (a mapping or a function; None or missing:
    not declared). Recvs it does not place (in graph mode: tensors that are no
    variable's read) follow every placed one, one position each, in graph order.
    """
    get = position_of.get if isinstance(position_of, Mapping) else position_of
    found = {op.name: get(op.name) for op in graph.recvs}
    after = max((p for p in found.values() if p is not None), default=-1) + 1
    ops = []
    for op in graph.ops:
        if op.is_recv:
            position = found[op.name]
            if position is None:
                position, after = after, after + 1
            op = dataclasses.replace(op, declared=int(position))
        ops.append(op)
    return Graph(ops)


def creation_order(variables: Iterable[Any]) -> list[Any]:
    """``variables`` in the order they were created where TensorFlow says (an eager
    variable's ``_unique_id`` ends in a process-wide counter), the others after them
    in the given order."""
    items = list(variables)

    def key(k: int) -> tuple[int, int]:
        match = re.search(r"_(\d+)$", str(getattr(items[k], "_unique_id", "") or ""))
        return (0, int(match.group(1))) if match else (1, k)
    return [items[k] for k in sorted(range(len(items)), key=key)]


# Ops that hold a variable in a graph, and ops a read reaches it through.
_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
_FORWARDING_OPS = frozenset({"Identity", "ReadVariableOp", "ResourceGather", "Enter"})


def graph_mode_positions(tf_graph: Any, declared: Any) -> Callable[[str], int | None]:
    """recv name -> declaration position, for a graph-mode DAG (partition graphs) of
    ``tf_graph``, the client's ``tf.Graph``: a recv is named after the PS node that
    sends it (a read of a variable, ``edge_<n>_`` prefixed when sent twice), whose
    input leads to the variable's op. ``declared``: the variables in declaration order
    (``tf.compat.v1.trainable_variables()``, then the other global variables)."""
    from tictac_hooks.graph.tf.naming import sending_node_name
    positions = declaration_positions(declared)

    def position(recv: str) -> int | None:
        try:
            op = tf_graph.get_operation_by_name(sending_node_name(recv))
        except (KeyError, ValueError):
            return None
        for _ in range(16):
            if op.type in _VARIABLE_OPS:
                return positions.by_name.get(parameter_name(op.name))
            if op.type not in _FORWARDING_OPS or not op.inputs:
                return None
            op = op.inputs[0].op
        return None
    return position
