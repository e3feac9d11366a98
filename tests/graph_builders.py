"""Small DAGs shared by the scheduling-core tests."""

from __future__ import annotations

import numpy as np

from tictac_hooks.graph.dag import Graph, Op


def chains(comm: list[float], comp: list[float]) -> Graph:
    """Independent recv_i -> op_i chains: Johnson's two-machine flow shop."""
    ops = []
    for i, (m, p) in enumerate(zip(comm, comp)):
        ops.append(Op(f"r{i}", "recv", time=m))
        ops.append(Op(f"op{i}", "compute", (f"r{i}",), time=p))
    return Graph(ops)


def random_dag(seed: int, n_recvs: int = 5, n_compute: int = 8, channels: int = 1,
               timed: bool = True) -> Graph:
    """A random layered DAG: each compute op reads 1-3 earlier ops (recvs or compute)."""
    rng = np.random.default_rng(seed)
    ops = [Op(f"r{i}", "recv", channel=f"ps:{i % channels}",
              time=float(rng.uniform(0.1, 2.0)) if timed else None) for i in range(n_recvs)]
    names = [op.name for op in ops]
    for j in range(n_compute):
        k = int(rng.integers(1, 4))
        inputs = tuple(sorted(set(rng.choice(names, size=min(k, len(names)), replace=False))))
        ops.append(Op(f"c{j}", "compute", inputs,
                      time=float(rng.uniform(0.0, 2.0)) if timed else None))
        names.append(f"c{j}")
    return Graph(ops)
