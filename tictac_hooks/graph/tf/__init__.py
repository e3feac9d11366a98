"""The TensorFlow-facing half of the scheduling core: iteration DAGs and times from
real TensorFlow graphs and measurements (docs/ALGORITHMS.md, "Model" and "TAC").

Every extractor returns an :class:`~tictac_hooks.graph.tf.extraction.Extraction`,
whose ``graph`` is the :class:`~tictac_hooks.graph.dag.Graph` the framework-free core
(:mod:`tictac_hooks.graph`) orders. One module per source:

* :mod:`tictac_hooks.graph.tf.naming` -- TensorFlow's names as plain strings: the
  task of a device (``task_of``), the sending node of a transfer
  (``sending_node_name``), rendezvous keys (``parse_rendezvous_key``), and the op
  types that read a parameter (``PARAMETER_READ_OPS``). Imports no TensorFlow: the
  PS-side Python gate uses it.
* :mod:`tictac_hooks.graph.tf.extraction` -- the ``Extraction`` result type and
  GraphDef input parsing shared by the extractors.
* :mod:`tictac_hooks.graph.tf.declared` -- declaration positions: where each
  variable stands in the model's variable list (``Op.declared``, the ``declared``
  baseline), for the extractors below.
* :mod:`tictac_hooks.graph.tf.partition` -- TF1 graph mode: a worker's DAG from
  ``RunMetadata.partition_graphs``; ``with_recv_bytes`` fills recv sizes.
* :mod:`tictac_hooks.graph.tf.functions` -- TF2: the DAG of a ``tf.function``'s
  ``ConcreteFunction``, reads of PS variables as recvs.
* :mod:`tictac_hooks.graph.tf.keras_models` -- a tf_keras or Keras 3 model's train (or
  predict) step, traced and extracted.
* :mod:`tictac_hooks.graph.tf.replay` -- a traced step's GraphDef made standalone
  (local variables, fed inputs) so the profiler can run the step that trains.
* :mod:`tictac_hooks.graph.tf.profiler` -- times from TensorFlow's measurements:
  graph-mode ``step_stats`` (compute times, RecvTensor transfer records) and the TF2
  profiler (per-op compute times of a ``tf.function``).
* :mod:`tictac_hooks.graph.tf.traced` -- ``traced_worker_graphs``: DAG per worker,
  compute times and late recvs from traced graph-mode steps (``TicTacHook``).
* :mod:`tictac_hooks.graph.tf.analyze` -- timed DAGs of ``keras.applications``
  models, for ``tictac analyze``.

Nothing here imports TensorFlow at module level: the functions that need it import it
when called, so importing these modules is cheap.
"""
