"""TicTac's settings, resolved: constructor argument, else parsed absl flag, else default;
and what a PS's gate backend makes of those that reach its install."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from absl import flags as absl_flags

from tictac_hooks import flags as tictac_flags


class TicTacSetupError(RuntimeError):
    """TicTac cannot run in this setup; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Resolved settings: constructor argument, else parsed absl flag, else default.

    Every value is checked (ValueError naming the argument and its allowed range): the
    constructors of TicTac, TicTacLoop and TicTacHook call :meth:`check` on their
    arguments, so a wrong one fails there, before any cluster or model is built.
    ``explicit`` names the settings the user set (an argument or a ``--tictac_*`` flag
    given on the command line), as opposed to those left to their default: a gate
    backend that cannot honour a setting refuses an explicit value
    (:func:`check_backends`) and lets a default resolve to its own behaviour.
    """

    algorithm: str
    profile_steps: int
    log_dir: str | None
    skip_timeout: float
    stats_every: int
    window_bytes: int = tictac_flags.DEFAULTS["window_bytes"]
    check_rounds: int = tictac_flags.DEFAULTS["check_rounds"]          # 0: no order check
    check_block_steps: int = tictac_flags.DEFAULTS["check_block_steps"]
    recheck_every: int = tictac_flags.DEFAULTS["recheck_every"]        # 0: check once
    align: str = tictac_flags.DEFAULTS["align"]                        # auto / on / off
    explicit: frozenset[str] = frozenset()  # the settings the user set, by name

    @classmethod
    def resolve(cls, algorithm: str | None = None, profile_steps: int | None = None,
                log_dir: str | None = None, skip_timeout: float | None = None,
                stats_every: int | None = None,
                window_bytes: int | None = None, check_rounds: int | None = None,
                check_block_steps: int | None = None,
                recheck_every: int | None = None, align: str | None = None) -> "Settings":
        setting = tictac_flags.setting
        given = dict(algorithm=algorithm, profile_steps=profile_steps, log_dir=log_dir,
                     skip_timeout=skip_timeout, stats_every=stats_every,
                     window_bytes=window_bytes, check_rounds=check_rounds,
                     check_block_steps=check_block_steps, recheck_every=recheck_every,
                     align=align)
        return cls(**cls.check(algorithm=setting("algorithm", algorithm),
                               profile_steps=setting("profile_steps", profile_steps),
                               log_dir=setting("log_dir", log_dir),
                               skip_timeout=setting("skip_timeout", skip_timeout),
                               stats_every=setting("stats_every", stats_every),
                               window_bytes=setting("window_bytes", window_bytes),
                               check_rounds=setting("check_rounds", check_rounds),
                               check_block_steps=setting("check_block_steps",
                                                         check_block_steps),
                               recheck_every=setting("recheck_every", recheck_every),
                               align=setting("align", align)),
                   explicit=frozenset(n for n, v in given.items() if _set_by_user(n, v)))

    @staticmethod
    def check(**values: Any) -> dict[str, Any]:
        """The given settings, checked (None: not given, left for the flag or default)."""
        from tictac_hooks import checks
        from tictac_hooks.checks import check_window

        checkers = {
            "algorithm": tictac_flags.check_algorithm,
            "profile_steps": lambda v: checks.whole_number("profile_steps", v, 1),
            "log_dir": _check_log_dir,
            "skip_timeout": lambda v: checks.seconds("skip_timeout", v),
            "stats_every": lambda v: checks.whole_number("stats_every", v, 1),
            "window_bytes": check_window,
            "check_rounds": lambda v: checks.whole_number("check_rounds", v, 0),
            "check_block_steps": _check_block_steps,
            "recheck_every": lambda v: checks.whole_number("recheck_every", v, 0),
            "align": tictac_flags.check_align,
        }
        return {name: None if value is None else checkers[name](value)
                for name, value in values.items()}


def _check_block_steps(value: Any) -> int:
    """A whole number >= MIN_CHECK_BLOCK_STEPS, or 0 / "auto": chosen when the check
    starts from the profiled steps' spread (CheckRunner)."""
    if value == "auto" or (value == 0 and not isinstance(value, bool)):
        return 0
    from tictac_hooks import checks
    try:
        return checks.whole_number("check_block_steps", value,
                                   tictac_flags.MIN_CHECK_BLOCK_STEPS)
    except ValueError:
        raise ValueError(f"check_block_steps must be a whole number >= "
                         f"{tictac_flags.MIN_CHECK_BLOCK_STEPS}, or 0 or 'auto' (chosen from "
                         f"the profiled steps' spread), got {value!r}") from None


def _check_log_dir(log_dir: Any) -> str:
    if not isinstance(log_dir, (str, os.PathLike)) or not os.fspath(log_dir):
        raise ValueError(f"log_dir must be a directory path (str or os.PathLike), or None "
                         f"for no logs; got {log_dir!r}")
    return os.fspath(log_dir)


def _set_by_user(name: str, value: Any) -> bool:
    """Whether setting ``name`` was given: as an argument (not None), or as its
    ``--tictac_<name>`` flag on a command line the program parsed."""
    if value is not None:
        return True
    flag_values = absl_flags.FLAGS
    flag = "tictac_" + name
    return bool(flag_values.is_parsed() and flag in flag_values
                and flag_values[flag].present)


# The settings that reach a gate's install, by the name the install takes them
# (GateClient.install); "auto" for align is no value of its own: the backend's behaviour.
GATE_SETTINGS = {"skip_timeout": "skip_after_s", "window_bytes": "window_bytes",
                 "align": "align"}
NOT_A_VALUE = {"align": "auto"}


def check_backends(settings: Settings,
                   backends: Mapping[str, tuple[str, Mapping[str, str]]]) -> None:
    """Raises TicTacSetupError, naming the backend and the setting, for a setting the user
    set explicitly that the gate backend of one of the PSes cannot honour. ``backends``:
    PS address -> (its backend, GateClient.unhonoured: install setting -> why not).
    Settings left to their default are not checked: each backend gets only what it
    honours (:func:`honoured`)."""
    for name in sorted(settings.explicit):
        install_name = GATE_SETTINGS.get(name)
        value = getattr(settings, name)
        if install_name is None or NOT_A_VALUE.get(name) == value:
            continue
        for address, (backend, unhonoured) in backends.items():
            why = unhonoured.get(install_name)
            if why is not None:
                raise TicTacSetupError(
                    f"{name}={value!r} was set (the {name} argument or --tictac_{name}), "
                    f"but the PS at {address} runs the {backend} backend, which cannot "
                    f"honour {name}: {why}. Leave {name} unset "
                    f"({NOT_A_VALUE.get(name, 'its default')}: each backend does what it "
                    "can), or run the PSes with the native backend (`tictac ps`, its "
                    "default)")


def honoured(backends: Mapping[str, tuple[str, Mapping[str, str]]],
             **install: Any) -> dict[str, Any]:
    """The install settings ``install`` (GateClient.install's keywords), each kept where
    every PS's backend honours it, else None (the backend's own behaviour)."""
    return {name: value if all(name not in unhonoured for _, unhonoured in backends.values())
            else None for name, value in install.items()}
