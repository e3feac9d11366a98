"""Per-op compute times of a Keras model's step, measured in a child process.

The child rebuilds the model from its config (same layer and op names), compiles it
like the original, traces the same step function and runs it under the TensorFlow
profiler. Doing this in a separate process keeps the training process untouched: no
extra variables, no random-number state consumed, no weights changed — TicTac must not
change what is trained.

    python -m tictac_hooks.callbacks.compute_profile SPEC.json OUT.json
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import Any, Mapping


def model_spec(model: Any, batch_size: int, training: bool = True) -> dict[str, Any]:
    """What the child needs to rebuild and profile ``model`` (Sequential / functional)."""
    is_tf_keras = type(model).__module__.startswith("tf_keras") or \
        os.environ.get("TF_USE_LEGACY_KERAS") == "1"
    try:
        config = model.to_json()
    except (NotImplementedError, TypeError, ValueError) as e:
        raise ValueError(
            f"model {model.name!r} cannot be serialized ({e}); TAC's compute profile "
            "rebuilds the model from its config: use a Sequential or functional model, "
            "or the 'tic' algorithm") from None
    spec: dict[str, Any] = {"tf_keras": is_tf_keras, "model_json": config,
                            "batch_size": int(batch_size), "training": training}
    if training:
        spec["optimizer"] = {"class_name": type(model.optimizer).__name__,
                             "config": _jsonable(model.optimizer.get_config())}
        spec["loss"] = _loss_name(model.loss)
    return spec


def _jsonable(config: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in config.items():
        try:
            json.dumps(v)
            out[k] = v
        except TypeError:
            out[k] = float(v) if hasattr(v, "__float__") else str(v)
    return out


def _loss_name(loss: Any) -> Any:
    if isinstance(loss, str):
        return loss
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None)
    if not name:
        raise ValueError(f"cannot serialize loss {loss!r} for the compute profile; "
                         "compile with a named Keras loss or use the 'tic' algorithm")
    return name


def profile_in_subprocess(model: Any, batch_size: int, training: bool = True,
                          steps: int = 5, timeout_s: float = 600.0) -> dict[str, float]:
    """op name -> median seconds, measured in a child process (see module docstring)."""
    spec = model_spec(model, batch_size, training) | {"steps": steps}
    with tempfile.TemporaryDirectory(prefix="tictac-profile-") as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        if spec["tf_keras"]:
            env["TF_USE_LEGACY_KERAS"] = "1"
        proc = subprocess.run(
            [sys.executable, "-m", "tictac_hooks.callbacks.compute_profile", spec_path, out_path],
            env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError("compute profile failed in the child process:\n"
                               + proc.stderr[-3000:])
        with open(out_path) as f:
            return json.load(f)["times"]


def compute_times_for(model: Any, batch_size: int, training: bool, required: bool
                      ) -> dict[str, float] | None:
    """:func:`profile_in_subprocess`, or None with a warning when it cannot be done and
    the caller can do without (TIC); ``required`` (TAC) re-raises."""
    try:
        return profile_in_subprocess(model, batch_size, training=training)
    except (ValueError, RuntimeError) as e:
        if required:
            raise
        logging.getLogger("tictac").warning(
            "TicTac: no compute profile (%s); E will not be reported", e)
        return None


def _child(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    if spec["tf_keras"]:
        import tf_keras as keras
    else:
        import keras
    from tictac_hooks.graph.tf import keras_models, profiler
    model = keras.models.model_from_json(spec["model_json"])
    if spec["training"]:
        optimizer = keras.optimizers.deserialize(spec["optimizer"])
        model.compile(optimizer=optimizer, loss=spec["loss"])
    ext, fn, args = keras_models.extract_keras_model(model, spec["batch_size"], spec["training"])
    profile = profiler.profile_compute_times(fn, args, steps=spec.get("steps", 5),
                                             names=[op.name for op in ext.graph.ops])
    with open(out_path, "w") as f:
        json.dump({"times": profile.times, "coverage": profile.coverage}, f)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
