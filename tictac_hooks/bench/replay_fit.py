"""A replayed model for `tictac bench --frontend fit --emulate-gpu`: the worker step of
bench/replay.py as a tf_keras model that ``model.fit`` trains under
ParameterServerStrategy, so the fit frontend (asynchronous workers, the TicTac
callback, its order check) is measured at GPU speed too.

- **Variables**: one weight per replay shard, created under the strategy's scope in an
  order that makes the strategy's round-robin placement put each shard on its PS
  (ParameterServerStrategy ignores device scopes and places the k-th variable it makes
  on PS ``k mod P``; a PS that has run out of shards gets a one-element filler that no
  step reads). The bench runs with no ``variable_partitioner``: the replay's shards
  are already the partitioner's.
- **Step** (a custom ``train_step``): every variable read once on its worker, the
  replay's delay ops in order (each waits for the reads it first needs), then one
  payload per trained shard as its gradient, applied by the model's SGD on the PS
  (a push of the shard's push bytes; a smaller push updates the leading elements, as
  rows of a table would).

The inputs are one float per example; the step reports no loss (there is none to learn).
"""

from __future__ import annotations

from typing import Any, Callable

from tictac_hooks.bench.replay import Replay

LEARNING_RATE = 1e-3


def placement_order(ps_of: list[int], num_ps: int, first: int = 0) -> list[int | None]:
    """The creation order that puts shard ``i`` on PS ``ps_of[i]`` under round-robin
    placement whose next variable goes to PS ``first mod num_ps``: shard indices, in
    each PS's own order, with None for a filler where that PS has no shard left."""
    queues: list[list[int]] = [[] for _ in range(num_ps)]
    for i, p in enumerate(ps_of):
        if not 0 <= p < num_ps:
            raise ValueError(f"shard {i} is on PS {p}, the strategy has {num_ps}")
        queues[p].append(i)
    out: list[int | None] = []
    k = first
    while any(queues):
        q = queues[k % num_ps]
        out.append(q.pop(0) if q else None)
        k += 1
    return out


def builder(replay: Replay) -> Callable[[int], tuple[Any, Any, Any]]:
    """``FUNCTION(batch_size)`` (bench/user_model.py) that returns the replayed model,
    compiled, with one batch of inputs and targets; call it under the strategy's
    scope."""
    def make(batch_size: int) -> tuple[Any, Any, Any]:
        import numpy as np
        import tensorflow as tf
        import tf_keras as keras

        from tictac_hooks.bench import emulate
        emulate.ops()
        model = _model_class(keras, tf, emulate)(replay)
        model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE))
        inputs = np.ones((batch_size, 1), np.float32)
        return model, inputs, np.zeros((batch_size,), np.float32)
    return make


def _next_ps(tf: Any) -> int:
    """Where the strategy in scope places its next variable (its count of variables
    made so far; 0 where it keeps none)."""
    extended = getattr(tf.distribute.get_strategy(), "extended", None)
    return int(getattr(extended, "_variable_count", 0) or 0)


def _model_class(keras: Any, tf: Any, emulate: Any) -> type:
    class Replayed(keras.Model):
        """The replay's step (module docstring)."""

        def __init__(self, replay: Replay) -> None:
            super().__init__(name=f"{replay.model}_replayed")
            self.replay = replay
            order = placement_order([s.ps for s in replay.shards], replay.ps,
                                    _next_ps(tf))
            made: dict[int, Any] = {}
            self.fillers = []
            for k, i in enumerate(order):
                if i is None:
                    self.fillers.append(self.add_weight(
                        name=f"filler_{k}", shape=(1,), initializer="zeros",
                        trainable=False))
                    continue
                shard = replay.shards[i]
                made[i] = self.add_weight(name=shard.name.replace(":", "_"),
                                          shape=(shard.elements,), initializer="zeros",
                                          trainable=True)
            self.shard_variables = [made[i] for i in range(len(replay.shards))]

        def call(self, inputs: Any, training: bool = False) -> Any:
            return tf.reduce_sum(inputs)

        def train_step(self, data: Any) -> dict[str, Any]:
            x, _ = data
            act = tf.reduce_sum(x)  # from the input: nothing here folds to a constant
            reads = [tf.convert_to_tensor(v) for v in self.shard_variables]
            for seg in self.replay.segments:
                act = emulate.delay([act] + [reads[r] for r in seg.reads], seg.ms)[0]
            pairs = []
            for shard, var in zip(self.replay.shards, self.shard_variables):
                if not shard.push_elements:
                    continue
                grad = emulate.payload([act], [shard.push_elements])
                if shard.partial_push:  # the leading elements, as rows would
                    grad = tf.IndexedSlices(grad, tf.range(shard.push_elements),
                                            tf.constant([shard.elements]))
                pairs.append((grad, var))
            self.optimizer.apply_gradients(pairs)
            return {}  # no loss to track: fit's logs match the model's (no) metrics
    return Replayed
