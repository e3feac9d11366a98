"""Settings (run/settings.py): resolution (argument, else flag, else default), the
checks and their errors, which settings the user set, and what each gate backend makes
of those that reach its install: an explicit value it cannot honour is refused at
setup, naming the backend and the setting; a default resolves per backend."""

import pytest
from absl import flags

import tictac_hooks.flags as tictac_flags
from tictac_hooks.run.config import RunConfig
from tictac_hooks.run.controller import Controller
from tictac_hooks.run.settings import (Settings, TicTacSetupError, check_backends,
                                             honoured)
from tictac_hooks.enforce import inprocess
from tictac_hooks.enforce.api import UnhonouredSetting
from tictac_hooks.enforce.client import InstallError, install_plan
from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.dag import Graph, Op
from tictac_hooks.graph.schedule import Schedule

PS = "127.0.0.1:61101"
PROXY = ("proxy", {"pace_rate": "the proxy paces by its window", "align": "no link to share"})
NATIVE = ("native", {})


@pytest.fixture
def flag_values():
    """Parses the given command line into absl's flags; unparsed again afterwards."""
    def parse(*argv):
        flags.FLAGS(["prog", *argv])
    yield parse
    flags.FLAGS.unparse_flags()


def test_defaults_when_nothing_is_given_and_nothing_counts_as_set():
    s = Settings.resolve()
    for name in ("algorithm", "profile_steps", "log_dir", "skip_timeout", "stats_every",
                 "window_bytes", "check_rounds", "check_block_steps", "recheck_every",
                 "align"):
        assert getattr(s, name) == tictac_flags.DEFAULTS[name], name
    assert s.explicit == frozenset()


def test_arguments_are_checked_and_named_as_set():
    s = Settings.resolve(algorithm="tac", profile_steps=3, align="on", window_bytes=0)
    assert (s.algorithm, s.profile_steps, s.align, s.window_bytes) == ("tac", 3, "on", 0)
    assert s.explicit == {"algorithm", "profile_steps", "align", "window_bytes"}


def test_a_flag_given_on_the_command_line_counts_as_set_and_an_argument_wins(flag_values):
    flag_values("--tictac_align=off", "--tictac_profile_steps=9")
    s = Settings.resolve()
    assert (s.align, s.profile_steps) == ("off", 9)
    assert s.explicit == {"align", "profile_steps"}
    assert Settings.resolve(align="on").align == "on"
    # A parsed command line without the flag: its default, not set.
    flags.FLAGS.unparse_flags()
    flag_values()
    assert Settings.resolve().explicit == frozenset()


@pytest.mark.parametrize("kwargs, message", [
    (dict(algorithm="fifo"), "unknown TicTac algorithm 'fifo'"),
    (dict(profile_steps=0), "profile_steps"),
    (dict(log_dir=""), "log_dir must be a directory path"),
    (dict(log_dir=3), "log_dir must be a directory path"),
    (dict(skip_timeout=float("inf")), "skip_timeout"),
    (dict(window_bytes=-1), "window"),
    (dict(check_block_steps=2), "check_block_steps must be a whole number >= 3, or 0 or "
                                "'auto'"),
    (dict(check_block_steps="10"), "check_block_steps"),
    (dict(recheck_every=-1), "recheck_every"),
    (dict(align="sideways"), "align must be one of auto, on, off"),
])
def test_a_wrong_value_is_refused_naming_the_setting(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Settings.resolve(**kwargs)
    with pytest.raises(ValueError, match=message):
        Settings.check(**kwargs)


def test_check_leaves_unset_values_for_the_flag_or_default():
    assert Settings.check(align=None, profile_steps=4) == {"align": None, "profile_steps": 4}


def test_an_explicit_align_is_refused_by_a_backend_that_cannot_honour_it():
    s = Settings.resolve(align="on")
    with pytest.raises(TicTacSetupError) as e:
        check_backends(s, {"10.0.0.1:2222": NATIVE, "10.0.0.2:2222": PROXY})
    assert str(e.value) == (
        "align='on' was set (the align argument or --tictac_align), but the PS at "
        "10.0.0.2:2222 runs the proxy backend, which cannot honour align: no link to "
        "share. Leave align unset (auto: each backend does what it can), or run the PSes "
        "with the native backend (`tictac ps`, its default)")
    check_backends(s, {"10.0.0.1:2222": NATIVE})  # the native gate honours it


def test_a_default_or_auto_align_resolves_per_backend():
    check_backends(Settings.resolve(), {"a:1": PROXY})
    check_backends(Settings.resolve(align="auto"), {"a:1": PROXY})  # auto is no value
    # Only what every PS's backend honours reaches the install.
    assert honoured({"a:1": NATIVE}, pace_rate=1e6, align=True) == \
        {"pace_rate": 1e6, "align": True}
    assert honoured({"a:1": NATIVE, "b:1": PROXY}, pace_rate=1e6, align=False,
                    window_bytes=0) == {"pace_rate": None, "align": None, "window_bytes": 0}
    assert honoured({}, align=True) == {"align": True}  # not connected: as given


def _graph():
    return Graph([Op("a", "recv", channel="ps:0", bytes=10),
                  Op("b", "recv", channel="ps:0", bytes=20),
                  Op("c", "compute", ("a", "b"))])


def test_the_in_process_client_refuses_pacing_settings_instead_of_ignoring_them():
    gate = Gate(skip_after_s=5.0, window_bytes=0)
    schedule = Schedule("tic", ("a", "b"), {"a": 0, "b": 1})
    with inprocess.serve_in_process(PS, gate):
        client = inprocess.InProcessClient(PS, gate)
        for kwargs in (dict(pace_rate=1e6), dict(align=False)):
            with pytest.raises(UnhonouredSetting, match=f"the inprocess backend .*{PS}.* "
                                                        f"cannot honour {next(iter(kwargs))}"):
                client.install(schedule, **kwargs)
        with pytest.raises(InstallError, match="cannot honour align=True.*nothing was "
                                               "installed on any PS"):
            install_plan({PS: schedule}, align=True)
        assert inprocess.calls(PS)["install"] == 0 and gate.schedule_version is None
        assert client.install(schedule, skip_after_s=1.0, window_bytes=0).transfers == 2
        assert gate.schedule_version is not None


def test_controller_refuses_an_explicit_align_at_connect_and_runs_a_default_one():
    gate = Gate(skip_after_s=5.0, window_bytes=0)
    with inprocess.serve_in_process(PS, gate):
        c = Controller(RunConfig.build(Settings.resolve(align="off"), [PS]), verbose=False)
        with pytest.raises(TicTacSetupError, match=r"align='off' was set .* the PS at "
                                                   rf"{PS} runs the inprocess backend"):
            c.connect()
        assert c.cursor is None  # refused before any reading starts

        # The default (auto): the controller wants to pace and align (a bandwidth was
        # given), the in-process backend gets neither, and the install goes through.
        c = Controller(RunConfig.build(Settings.resolve(check_rounds=0), [PS],
                                       bandwidth=1e6), verbose=False)
        c.connect()
        assert c.backends[PS][0] == "inprocess"
        c.switch(_graph())
        assert (c.pace_rate, c.align) == (1e6, False)
        assert gate.summary()["algorithm"] == "tic"
        assert inprocess.calls(PS)["install"] == 1
        c.cursor.close()


def test_the_proxy_client_refuses_pacing_settings_before_it_sends_anything():
    from tictac_hooks.enforce.client import RendezvousClient
    from tictac_hooks.enforce.native.client import NativeClient
    schedule = Schedule("tic", ("a",), {"a": 0})
    with RendezvousClient("127.0.0.1:1", timeout_s=0.1) as client:  # nothing listens
        with pytest.raises(UnhonouredSetting, match=r"the proxy backend \(the PS at "
                                                    r"127\.0\.0\.1:1\) cannot honour "
                                                    r"pace_rate=1000\.0: the proxy paces"):
            client.install(schedule, pace_rate=1000.0)
    assert NativeClient.unhonoured == {}  # the native gate honours every setting
    with pytest.raises(TicTacSetupError) as e:
        check_backends(Settings.resolve(align="on"),
                       {"10.0.0.2:2222": ("proxy", RendezvousClient.unhonoured)})
    assert str(e.value) == (
        "align='on' was set (the align argument or --tictac_align), but the PS at "
        "10.0.0.2:2222 runs the proxy backend, which cannot honour align: the proxy does "
        "not pace at a link rate, so it has no link to share among the workers of a step. "
        "Leave align unset (auto: each backend does what it can), or run the PSes with "
        "the native backend (`tictac ps`, its default)")


def test_an_auto_block_is_0_or_auto_and_the_flag_takes_0_but_not_2(flag_values):
    assert Settings.resolve(check_block_steps="auto").check_block_steps == 0
    assert Settings.resolve(check_block_steps=0).check_block_steps == 0
    assert Settings.resolve(check_block_steps=12).check_block_steps == 12
    with pytest.raises(ValueError):
        Settings.resolve(check_block_steps=False)
    flag_values("--tictac_check_block_steps=0")
    assert Settings.resolve().check_block_steps == 0
    flags.FLAGS.unparse_flags()
    with pytest.raises(flags.IllegalFlagValueError, match="0 .chosen from the spread"):
        flag_values("--tictac_check_block_steps=2")
