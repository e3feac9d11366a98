"""The scheduling core: iteration DAGs, time oracles, TIC and TAC, bounds, simulation.

Framework-free: nothing here imports TensorFlow at module level (the extraction
functions in :mod:`tictac_hooks.graph.tf_extract` import it when called).
"""

from tictac_hooks.graph.dag import COMPUTE, RECV, Graph, GraphError, Op
from tictac_hooks.graph.schedule import Schedule, ScheduleError

__all__ = ["COMPUTE", "RECV", "Graph", "GraphError", "Op", "Schedule", "ScheduleError"]
