"""The `tictac` command line. Each part of the package contributes its subcommands."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

# Modules with a `register(subparsers)` function; each adds its subcommands, whose
# handlers are stored as `func` and return an exit code.
# In this order in `tictac --help`: deployment first, then measuring, then the offline
# research tools.
COMMAND_MODULES = (
    "tictac_hooks.enforce.cli",
    "tictac_hooks.bench.cli",
    "tictac_hooks.graph.whatif_cli",
    "tictac_hooks.graph.cli",
    "tictac_hooks.graph.tf.cli",
)
EPILOG = ("Deploying: ps, server, schedule, build (docs/DEPLOYING.md). Measuring and "
          "predicting: bench, bench-report, whatif (docs/USING.md, docs/WHATIF.md). "
          "Offline, without a cluster: order, simulate, analyze "
          "(docs/OFFLINE.md).")


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tictac",
        description="TicTac communication scheduling for TensorFlow parameter-server training.",
        epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in modules:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None,
         modules: Sequence[str] = COMMAND_MODULES) -> int:
    """Runs a `tictac` subcommand; ``modules`` limits which are loaded (the launcher's
    PS and worker processes load only the enforce commands)."""
    parser = build_parser(modules)
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit: a closed pipe is handled below
        return code
    except BrokenPipeError:
        # `tictac ... | head`: the reader is gone. Say nothing; keep the interpreter's
        # final flush from failing again (the recipe of Python's signal module docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, OSError, ConnectionError) as e:
        # Our errors are ValueError subclasses that say what was wrong and what to do.
        print(f"tictac {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
