"""Per-op compute times of the step that trains, measured in a child process.

The child runs the traced step function itself (its GraphDef, from
:func:`tictac_hooks.graph.tf.replay.step_spec`): fresh local variables of the same
shapes, synthetic inputs valid by construction (ids 0), everything on the local CPU,
under the TensorFlow profiler. So the profile works for any model ``fit`` can train
(subclassed, several inputs, embeddings, a custom ``train_step``) and its op names are
the DAG's by construction. Running it in a separate process keeps the training process
untouched: no extra variables, no random-number state consumed, no weights changed --
TicTac must not change what is trained.

    python -m tictac_hooks.run.compute_profile SPEC.pickle OUT.json
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

log = logging.getLogger("tictac")

DEFAULT_BATCH_SIZE = 32  # where neither the step nor the caller says


class ComputeProfileError(RuntimeError):
    """The compute profile could not be measured; the message is one line."""


@dataclasses.dataclass(frozen=True)
class ComputeProfile:
    """What the child measured: op name -> median seconds, and how it went."""

    times: dict[str, float]
    coverage: float        # profiled op time that matched a DAG op, in [0, 1]
    batch_size: int        # what unknown input dimensions were made
    seconds: float         # wall time of the whole profile (the child included)


def profile_step(concrete: Any, names: Sequence[str], batch_size: int | None = None,
                 steps: int = 5, timeout_s: float = 300.0) -> ComputeProfile:
    """Runs the traced step ``concrete`` in a child process and times its ops.

    Args:
      concrete: the ConcreteFunction that trains (e.g. fit's traced train function).
      names: the DAG's op names to report times for.
      batch_size: the leading dimension of inputs whose batch dimension is unknown
        (default :data:`DEFAULT_BATCH_SIZE`).
      steps: profiled steps (after 2 warm-up runs); the median is kept per op.
      timeout_s: the child is stopped after this long.

    Raises:
      ComputeProfileError: with a one-line reason (the child's own error, if it failed).
    """
    from tictac_hooks.graph.dag import GraphError
    from tictac_hooks.graph.tf.replay import step_spec

    t0 = time.perf_counter()
    try:
        spec = step_spec(concrete)
    except GraphError as e:
        raise ComputeProfileError(str(e)) from None
    batch = int(batch_size or DEFAULT_BATCH_SIZE)
    with tempfile.TemporaryDirectory(prefix="tictac-profile-") as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.pickle"), os.path.join(tmp, "out.json")
        with open(spec_path, "wb") as f:
            pickle.dump({"spec": spec, "names": list(names), "batch_size": batch,
                         "steps": steps}, f)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
                   PYTHONPATH=_package_path())
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "tictac_hooks.run.compute_profile",
                 spec_path, out_path],
                env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ComputeProfileError(f"the profiling child ran past {timeout_s:.0f} s") \
                from None
        if proc.returncode != 0:
            log.debug("TicTac: the compute profile's child process failed:\n%s",
                      proc.stderr[-5000:])
            raise ComputeProfileError(_last_error(proc.stderr, proc.returncode))
        with open(out_path) as f:
            out = json.load(f)
    return ComputeProfile(out["times"], out["coverage"], batch, time.perf_counter() - t0)


def _package_path() -> str:
    """PYTHONPATH under which the child imports this very tictac_hooks."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    old = os.environ.get("PYTHONPATH", "")
    return root + (os.pathsep + old if old else "")


def _last_error(stderr: str, code: int) -> str:
    """The child's error in one line: the last 'SomethingError: ...' line of stderr."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return line[:300]
    return f"the profiling child exited with status {code}"


def compute_times_for(concrete: Any, names: Sequence[str], batch_size: int | None,
                      algorithm: str) -> tuple[ComputeProfile | None, str | None]:
    """(:func:`profile_step`, None), or (None, the reason) after ONE warning line that
    says TAC is off for this run (and, for ``algorithm="tac"``, that TIC runs instead).
    Never raises for a profile that fails: training goes on."""
    try:
        return profile_step(concrete, names, batch_size), None
    except ComputeProfileError as e:
        reason = str(e)
    except Exception as e:  # noqa: BLE001 - a profile must never stop training
        log.debug("TicTac: compute profile failed", exc_info=True)
        reason = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    log.warning("TicTac: no compute profile (%s); TAC is off for this run%s", reason,
                ", TIC instead" if algorithm == "tac" else "")
    return None, reason


def _child(spec_path: str, out_path: str) -> None:
    with open(spec_path, "rb") as f:
        job = pickle.load(f)
    import tensorflow as tf

    from tictac_hooks.graph.tf import profiler, replay
    spec = job["spec"]
    graph_def, feeds = replay.replay_graph(spec)
    if any(n.op.startswith("Tictac") for n in graph_def.node):
        # the native library's ops (the emulated compute of `tictac bench`)
        from tictac_hooks.enforce.native.build import load
        load()
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        init_feeds, inits = {}, []
        for i, (name, var) in enumerate(sorted(spec.variables.items())):
            value = tf.compat.v1.placeholder(var.dtype, var.shape)
            inits.append(tf.raw_ops.AssignVariableOp(
                resource=graph.get_tensor_by_name(name + ":0"), value=value))
            init_feeds[value] = replay.initial_value(var, seed=i)
    feed_dict = {graph.get_tensor_by_name(name + ":0"):
                 replay.synthetic_value(t, job["batch_size"], seed=k)
                 for k, (name, t) in enumerate(sorted(feeds.items()))}
    fetches = [graph.get_tensor_by_name(f) if ":" in f else graph.get_operation_by_name(f)
               for f in spec.fetches]
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(inits, init_feeds)
        profile = profiler.profile_compute_times(
            lambda: session.run(fetches, feed_dict), (), steps=job["steps"],
            names=job["names"])
    with open(out_path, "w") as f:
        json.dump({"times": profile.times, "coverage": profile.coverage}, f)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
