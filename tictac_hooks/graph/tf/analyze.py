"""Timed iteration DAGs of ``keras.applications`` models, for ``tictac analyze``.

:func:`analyzed_graph` builds a model (random weights), traces one training or
inference step (:mod:`tictac_hooks.graph.tf.keras_models`), measures every compute op
on this machine with the TensorFlow profiler (:mod:`tictac_hooks.graph.tf.profiler`),
and times every recv as bytes / bandwidth (:mod:`tictac_hooks.graph.oracle`). Keras 3
is used unless ``TF_USE_LEGACY_KERAS=1`` selects tf_keras. :func:`analyzed_model` does
the same for a model one built oneself, traced on one batch of its own (the PS
workloads of ``tictac bench --model``). TensorFlow is imported when these functions
are called.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, TextIO

from tictac_hooks.graph import oracle
from tictac_hooks.graph.dag import Graph, GraphError
from tictac_hooks.graph.report import AnalyzeReport, analyze_graph, spread_over_ps
from tictac_hooks.graph.tf import keras_models, profiler

# Smallest square input each model family accepts (keras.applications' own checks);
# others default to 64 x 64, small enough for two CPU cores.
MIN_IMAGE_SIZE = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 71}
DEFAULT_IMAGE_SIZE = 64


def keras_module() -> Any:
    """tf_keras when ``TF_USE_LEGACY_KERAS=1`` (as TensorFlow decides), else Keras 3."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes"):
        import tf_keras
        return tf_keras
    import keras
    return keras


def application_names() -> list[str]:
    """The model constructors of ``keras.applications`` in the selected Keras."""
    apps = keras_module().applications
    return sorted(n for n in dir(apps) if n[:1].isupper() and callable(getattr(apps, n)))


def build_application_model(name: str, training: bool, batch_size: int,
                            image_size: int | None = None, classes: int = 1000) -> Any:
    """A ``keras.applications`` model with random weights (nothing is downloaded).

    Args:
      name: e.g. ``"ResNet50"``, ``"InceptionV3"``, ``"VGG16"``, ``"MobileNetV2"``.
      training: compile it (SGD, sparse categorical cross-entropy, no XLA) so that its
        train step can be traced.
      batch_size: checked here (>= 1), used by the caller's trace.
      image_size: square input side; default 64, or the model's minimum (75 for the
        Inception family, 71 for Xception).
      classes: size of the classification head (1000, as in the paper's models).

    Raises:
      GraphError: an unknown name (the message lists the valid ones), a bad size.
    """
    keras = keras_module()
    valid = application_names()
    if name not in valid:
        raise GraphError(f"unknown model {name!r}; valid keras.applications names: "
                         f"{', '.join(valid)}")
    if batch_size < 1:
        raise GraphError(f"batch_size must be >= 1, got {batch_size}")
    size = image_size or max(DEFAULT_IMAGE_SIZE, MIN_IMAGE_SIZE.get(name, 0))
    try:
        model = getattr(keras.applications, name)(
            weights=None, input_shape=(size, size, 3), classes=classes)
    except ValueError as e:
        raise GraphError(f"{name} does not accept a {size}x{size} input ({e}); "
                         "pass a larger image_size") from None
    if training:
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss="sparse_categorical_crossentropy", jit_compile=False)
    return model


def analyzed_graph(name: str, training: bool, batch_size: int,
                   bandwidth_bytes_per_s: float, progress: bool = True,
                   image_size: int | None = None, steps: int = 5, warmup: int = 2,
                   latency: float = 0.0, stream: TextIO | None = None) -> Graph:
    """The iteration DAG of a keras.applications model with every time filled.

    Compute ops: median over ``steps`` profiled runs on this machine (ops the profiler
    does not see, e.g. nodes grappler fused away, and ops that run on the PS in a real
    deployment get 0). Recvs: ``latency + bytes / bandwidth_bytes_per_s``. Progress goes
    to stderr (``stream``) when ``progress`` is true.
    """
    _check_bandwidth(bandwidth_bytes_per_s)
    say, t0 = _sayer(progress, stream), time.perf_counter()
    say(f"building {name} ({'training' if training else 'inference'}, "
        f"batch {batch_size}) ...")
    model = build_application_model(name, training, batch_size, image_size)
    return _timed(model, None, training, batch_size, bandwidth_bytes_per_s, progress,
                  steps, warmup, latency, stream, t0)


def analyzed_model(model: Any, example: Any, training: bool, bandwidth_bytes_per_s: float,
                   progress: bool = True, steps: int = 5, warmup: int = 2,
                   latency: float = 0.0, stream: TextIO | None = None) -> Graph:
    """:func:`analyzed_graph` for a model of one's own: a built Keras model (compiled
    for training) and one ``(inputs, targets)`` batch, arrays or dicts of arrays (what
    ``tictac bench --model PATH.py:FUNCTION`` and the built-in ``dlrm`` and
    ``transformer`` return), on which its step is traced and profiled.

    A gather's recv (an embedding lookup on a PS-held table) is sized by its output
    in the traced step: [batch, ..., dim] x the dtype's size.

    Raises:
      GraphError: a recv whose size the trace left unknown (named).
    """
    _check_bandwidth(bandwidth_bytes_per_s)
    inputs = example[0]
    first = next(iter(inputs.values())) if isinstance(inputs, dict) else inputs
    return _timed(model, example, training, len(first), bandwidth_bytes_per_s, progress,
                  steps, warmup, latency, stream, time.perf_counter())


def _check_bandwidth(bandwidth_bytes_per_s: float) -> None:
    if not bandwidth_bytes_per_s > 0:
        raise GraphError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s!r}")


def _sayer(progress: bool, stream: TextIO | None) -> Callable[[str], None]:
    out = stream or sys.stderr
    return (lambda msg: print(msg, file=out, flush=True)) if progress else (lambda msg: None)


def _timed(model: Any, example: Any, training: bool, batch_size: int,
           bandwidth_bytes_per_s: float, progress: bool, steps: int, warmup: int,
           latency: float, stream: TextIO | None, t0: float) -> Graph:
    """Traces ``model``'s step, profiles its compute ops and times its recvs."""
    out = stream or sys.stderr
    say = _sayer(progress, stream)
    say(f"tracing ({time.perf_counter() - t0:.1f} s) ...")
    ext, fn, args = keras_models.extract_keras_model(model, batch_size, training,
                                                     example=example)
    graph = ext.graph
    unknown = [op.name for op in graph.recvs if op.bytes is None]
    if unknown:
        named = ", ".join(f"{n} ({ext.op_types.get(n, '?')})" for n in unknown[:3])
        raise GraphError(
            f"{len(unknown)} recv(s) have no size: the traced step left the output shape "
            f"of {named}{' ...' if len(unknown) > 3 else ''} unknown; trace the step on a "
            "batch of fixed shape")
    say(f"traced: {len(graph)} ops, {len(graph.recvs)} recvs "
        f"({time.perf_counter() - t0:.1f} s); measuring on this CPU ...")
    bar = progress_bar("measuring", out) if progress else None
    prof = profiler.profile_compute_times(fn, args, steps=steps, warmup=warmup,
                                          names=[op.name for op in graph.ops], progress=bar)
    say(f"measured: coverage {prof.coverage:.1%} of profiled op time "
        f"({time.perf_counter() - t0:.1f} s)")
    times = {op.name: 0.0 for op in graph.compute_ops}
    times.update({n: t for n, t in prof.times.items() if n not in ext.ps_side})
    times.update(oracle.recv_times_from_bandwidth(graph, bandwidth_bytes_per_s, latency))
    return graph.with_times(times)


def progress_bar(label: str, stream: TextIO | None = None,
                 width: int = 30) -> Callable[[int, int], None]:
    """A ``(done, total)`` callback drawing ``label [#####.....] done/total`` in place."""
    out = stream or sys.stderr

    def update(done: int, total: int) -> None:
        filled = int(width * done / total) if total else width
        end = "\n" if done >= total else ""
        out.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}{end}")
        out.flush()
    return update


def analyze_report(model: str, training: bool, batch_size: int, image_size: int | None,
                   bandwidth: float, num_ps: int = 1, seeds: int = 10,
                   save_graph: str | None = None, progress: bool = True) -> AnalyzeReport:
    """Builds the model, times its DAG on this machine and analyzes it (graph/report.py)."""
    graph = analyzed_graph(model, training=training, batch_size=batch_size,
                           bandwidth_bytes_per_s=bandwidth, image_size=image_size,
                           progress=progress)
    graph = spread_over_ps(graph, num_ps)
    if save_graph:
        graph.save(save_graph)
    b, rows = analyze_graph(graph, seeds)
    config = {"model": model, "training": training, "batch_size": batch_size,
              "image_size": image_size, "bandwidth_bytes_per_s": bandwidth, "ps": num_ps,
              "seeds": seeds}
    return AnalyzeReport(config=config, summary=graph.summary(), bounds=b, rows=rows)
