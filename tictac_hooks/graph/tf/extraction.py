"""What every extractor returns (:class:`Extraction`), and the GraphDef input parsing
the partition-graph and concrete-function extractors share. No TensorFlow imported."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from tictac_hooks.graph.dag import Graph


@dataclasses.dataclass(frozen=True)
class Extraction:
    """A DAG extracted from TensorFlow, with what is needed to match it to traces.

    Attributes:
      graph: the iteration DAG (recvs are roots, times unset).
      name_map: TensorFlow node name -> DAG op name, for every node that became an op
        whose name differs from the node's (e.g. the partition node
        ``MatMul/ReadVariableOp_S1`` -> recv ``MatMul/ReadVariableOp``). Pass it to
        :func:`tictac_hooks.graph.tf.profiler.times_from_step_stats`.
      op_types: DAG op name -> TensorFlow op type.
      ps_side: compute ops that in a PS deployment run on the PS, not on the worker
        (writes to remote variables, e.g. ``AssignSubVariableOp``, ``ResourceApply*``,
        and reads whose value only such writes take). They stay in the DAG, so that
        dependencies are faithful, and should get time 0 on the worker's compute
        resource.
      dropped_inputs: op name -> the inputs it had in TensorFlow and lost: a recv's,
        because a recv must be a root (e.g. a read ordered after a write to the same
        variable: in the real partition graph that ordering lives on the PS side too);
        a PS-side op's recvs, because what it takes from a read happens on the PS, not
        after the transfer to the worker.
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


def _input_node(name: str) -> tuple[str, bool]:
    """A GraphDef input (``"x"``, ``"x:1"``, ``"^x"``) -> (node name, is_control)."""
    if name.startswith("^"):
        return name[1:], True
    return name.split(":", 1)[0], False
