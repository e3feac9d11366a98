"""Argument checks shared by the constructors, the absl flags and the `tictac` CLI.

Each check raises ValueError naming the argument and the range it allows, before any
cluster, model or TensorFlow server is built; the ``arg_*`` wrappers turn the same checks
into argparse types (argparse then names the option). No TensorFlow here.
"""

from __future__ import annotations

import argparse
import errno
import math
import numbers
import socket
from typing import Any, Callable

MAX_PORT = 65535


def whole_number(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``; bools, floats and strings are refused."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or value < minimum):
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def seconds(name: str, value: Any) -> float:
    """``value`` as a finite float > 0 (NaN, inf, 0, negatives, bools, strings refused)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def positive_number(name: str, value: Any, unit: str = "") -> float:
    """``value`` as a finite float > 0."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value <= 0):
        what = f"a finite number of {unit} > 0" if unit else "a finite number > 0"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return float(value)


def port(name: str, value: Any, zero_picks_one: bool = False) -> int:
    """A TCP port: 1..65535, or also 0 ("pick a free one") where the caller supports it."""
    low = 0 if zero_picks_one else 1
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or not low <= value <= MAX_PORT):
        allowed = f"{low}..{MAX_PORT}" + (" (0: pick a free one)" if zero_picks_one else "")
        raise ValueError(f"{name} must be a port number in {allowed}, got {value!r}")
    return int(value)


def address(name: str, value: Any) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` with a port in 1..65535 -> (host, port)."""
    if isinstance(value, str):
        host, sep, text = value.rpartition(":")
        host = host.strip("[]")
        if sep and host and text.isdigit() and 1 <= int(text) <= MAX_PORT:
            return host, int(text)
    raise ValueError(f"{name} must be HOST:PORT with a port in 1..{MAX_PORT}, got {value!r}")


def cluster_addresses(spec: Any, name: str = "the cluster spec") -> None:
    """Checks every address of a cluster spec ``{job: [addresses] or {index: address}}``."""
    for job, tasks in spec.items():
        items = tasks.items() if isinstance(tasks, dict) else enumerate(tasks)
        for index, value in items:
            address(f"{name}'s address of {job}:{index}", value)


class PortInUseError(OSError):
    """A port a server is to bind is already taken; the message names it."""


def port_free(port_number: int, what: str) -> None:
    """Raises PortInUseError when something listens on ``port_number`` (any interface).

    TensorFlow's gRPC server binds every interface with SO_REUSEPORT, so it can silently
    share a port with another TensorFlow server, or fail with a bare "Could not start
    gRPC server"; a plain bind (SO_REUSEADDR, not SO_REUSEPORT) sees both.
    """
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((host, port_number))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise PortInUseError(
                        f"{what}: port {port_number} is already in use (another process "
                        "listens on it); stop that process or choose another port") from None
                if family == socket.AF_INET6:
                    continue  # e.g. IPv6 disabled
                raise


def check_window(window_bytes: Any) -> int:
    if isinstance(window_bytes, bool) or not isinstance(window_bytes, int) or window_bytes < 0:
        raise ValueError(f"window_bytes must be an integer >= 0, got {window_bytes!r}")
    return window_bytes


# -- argparse types -----------------------------------------------------------------------

def _arg(parse: Callable[[str], Any], check: Callable[[Any], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            value = text
        try:
            return check(value)
        except ValueError as e:
            # argparse prefixes "argument --option:"; say what is allowed, and what was given.
            allowed = str(e).removeprefix("value ").rpartition(", got ")[0]
            raise argparse.ArgumentTypeError(f"{allowed}, got {text!r}") from None
    return convert


def arg_whole_number(minimum: int = 1) -> Callable[[str], int]:
    return _arg(int, lambda v: whole_number("value", v, minimum))


def arg_seconds() -> Callable[[str], float]:
    return _arg(float, lambda v: seconds("value", v))


def arg_port(zero_picks_one: bool = False) -> Callable[[str], int]:
    return _arg(int, lambda v: port("value", v, zero_picks_one))


def arg_address() -> Callable[[str], str]:
    def check(v: Any) -> str:
        address("value", v)
        return v
    return _arg(str, check)


class _RenamedOption(argparse.Action):
    """An option's old name: sets the new option's value and says, in one line on
    stderr, which name to use."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "",
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        import sys
        print(f"{parser.prog}: {option_string} is deprecated; use {self.new}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed_option(parser: argparse.ArgumentParser, new: str, old: str,
                       **kwargs: Any) -> argparse.Action:
    """Adds option ``new`` (``kwargs`` as for ``add_argument``); its old name ``old``
    still works, hidden from ``--help``, with one deprecation line when used."""
    action = parser.add_argument(new, **kwargs)
    parser.add_argument(old, dest=action.dest, type=action.type, metavar=action.metavar,
                        default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                        action=_RenamedOption, new=new)
    return action
