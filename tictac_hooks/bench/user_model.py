"""`tictac bench --model PATH.py:FUNCTION`: the user's own model, in the benchmark.

``FUNCTION(batch_size)`` returns ``(model, inputs, targets)``: a tf_keras model,
compiled or not (not compiled: the bench compiles it with SGD and sparse categorical
cross-entropy on logits, and says so), and one batch of inputs and targets (arrays, or
dicts of arrays) that the bench repeats (``tf.data.Dataset.from_tensors(...).repeat()``).
In ``--frontend fit`` it is called under the strategy's scope. The built-in workloads
(:mod:`tictac_hooks.bench.models`: ``dlrm``, ``transformer``) have the same signature
and are named by their name alone.

Every error names the file and the function: :class:`UserModelError`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from typing import Any, Callable, Mapping

DEFAULT_BATCH = 64  # per worker, for a model file (the built-ins have their own)
DEFAULT_COMPILE = "SGD (learning rate 0.01) and sparse categorical cross-entropy on logits"
EXPECTED = ("a tuple (model, inputs, targets): a tf_keras Model, and one batch of inputs "
            "and of targets, each an array or a dict of arrays")


class UserModelError(ValueError):
    """The model given with --model cannot be used; the message says why and where."""


@dataclasses.dataclass
class ModelSource:
    """Where the model comes from: ``builder(batch_size)`` and how to name it."""

    spec: str           # as given: "dlrm", or "path/to/file.py:make"
    label: str          # "dlrm", or "file.py:make" (for tables)
    builder: Callable[[int], Any]
    path: str | None    # the user's file, absolute (None: built in)
    function: str


@dataclasses.dataclass
class LoadedModel:
    model: Any
    inputs: Any
    targets: Any
    compiled_by: str   # "the model's own compile" or DEFAULT_COMPILE


def is_model_spec(spec: str) -> bool:
    """Whether ``spec`` names a fit-mode model (a built-in of bench/models.py or
    PATH.py:FUNCTION) rather than one of the compat.v1 bench's CNNs."""
    from tictac_hooks.bench.models import BUILDERS
    return spec in BUILDERS or ":" in spec or spec.endswith(".py")


def label_of(spec: str) -> str:
    """How tables and file names call ``spec``, without importing it: a built-in's
    name, or FILE.py:FUNCTION."""
    from tictac_hooks.bench.models import BUILDERS
    if spec in BUILDERS:
        return spec
    path, _, function = spec.rpartition(":")
    return f"{os.path.basename(path)}:{function}"


def resolve(spec: str) -> ModelSource:
    """The builder ``spec`` names: a built-in name, or ``PATH.py:FUNCTION`` (the file is
    imported here: a missing file, a file that fails to import, a missing or
    non-callable function raise :class:`UserModelError`)."""
    from tictac_hooks.bench.models import BUILDERS
    if spec in BUILDERS:
        return ModelSource(spec, spec, BUILDERS[spec], None, spec)
    path, sep, function = spec.rpartition(":")
    if not sep or not path or not function:
        raise UserModelError(
            f"--model {spec!r}: write PATH.py:FUNCTION (e.g. examples/my_model.py:make) "
            f"or a built-in workload ({', '.join(sorted(BUILDERS))})")
    where = f"{path}:{function}"
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise UserModelError(f"--model {where}: no such file {full!r}")
    if not function.isidentifier():
        raise UserModelError(f"--model {where}: {function!r} is not a Python function name")
    module = _import_file(full, where)
    builder = getattr(module, function, None)
    if builder is None:
        names = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise UserModelError(
            f"--model {where}: {path} has no function {function!r}"
            + (f" (its functions: {', '.join(names)})" if names else ""))
    if not callable(builder):
        raise UserModelError(f"--model {where}: {function!r} in {path} is a "
                             f"{type(builder).__name__}, not a function")
    return ModelSource(spec, label_of(spec), builder, full, function)


def _import_file(path: str, where: str) -> Any:
    name = f"tictac_user_model_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserModelError(f"--model {where}: cannot import {path} (not a Python file?)")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)  # the user's file may import its neighbours
    try:
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - whatever the user's file raises
        sys.modules.pop(name, None)
        raise UserModelError(f"--model {where}: importing {path} failed: "
                             f"{type(e).__name__}: {e}") from e
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    return module


def load(source: ModelSource, batch_size: int, keras: Any = None) -> LoadedModel:
    """Calls the builder (inside the caller's strategy scope, if any), checks what it
    returned, builds the model on the inputs and compiles it when the builder did not.
    Raises :class:`UserModelError` naming the file and the function."""
    if keras is None:
        import tf_keras as keras
    where = _where(source)
    try:
        returned = source.builder(batch_size)
    except Exception as e:  # noqa: BLE001 - whatever the user's code raises
        raise UserModelError(f"{where}({batch_size}) raised {type(e).__name__}: {e}") from e
    if not isinstance(returned, (tuple, list)) or len(returned) != 3:
        raise UserModelError(f"{where}({batch_size}) returned {_describe(returned)}; "
                             f"expected {EXPECTED}")
    model, inputs, targets = returned
    if not isinstance(model, keras.Model):
        hint = ""
        if type(model).__module__.startswith("keras"):
            hint = (" (a Keras 3 model: build it with tf_keras, e.g. `import tf_keras as "
                    "keras`; Keras 3's fit does not support ParameterServerStrategy)")
        raise UserModelError(f"{where}({batch_size}) returned {_describe(model)} as the "
                             f"model{hint}; expected {EXPECTED}")
    for what, value in (("inputs", inputs), ("targets", targets)):
        problem = _batch_problem(value, batch_size)
        if problem:
            raise UserModelError(f"{where}({batch_size}) returned {_describe(value)} as "
                                 f"the {what}: {problem}; expected {EXPECTED}")
    try:
        if not model.built or not model.trainable_variables:
            model(inputs, training=False)
    except Exception as e:  # noqa: BLE001 - whatever building the user's model raises
        raise UserModelError(f"the model {where}({batch_size}) returned does not build on "
                             f"the inputs it returned: {type(e).__name__}: "
                             f"{_first_line(e)}") from e
    if not model.trainable_variables:
        raise UserModelError(f"the model {where}({batch_size}) returned has no trainable "
                             "variables: there is nothing for the parameter servers to send")
    # (graph mode's Model, tf.compat.v1: compile sets only _compile_was_called)
    if getattr(model, "_is_compiled", False) or getattr(model, "_compile_was_called", False):
        compiled_by = "the model's own compile"
    else:
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        compiled_by = DEFAULT_COMPILE
    return LoadedModel(model, inputs, targets, compiled_by)


def dataset(tf: Any, loaded: LoadedModel) -> Any:
    """The one batch, repeated."""
    return tf.data.Dataset.from_tensors((loaded.inputs, loaded.targets)).repeat()


def _where(source: ModelSource) -> str:
    if source.path is None:
        return f"built-in workload {source.spec!r}"
    return f"{source.path}:{source.function}"


def _batch_problem(value: Any, batch_size: int) -> str | None:
    """Why ``value`` is not one batch (an array or a dict of arrays), or None."""
    if isinstance(value, Mapping):
        if not value:
            return "an empty dict"
        for key, item in value.items():
            if not isinstance(key, str):
                return f"its key {key!r} is not a string"
            problem = _array_problem(item)
            if problem:
                return f"its item {key!r} is {problem}"
        return None
    return _array_problem(value)


def _array_problem(value: Any) -> str | None:
    shape = getattr(value, "shape", None)
    if shape is None or not hasattr(value, "dtype"):
        return f"not an array ({_describe(value)})"
    if len(shape) == 0:
        return "a scalar, not a batch (its first dimension is the batch)"
    return None


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        kinds = ", ".join(type(v).__name__ for v in value[:4])
        return (f"a {type(value).__name__} of {len(value)} "
                f"({kinds}{', ...' if len(value) > 4 else ''})")
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    return f"a {type(value).__name__}" if value is not None else "None"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def refuse_in_graph_mode(min_shard_bytes: int | None = None) -> None:
    """What the compat.v1 bench (``--frontend graph``) cannot run: it places each
    variable whole on one PS (``replica_device_setter``), so there is no partitioner
    to shard with."""
    if min_shard_bytes is not None:
        raise UserModelError("--min-shard-bytes applies to --frontend fit (the strategy's "
                             "variable_partitioner); the compat.v1 bench places each "
                             "variable whole on one PS")
