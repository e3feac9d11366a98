"""The native gate's build and its reach into TensorFlow: the headers still have the API
tf_server.cc uses, the plugin builds and loads, and the build cache holds up (a hit, a
rebuild on a changed source, one build for two concurrent first uses, nothing left
blocking after a build killed half-way, an actionable error without a compiler)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tictac_hooks.enforce.native import build as native_build
from tictac_hooks.enforce.native.build import NativeBuildError, build

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_tensorflow_headers_have_the_api_the_plugin_uses(tmp_path):
    pytest.importorskip("tensorflow")
    from tictac_hooks.patches.tf_grpc_server import TensorFlowServerApiError, check_headers

    check_headers()
    import tensorflow as tf
    # A TensorFlow whose GrpcWorker lost the virtual hook: named in the error.
    include = tmp_path / "include"
    shutil.copytree(tf.sysconfig.get_include() + "/tensorflow/core/distributed_runtime",
                    include / "tensorflow/core/distributed_runtime")
    header = include / "tensorflow/core/distributed_runtime/rpc/grpc_worker_service.h"
    header.write_text(header.read_text().replace("virtual void GrpcRecvTensorAsync",
                                                 "void GrpcRecvTensorAsync"))
    with pytest.raises(TensorFlowServerApiError, match="GrpcRecvTensorAsync.*--backend proxy"):
        check_headers(str(include))


@pytest.mark.slow
def test_the_plugin_builds_and_loads_against_this_tensorflow():
    tf = pytest.importorskip("tensorflow")
    info = build()
    assert os.path.isfile(info.path) and info.tf_version == tf.__version__
    recorded = json.load(open(os.path.join(os.path.dirname(info.path), "build.json")))
    assert recorded["tf_version"] == tf.__version__ and recorded["key"] == info.key
    module = native_build.load()
    assert hasattr(module, "tictac_control")
    # Loaded in a process that runs no grpc+tictac server: ping says it cannot enforce.
    assert json.loads(module.tictac_control("ping", "").numpy())["enforcing"] is False
    out = subprocess.run([sys.executable, "-m", "tictac_hooks.cli", "build"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["path"] == info.path and "cached" in out.stderr


@pytest.mark.slow
def test_second_use_is_a_cache_hit_and_a_changed_source_rebuilds(tmp_path, monkeypatch):
    first = build(with_tensorflow=False, quiet=True, cache=str(tmp_path))
    assert not first.cached
    again = build(with_tensorflow=False, quiet=True, cache=str(tmp_path))
    assert again.cached and again.path == first.path
    src = tmp_path / "src"
    shutil.copytree(native_build.HERE, src, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (src / "gate.cc").write_text((src / "gate.cc").read_text() + "\n// changed\n")
    monkeypatch.setattr(native_build, "HERE", str(src))
    changed = build(with_tensorflow=False, quiet=True, cache=str(tmp_path))
    assert not changed.cached and changed.key != first.key


def test_every_source_and_header_is_compiled_and_keyed(tmp_path, monkeypatch):
    """Each .cc is compiled and each .cc and .h is in the cache key: a file left out
    of build.py's lists would not be built, or would not rebuild when it changed."""
    here = native_build.HERE
    on_disk = {n for n in os.listdir(here) if n.endswith((".cc", ".h"))}
    assert set(native_build.PLUGIN_SOURCES) == {n for n in on_disk if n.endswith(".cc")}
    assert set(native_build.HEADERS) == {n for n in on_disk if n.endswith(".h")}
    assert "tf_server.cc" not in native_build.GATE_SOURCES  # the gate alone: no TensorFlow
    src = tmp_path / "src"
    shutil.copytree(here, src, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(native_build, "HERE", str(src))
    sources = native_build.PLUGIN_SOURCES
    keys = {native_build._key(["x"], sources)}
    for name in sorted(on_disk):
        (src / name).write_text((src / name).read_text() + "\n// changed\n")
        keys.add(native_build._key(["x"], sources))
    assert len(keys) == len(on_disk) + 1  # every change, a new key


_BUILD_CHILD = ("import json, sys; from tictac_hooks.enforce.native.build import build; "
                "print(json.dumps(build(with_tensorflow=False, quiet=True, "
                "cache=sys.argv[1]).to_json()))")


@pytest.mark.slow
def test_two_concurrent_first_uses_build_once(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD_CHILD, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, cwd=REPO) for _ in range(2)]
    results = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(r["cached"] for r in results) == [False, True], results
    assert results[0]["path"] == results[1]["path"]


@pytest.mark.slow
def test_a_build_killed_half_way_leaves_nothing_that_blocks_the_next(tmp_path):
    # A compiler killed mid-build leaves its own temporary files behind (gcc's *.s):
    # give it a TMPDIR of this test's, removed with it.
    scratch = tmp_path / "compiler-tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _BUILD_CHILD, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
                            env=dict(os.environ, TMPDIR=str(scratch)))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(tmp_path.glob("*/.lock")):
        time.sleep(0.02)
    # The lock is held and the compiler runs (about 5 s for the gate alone): kill the
    # builder and its compiler mid-build, or the moment the output file appears.
    until = time.monotonic() + 1.0
    while time.monotonic() < until and not list(tmp_path.glob("*/.*.tmp")):
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert not list(tmp_path.glob("*/libtictac_gate.so"))  # no half library in place
    info = build(with_tensorflow=False, quiet=True, cache=str(tmp_path))
    assert not info.cached and os.path.getsize(info.path) > 0
    # the killed builder's objects (each source compiles on a core of its own) are gone
    assert not list(tmp_path.glob("*/.objects.*")), list(tmp_path.glob("*/.*"))
    from tictac_hooks.enforce.native.cgate import CGate
    CGate.alone(info.path).close()  # it loads


def test_no_compiler_gives_an_actionable_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(NativeBuildError, match="apt-get install g\\+\\+.*--backend proxy"):
        build(with_tensorflow=False, quiet=True, cache=str(tmp_path))


def test_a_process_keeps_the_library_it_loaded_when_the_sources_change(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow")
    module = native_build.load()
    path = native_build.loaded_path()
    # The package is updated under a running job: a later load must not build and load
    # a second library (its op would already be registered, its module empty).
    monkeypatch.setattr(native_build, "build", lambda **kw: pytest.fail("rebuilt"))
    assert native_build.load() is module and native_build.loaded_path() == path


def test_a_schedule_over_the_install_limit_is_refused_before_it_is_sent(monkeypatch):
    """The native client checks the size of its install request before running the
    control op (issue #14.6), as the proxy's client does."""
    pytest.importorskip("tensorflow")
    import socket

    from tictac_hooks.enforce import api
    from tictac_hooks.enforce.native.client import NativeClient
    from tictac_hooks.graph.schedule import Schedule, ScheduleError
    monkeypatch.setattr(api, "MAX_INSTALL_BYTES", 1 << 20)
    s = socket.create_server(("127.0.0.1", 0))
    nobody = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens: a request sent would fail with "cannot reach"
    schedule = Schedule.from_order("tic", [f"model/layer/kernel/ReadVariableOp/{i:026d}"
                                           for i in range(20_000)])
    with NativeClient(nobody, timeout_s=5, device="/job:ps/replica:0/task:0") as client:
        with pytest.raises(ScheduleError, match=(
                rf"the schedule for {nobody} is too large to install: 20000 transfers "
                r"encode to 1\.\d MiB, over the limit of 1 MiB per install")):
            client.install(schedule)


def test_a_gate_error_run_in_a_graph_keeps_the_gates_own_words():
    from tictac_hooks.enforce.native.client import gate_message
    wrapped = ("Graph execution error:\n\nDetected at node 'TictacControl' defined at (most "
               "recent call last):\n    File \"x.py\", line 6, in <module>\nNode: "
               "'TictacControl'\nFrom /job:ps/replica:0/task:0:\npriority 5 of a is not in "
               "[0, 1)\n\t [[{{node TictacControl}}]]")
    assert gate_message(wrapped) == "priority 5 of a is not in [0, 1)"
    assert gate_message("order line 2: not sorted") == "order line 2: not sorted"
    assert gate_message("Graph execution error:\n\nsomething else") == "something else"
