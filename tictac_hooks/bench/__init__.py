"""`tictac bench`: TensorFlow's default transfer order vs TicTac on a shaped network.

- :mod:`~tictac_hooks.bench.runner` builds the network and cluster and drives a run;
- :mod:`~tictac_hooks.bench.client` runs inside the client's namespace;
- :mod:`~tictac_hooks.bench.orders` the schedules it compares: names, controllers, the
  order check, the simulator's inputs;
- :mod:`~tictac_hooks.bench.workloads` the Keras application models, in-graph replicated;
- :mod:`~tictac_hooks.bench.metrics` the per-schedule metrics (no TensorFlow);
- :mod:`~tictac_hooks.bench.report` Markdown and PNG plots from result JSON files;
  its sections: :mod:`~tictac_hooks.bench.gains` (the gains and where they come
  from), :mod:`~tictac_hooks.bench.limit` (the distance to the link's limit),
  :mod:`~tictac_hooks.bench.expected` (the expected figures),
  :mod:`~tictac_hooks.bench.accuracy` (simulated against measured) and
  :mod:`~tictac_hooks.bench.plots` (matplotlib, imported lazily);
- :mod:`~tictac_hooks.bench.predict` the simulator's prediction of a step, per order;
- :mod:`~tictac_hooks.bench.fit_mode` ``--frontend fit``: tf_keras fit under
  ParameterServerStrategy, the orders in the order check's blocks, on the user's model
  (:mod:`~tictac_hooks.bench.user_model`) or a built-in
  (:mod:`~tictac_hooks.bench.models`: dlrm, transformer); its results
  (:mod:`~tictac_hooks.bench.fit_report`: per order, and TicTac with its own check).

A run's result is a :class:`~tictac_hooks.records.BenchRun`.
"""
