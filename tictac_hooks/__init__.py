"""tictac-hooks: TicTac communication scheduling for TensorFlow parameter-server training.

The scheduling core lives in :mod:`tictac_hooks.graph` (framework-free), the sender-side
enforcement in :mod:`tictac_hooks.enforce`, the user-facing adapters in
:mod:`tictac_hooks.callbacks`.
"""

__version__ = "0.1.0"
