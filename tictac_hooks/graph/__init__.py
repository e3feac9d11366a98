"""The scheduling core: iteration DAGs, time oracles, TIC and TAC, bounds, simulation.

Framework-free: importing a module here imports no TensorFlow, and none imports the
layers above it (tests/test_layers.py checks both). Iteration DAGs and times from real
TensorFlow graphs and measurements come from the :mod:`tictac_hooks.graph.tf`
subpackage, which imports TensorFlow when its functions are called; of the core only
``report.analyze_report`` (``tictac analyze``) calls into it.
"""

from tictac_hooks.graph.dag import COMPUTE, RECV, Graph, GraphError, Op
from tictac_hooks.graph.schedule import Schedule, ScheduleError

__all__ = ["COMPUTE", "RECV", "Graph", "GraphError", "Op", "Schedule", "ScheduleError"]
