"""Emulated GPU compute: the TictacDelay and TictacPayload ops of the native library
(enforce/native/delay_op.cc), for `tictac bench --emulate-gpu`.

A GPU worker's step computes for a time that does not grow with the number of workers,
while every PS link is shared by all of them. On a 2-core machine, 16-32 workers whose
compute is TensorFlow's CPU kernels share those cores: the step grows with W and
comm/comp falls, the opposite of a cluster. ``delay`` stands in for a worker's compute:
it passes its inputs through after a set time, completed by one timer thread per
process, so it costs wall time and no core. The ops of one stream (by default one
device, i.e. one worker) run one after the other, as kernels on a GPU stream, so a
step's compute is the sum of its delays whatever the DAG's width.

``payload`` stands in for a gradient: a tensor of the parameter's shape, made once and
handed out every step, so a push moves its real bytes and costs the worker no compute.

Example::

    from tictac_hooks.bench import emulate
    y, w = emulate.delay([x, w_read], 2.5, grad_ms=5.0)   # 2.5 ms forward, 5 ms back
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Any, Sequence

_KEYS = itertools.count(1)
_REGISTERED: list[bool] = []


def ops() -> Any:
    """The native library's op module (built against this TensorFlow at first use),
    with TictacDelay's gradient registered."""
    from tictac_hooks.enforce.native.build import load
    module = load()
    if not _REGISTERED:
        import tensorflow as tf

        @tf.RegisterGradient("TictacDelay")
        def _delay_grad(op: Any, *grads: Any) -> list[Any]:
            # d(identity) = identity: the gradients pass back through a delay of their
            # own (grad_delay_ms), the backward pass's compute on the same stream.
            live = [i for i, g in enumerate(grads) if g is not None]
            if not live:
                return [None] * len(grads)
            back_ms = op.get_attr("grad_delay_ms")
            passed = module.tictac_delay([tf.convert_to_tensor(grads[i]) for i in live],
                                         delay_ms=back_ms, stream=op.get_attr("stream"),
                                         key=next(_KEYS))
            out: list[Any] = [None] * len(grads)
            for i, g in zip(live, passed):
                out[i] = g
            return out
        _REGISTERED.append(True)
    return module


def delay(inputs: Sequence[Any], ms: float, grad_ms: float = 0.0, stream: str = "",
          key: int | None = None) -> list[Any]:
    """``inputs`` passed through after ``ms`` milliseconds of emulated compute on
    ``stream`` (default: the op's device); their gradients after ``grad_ms``."""
    if ms < 0 or grad_ms < 0:
        raise ValueError(f"a delay is >= 0 ms, got {ms} and {grad_ms}")
    return list(ops().tictac_delay(list(inputs), delay_ms=float(ms),
                                   grad_delay_ms=float(grad_ms), stream=stream,
                                   key=next(_KEYS) if key is None else int(key)))


def payload(after: Sequence[Any], shape: Sequence[int], dtype: Any = None) -> Any:
    """A zero tensor of ``shape`` once ``after`` is ready, made once per op."""
    import tensorflow as tf
    return ops().tictac_payload(list(after), shape=list(shape),
                                dtype=dtype or tf.float32, key=next(_KEYS))


def timer_counts() -> dict[str, int]:
    """This process's delay timer: ops pending, fired and cancelled so far."""
    from tictac_hooks.enforce.native.build import load, loaded_path
    load()
    lib = ctypes.CDLL(loaded_path())  # the library TensorFlow loaded: the same timer
    out = {}
    for name in ("pending", "fired", "cancelled"):
        fn = getattr(lib, f"tictac_delay_{name}")
        fn.restype = ctypes.c_int64
        out[name] = int(fn())
    return out
