"""Reading TensorFlow profiler traces (``*.xplane.pb``) into per-op kernel events.

Tested on: tensorflow / tensorflow-cpu 2.21 (Linux x86_64, CPU), Keras 3.15, tf_keras 2.21.

Why this is a patch: ``tf.profiler.experimental`` is public, but what it writes is not a
documented format. We rely on three upstream internals:

* the message module ``tensorflow.tsl.profiler.protobuf.xplane_pb2`` (older wheels:
  ``tsl.profiler.protobuf.xplane_pb2``) and its fields ``XSpace.planes``,
  ``XPlane.{name, lines, event_metadata}``, ``XLine.{timestamp_ns, events}``,
  ``XEvent.{metadata_id, offset_ps, duration_ps}``, ``XEventMetadata.{name,
  display_name}``;
* host-side op events live on planes named ``/host:...`` and are named
  ``<graph node name>:<op type>`` with ``display_name`` = the op type;
* a ``tf.profiler.experimental.Trace(name)`` appears as a host event named ``name``.

:func:`check_upstream` verifies the first point without running anything;
``tests/test_oracle.py`` runs the profiler on a real model and fails if the other two
change (no op events, or none matching graph node names).
"""

from __future__ import annotations

from typing import Any, Iterator

REQUIRED_FIELDS = {
    "XSpace": ("planes",),
    "XPlane": ("name", "lines", "event_metadata"),
    "XLine": ("timestamp_ns", "events"),
    "XEvent": ("metadata_id", "offset_ps", "duration_ps"),
    "XEventMetadata": ("name", "display_name"),
}


class TensorFlowProfilerError(RuntimeError):
    """The installed TensorFlow's profiler format is not the one this module reads."""


def xplane_module() -> Any:
    """The generated ``xplane_pb2`` module of the installed TensorFlow."""
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        try:
            from tsl.profiler.protobuf import xplane_pb2  # type: ignore[no-redef]
        except ImportError as e:
            raise TensorFlowProfilerError(
                "cannot import xplane_pb2 from tensorflow.tsl.profiler.protobuf (or "
                "tsl.profiler.protobuf): this TensorFlow version is not supported for "
                "profiling yet (see patches/tf_profiler.py)") from e
    return xplane_pb2


def check_upstream() -> None:
    """Raises :class:`TensorFlowProfilerError` if a message or field we read is gone."""
    module = xplane_module()
    for message, fields in REQUIRED_FIELDS.items():
        cls = getattr(module, message, None)
        if cls is None:
            raise TensorFlowProfilerError(f"xplane_pb2 has no message {message}")
        missing = [f for f in fields if f not in cls.DESCRIPTOR.fields_by_name]
        if missing:
            raise TensorFlowProfilerError(f"xplane_pb2.{message} lacks field(s) {missing}")


def read_xspace(path: str) -> Any:
    module = xplane_module()
    space = module.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def host_events(space: Any, marker: str) -> Iterator[tuple[str, str | None, int, int]]:
    """Yields ``(kind, node name, start ps, duration ps)`` for host events: kind
    ``"marker"`` for a ``Trace(marker)`` window (node name None), ``"op"`` for an op
    kernel event named ``<node>:<type>``."""
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        meta = plane.event_metadata
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            for e in line.events:
                md = meta[e.metadata_id]
                if md.name == marker:
                    yield "marker", None, base + e.offset_ps, e.duration_ps
                elif md.display_name and md.name.endswith(":" + md.display_name):
                    yield ("op", md.name[: -len(md.display_name) - 1],
                           base + e.offset_ps, e.duration_ps)
