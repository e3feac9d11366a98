"""tictac-hooks: TicTac communication scheduling for TensorFlow parameter-server training.

The scheduling core lives in :mod:`tictac_hooks.graph` (framework-free), the sender-side
enforcement in :mod:`tictac_hooks.enforce`, the user-facing adapters in
:mod:`tictac_hooks.callbacks`.
"""

__version__ = "0.1.0"


_SUBPACKAGES = ("graph", "enforce", "callbacks", "bench", "patches")


def __getattr__(name: str):
    # Lazy: importing tictac_hooks must not import TensorFlow (graph/ is usable offline).
    if name in _SUBPACKAGES:  # e.g. tictac_hooks.enforce.TicTacServer after import tictac_hooks
        import importlib
        return importlib.import_module(f"tictac_hooks.{name}")
    if name == "TicTac":
        from tictac_hooks.callbacks.keras_callback import TicTac
        return TicTac
    if name == "TicTacLoop":
        from tictac_hooks.callbacks.custom_loop import TicTacLoop
        return TicTacLoop
    if name == "TicTacHook":
        from tictac_hooks.callbacks.session_hook import TicTacHook
        return TicTacHook
    raise AttributeError(f"module 'tictac_hooks' has no attribute {name!r}")


__all__ = ["TicTac", "TicTacLoop", "TicTacHook", "__version__"]
