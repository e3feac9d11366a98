"""absl flags for TicTac, defined once, here.

Libraries read them only when the program parsed flags (``absl.app.run`` or
``FLAGS(argv)``); an argument given to :class:`TicTac` or :class:`TicTacHook` always
wins over a flag, and a flag over the built-in default.
"""

from __future__ import annotations

import math
from typing import Any

from absl import flags

from tictac_hooks.enforce.gate import DEFAULT_SKIP_AFTER_S

ALGORITHM_CHOICES = ("tic", "tac", "none")
ALIGN_CHOICES = ("auto", "on", "off")
# An order-check block leaves two steps out of its medians: its first (it straddles the
# order change) and its last (the next block's install is a pause inside it; see
# CheckRunner._to_block). Three steps is the least that leaves one measured step.
MIN_CHECK_BLOCK_STEPS = 3

DEFAULTS: dict[str, Any] = {
    "algorithm": "tic",
    "profile_steps": 5,
    "log_dir": None,
    "skip_timeout": DEFAULT_SKIP_AFTER_S,  # the gate's skip bound: one default everywhere
    "stats_every": 1,
    "window_bytes": 1 << 20,
    "check_rounds": 8,
    "check_block_steps": 10,
    "recheck_every": 5000,
    "align": "auto",
    "measure_compute": True,
    "bandwidth": None,
}

flags.DEFINE_enum(
    "tictac_algorithm", DEFAULTS["algorithm"], list(ALGORITHM_CHOICES),
    "Transfer ordering: tic (default; from the computation graph alone), tac (graph plus "
    "measured op times), none (profile and log only, install no schedule).")
flags.DEFINE_integer(
    "tictac_profile_steps", DEFAULTS["profile_steps"],
    "Training steps run in TensorFlow's own order before the schedule is computed and "
    "installed (default 5), over all workers under ParameterServerStrategy (each worker "
    "runs about N / workers of them), session.run calls in graph mode. Counted in "
    "training steps, not dispatched calls: with steps_per_execution=10 and N=20 the "
    "switch comes after two calls. Transfer (and, for tac, compute) times are measured "
    "on these.",
    lower_bound=1)
flags.DEFINE_string(
    "tictac_log_dir", DEFAULTS["log_dir"],
    "Directory for TensorBoard step-time summaries and the transfer timeline "
    "(default: none, nothing written).")
flags.DEFINE_float(
    "tictac_skip_timeout", DEFAULTS["skip_timeout"],
    "The skip bound: seconds a scheduled transfer may be waited for before the PS's gate "
    f"skips it and releases the next one (default {DEFAULTS['skip_timeout']:g}; finite, "
    "> 0: it never waits forever). `tictac ps --skip-timeout` is the same bound.")
flags.register_validator(
    "tictac_skip_timeout", lambda v: v is not None and math.isfinite(v) and v > 0,
    message="--tictac_skip_timeout must be a finite number of seconds > 0")
flags.DEFINE_integer(
    "tictac_window_bytes", DEFAULTS["window_bytes"],
    "Bytes (default 1048576; 0: strictly one at a time). Native gate: the pacing window; "
    "while it paces (bandwidth= given) a transfer is handed to gRPC only while the bytes "
    "handed and not yet drained at the link rate are within it. Proxy backend: the "
    "look-ahead window; a scheduled transfer may be sent to the PS before the one ahead "
    "of it is answered while at most this many bytes are in flight.", lower_bound=0)
flags.DEFINE_integer(
    "tictac_check_rounds", DEFAULTS["check_rounds"],
    "The order check after the switch: at most this many rounds, each a block in a "
    "TicTac order (TIC, and TAC where compute times were measured) and one in "
    "TensorFlow's, either first at random; from round 3 on the rounds stop as soon as "
    "a one-sided t test shows an order faster than TensorFlow's (99 %, kept) or not 3 % faster "
    "(90 %, TensorFlow's order kept); an order not shown faster is not kept "
    "(default 8; 0: no check, keep TicTac's order).", lower_bound=0)
flags.DEFINE_integer(
    "tictac_check_block_steps", DEFAULTS["check_block_steps"],
    "Training steps per worker per block of the order check (default 10; at least "
    f"{MIN_CHECK_BLOCK_STEPS}: a block's first and last steps are not measured; 0: "
    "chosen from the profiled steps' spread, the shortest that would keep a true +10 % "
    "with 90 % chance, 10 to 60 steps, the longest check at most a tenth of the "
    "recheck period): under "
    "ParameterServerStrategy a block runs this many training steps times the workers, "
    "so every worker gives its pairs at any worker count. A block ends with the call "
    "that reaches it (steps_per_execution > 1 runs several training steps per call).",
    lower_bound=0)
flags.register_validator(
    "tictac_check_block_steps", lambda v: v == 0 or v >= MIN_CHECK_BLOCK_STEPS,
    f"--tictac_check_block_steps must be 0 (chosen from the spread) or at least "
    f"{MIN_CHECK_BLOCK_STEPS}")
flags.DEFINE_integer(
    "tictac_recheck_every", DEFAULTS["recheck_every"],
    "Run the order check again this many training steps per worker after each "
    "decision (under ParameterServerStrategy, this many training steps times the "
    "workers in all), so a "
    "job whose best order changes (other load, another phase of training) follows it "
    "(default 5000; 0: check once).", lower_bound=0)
flags.DEFINE_boolean(
    "tictac_measure_compute", DEFAULTS["measure_compute"],
    "Profile per-op compute times at the switch (in a child process, a few seconds, "
    "while training goes on in TensorFlow's order), for TAC in the order check and "
    "for the per-step efficiency E (default true; --notictac_measure_compute: TIC "
    "alone, installed within a second of the switch; tac always profiles).")
flags.DEFINE_enum(
    "tictac_align", DEFAULTS["align"], list(ALIGN_CHOICES),
    "How a PS shares its link among the workers of one step while it paces: on, each "
    "worker gets its k-th transfer before any gets its (k+1)-th (fewer stragglers); off, "
    "one worker after the other, which staggers their pulls, compute and gradient pushes "
    "(faster training when workers push while others still pull); auto (default): off "
    "for training, on for evaluate and predict.")
flags.DEFINE_string(
    "tictac_bandwidth", DEFAULTS["bandwidth"],
    "A PS link's rate, e.g. 10gbit, 25gbit or 3GB (bytes): the native gate paces each "
    "PS's egress at it and TAC times a transfer as its bytes over it. Give the PS NIC's "
    "line rate, not the payload rate a benchmark reports: pacing below the line rate "
    "leaves the link idle. Default: none, not paced (the bandwidth= argument wins).")
flags.register_validator(
    "tictac_bandwidth", lambda v: v is None or _rate_or_none(v) is not None,
    message="--tictac_bandwidth must be a rate like 10gbit, 25gbit or 3GB")
flags.DEFINE_integer(
    "tictac_stats_every", DEFAULTS["stats_every"],
    "Read step statistics from the parameter servers every N epochs (default 1).",
    lower_bound=1)


def setting(name: str, value: Any) -> Any:
    """The value to use for setting ``name``: the argument if given (not None), else the
    parsed ``--tictac_<name>`` flag, else the default."""
    if value is not None:
        return value
    flag_values = flags.FLAGS
    if flag_values.is_parsed() and ("tictac_" + name) in flag_values:
        return flag_values["tictac_" + name].value
    return DEFAULTS[name]


def _rate_or_none(text: str) -> float | None:
    from tictac_hooks.graph.cli import parse_rate
    try:
        return parse_rate(text)
    except ValueError:
        return None


def bandwidth(value: float | None) -> float | None:
    """A PS link's bytes/s: the argument if given, else the parsed --tictac_bandwidth
    rate, else None (not paced)."""
    rate = setting("bandwidth", value)
    return rate if rate is None or isinstance(rate, (int, float)) else _rate_or_none(rate)


def check_align(align: str) -> str:
    if align not in ALIGN_CHOICES:
        raise ValueError(f"align must be one of {', '.join(ALIGN_CHOICES)}, got {align!r}")
    return align


def check_algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHM_CHOICES:
        raise ValueError(
            f"unknown TicTac algorithm {algorithm!r}: use one of {', '.join(ALGORITHM_CHOICES)} "
            "(tic needs only the graph; tac also uses measured op times)")
    return algorithm
