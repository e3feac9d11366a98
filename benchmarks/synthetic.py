"""Synthetic ResNet-shaped training DAGs for scaling benchmarks of the scheduling core."""

from __future__ import annotations

import numpy as np

from tictac_hooks.graph.dag import Graph, Op


def resnet_like_training(layers: int, forward_ops: int = 8, backward_ops: int = 14,
                         block: int = 3, channels: int = 1, seed: int = 0) -> Graph:
    """One recv per layer; a forward chain per layer with a residual add every ``block``
    layers; a backward chain per layer (activation gradient, weight gradient, the push of
    the weight gradient). About (forward_ops + backward_ops + 3) ops per recv."""
    rng = np.random.default_rng(seed)
    ops: list[Op] = [Op("input", "compute", time=0.0)]
    prev, block_in = "input", "input"
    forward_out = []
    for l in range(layers):
        w = f"w{l}"
        size = int(rng.integers(1, 64)) * 4096 * 4
        ops.append(Op(w, "recv", channel=f"ps:{l % channels}", bytes=size, time=size / 125e6))
        cur = prev
        for k in range(forward_ops):
            name = f"f{l}_{k}"
            ops.append(Op(name, "compute", (cur, w) if k == 0 else (cur,),
                          time=float(rng.uniform(5e-5, 5e-4))))
            cur = name
        if l % block == block - 1:
            ops.append(Op(f"add{l}", "compute", (cur, block_in), time=2e-5))
            cur = block_in = f"add{l}"
        forward_out.append(cur)
        prev = cur
    ops.append(Op("loss", "compute", (prev,), time=1e-4))
    grad = "loss"
    for l in reversed(range(layers)):
        cur = grad
        for k in range(backward_ops):
            inputs = (cur, forward_out[l], f"w{l}") if k == 0 else (cur,)
            name = f"b{l}_{k}"
            ops.append(Op(name, "compute", inputs, time=float(rng.uniform(5e-5, 8e-4))))
            cur = name
        ops.append(Op(f"dw{l}", "compute", (grad, forward_out[l - 1] if l else "input"),
                      time=float(rng.uniform(5e-5, 5e-4))))
        ops.append(Op(f"push{l}", "compute", (f"dw{l}",), time=1e-5))
        grad = cur
    return Graph(ops)
