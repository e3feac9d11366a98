"""Builds the native gate at first use, against the TensorFlow this process imports.

The library is tied to the exact TensorFlow build whose headers it was compiled
against, so it is cached per user under a key of everything that goes into it: the
TensorFlow version and build info, the compiler, the flags and the sources. A changed
TensorFlow, compiler or source gets a new key and so a rebuild, by itself. Concurrent
first uses build once (``flock``, which the OS releases when a builder dies); a build
writes a temporary file and renames it into place, so a build killed half-way leaves
nothing that a later load would pick up.

Cache: ``$TICTAC_NATIVE_CACHE`` or ``$XDG_CACHE_HOME/tictac-hooks/native`` (default
``~/.cache/tictac-hooks/native``), one folder per key holding the library and
``build.json`` (what it was built against).

Example:
  from tictac_hooks.enforce.native.build import build
  info = build()            # BuildInfo(path=..., cached=True, ...)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
# Every .cc and .h of this folder, each named once: what is compiled, and what the cache
# key hashes (tests/enforce/test_native.py checks that none is left out).
GATE_SOURCES = ("gate.cc", "gate_channels.cc", "gate_pacing.cc", "gate_records.cc",
                "control.cc", "capi.cc")
PLUGIN_SOURCES = GATE_SOURCES + ("tf_server.cc", "delay_op.cc")
HEADERS = ("gate.h", "gate_internal.h", "control.h")
LIBRARY = "libtictac_native.so"
GATE_LIBRARY = "libtictac_gate.so"  # the gate alone, no TensorFlow (conformance tests)
COMMON_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-w")


class NativeBuildError(OSError):
    """The native gate could not be built or loaded; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """Where the library is and what it was built against."""

    path: str
    key: str
    tf_version: str
    compiler: str
    cached: bool
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def cache_root() -> str:
    explicit = os.environ.get("TICTAC_NATIVE_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tictac-hooks", "native")


def compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise NativeBuildError(
            f"no C++ compiler {cxx!r} on PATH: the native TicTac gate is compiled against "
            "your TensorFlow at first use. Install one (Debian/Ubuntu: `apt-get install "
            "g++`; RHEL/Fedora: `dnf install gcc-c++`), set CXX, or run the PS with "
            "`tictac ps --backend proxy`")
    return cxx


def _compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeBuildError(f"cannot run the C++ compiler {cxx!r}: {e}") from None
    return (out.stdout.splitlines() or [cxx])[0]


def tf_flags() -> tuple[list[str], list[str], str, str]:
    """(compile flags, link flags, TF version, TF build info) of the imported TensorFlow."""
    import tensorflow as tf

    include = tf.sysconfig.get_include()
    if not os.path.isfile(os.path.join(include, "tensorflow", "core", "distributed_runtime",
                                       "rpc", "grpc_server_lib.h")):
        raise NativeBuildError(
            f"TensorFlow {tf.__version__} at {os.path.dirname(include)} ships no C++ "
            "headers for its gRPC server (tensorflow/include/.../grpc_server_lib.h); "
            "install the official wheel (`pip install tensorflow-cpu` or `tensorflow`), "
            "or run the PS with `tictac ps --backend proxy`")
    lib_dir = tf.sysconfig.get_lib()
    cflags = list(tf.sysconfig.get_compile_flags()) + [
        f"-I{include}/external/com_github_grpc_grpc/include",
        f"-I{include}/external/com_google_protobuf/src",
        f"-I{include}/external/farmhash_archive/src"]
    # Resolve every symbol at link time: a header/library mismatch fails the build with
    # the missing name, not the first load.
    lflags = [f"-L{lib_dir}", "-l:libtensorflow_framework.so.2", "-l:libtensorflow_cc.so.2",
              f"-Wl,-rpath,{lib_dir}", "-Wl,--no-undefined"]
    info = json.dumps(dict(tf.sysconfig.get_build_info()), sort_keys=True, default=str)
    return cflags, lflags, tf.__version__, info


def _key(parts: Sequence[str], sources: Sequence[str]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() + b"\0")
    for name in sorted(set(sources) | set(HEADERS)):
        with open(os.path.join(HERE, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:20]


def build(force: bool = False, with_tensorflow: bool = True, quiet: bool = False,
          cache: str | None = None) -> BuildInfo:
    """Builds (or finds in the cache) the native library and returns where it is.

    Args:
      force: rebuild even when the cache has it.
      with_tensorflow: the PS plugin (default); False builds the gate alone, without
        TensorFlow (for the conformance tests: seconds instead of half a minute).
      quiet: no progress line on stderr.
      cache: the cache folder (default :func:`cache_root`).
    """
    cxx = compiler()
    version = _compiler_version(cxx)
    if with_tensorflow:
        cflags, lflags, tf_version, tf_info = tf_flags()
        sources, target = PLUGIN_SOURCES, LIBRARY
    else:
        cflags, lflags, tf_version, tf_info = [], [], "", ""
        sources, target = GATE_SOURCES, GATE_LIBRARY
    flags = [*COMMON_FLAGS, *cflags]
    key = _key([target, tf_version, tf_info, version, *flags, *lflags], sources)
    folder = os.path.join(cache or cache_root(), key)
    path = os.path.join(folder, target)
    if os.path.isfile(path) and not force:
        return BuildInfo(path, key, tf_version, version, True, 0.0)
    os.makedirs(folder, exist_ok=True)
    start = time.monotonic()
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the OS if this process dies
        if os.path.isfile(path) and not force:  # another process built it meanwhile
            return BuildInfo(path, key, tf_version, version, True, 0.0)
        if not quiet:
            print(f"[tictac] building the native gate for TensorFlow {tf_version or '(none)'} "
                  f"into {folder} (once; about half a minute)", file=sys.stderr, flush=True)
        tmp = os.path.join(folder, f".{target}.{os.getpid()}.tmp")
        # Each source compiles to its object on a core of its own, then one link: the
        # first use waits for the slowest source, not for all of them in turn. A
        # builder killed half-way leaves its objects folder; the next build removes it.
        for stale in os.listdir(folder):
            if stale.startswith(".objects."):
                shutil.rmtree(os.path.join(folder, stale), ignore_errors=True)
        objects_dir = os.path.join(folder, f".objects.{os.getpid()}")
        os.makedirs(objects_dir)
        objects = [os.path.join(objects_dir, os.path.splitext(s)[0] + ".o") for s in sources]
        commands = [[cxx, *flags, "-c", os.path.join(HERE, s), "-o", o]
                    for s, o in zip(sources, objects)]
        link = [cxx, *flags, "-o", tmp, *objects, *lflags]
        try:
            _run_all(commands, tf_version)
            _run_all([link], tf_version)
        except NativeBuildError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            shutil.rmtree(objects_dir, ignore_errors=True)
        argv = commands + [link]
        os.replace(tmp, path)  # atomic: a load sees the whole library or none
        seconds = time.monotonic() - start
        info = BuildInfo(path, key, tf_version, version, False, seconds)
        with open(os.path.join(folder, "build.json"), "w") as f:
            json.dump(info.to_json() | {"argv": argv, "tf_build_info": tf_info}, f, indent=1)
        return info


def _run_all(commands: Sequence[Sequence[str]], tf_version: str) -> None:
    """Runs the compiler ``commands`` at once, as many as there are cores; raises
    NativeBuildError with the first failure's errors."""
    from concurrent.futures import ThreadPoolExecutor

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(list(argv), capture_output=True, text=True)
        except OSError as e:
            raise NativeBuildError(f"cannot run {argv[0]!r}: {e}") from None
    with ThreadPoolExecutor(max(1, min(len(commands), os.cpu_count() or 1))) as pool:
        done = list(pool.map(run, commands))
    for proc in done:
        if proc.returncode != 0:
            tail = "\n".join(line for line in proc.stderr.splitlines()
                             if "error" in line or "undefined" in line)[-3000:]
            raise NativeBuildError(
                f"building the native TicTac gate against TensorFlow {tf_version or '(none)'} "
                f"failed ({proc.args[0]}, exit {proc.returncode}):\n"
                f"{tail or proc.stderr[-3000:]}\n"
                "This TensorFlow's C++ server API may differ from the tested one (2.21); "
                "run the PS with `tictac ps --backend proxy` meanwhile")


_LOADED: list[Any] = []  # [op module, path] of the one library this process loaded


def loaded_path() -> str | None:
    """The file of the TicTac library this process loaded, if any."""
    return _LOADED[1] if _LOADED else None


def load(force_build: bool = False) -> Any:
    """Builds if needed and loads the plugin into this process; returns the op module
    (``tictac_control``). Loading registers the server protocol ``grpc+tictac``.

    A process loads one build only, and keeps it: TensorFlow registers an op name once,
    so a second library (say, rebuilt because the sources changed while the process
    ran) would load without ops of its own."""
    if _LOADED and not force_build:
        return _LOADED[0]
    info = build(force=force_build)
    import tensorflow as tf

    try:
        module = tf.load_op_library(info.path)
    except Exception as e:  # noqa: BLE001 - TF raises NotFoundError for dlopen failures
        raise NativeBuildError(
            f"loading the native TicTac gate {info.path} (built for TensorFlow "
            f"{info.tf_version}) into TensorFlow {tf.__version__} failed: {e}. Rebuild "
            "it with `tictac build --force`, or run the PS with `tictac ps --backend "
            "proxy`") from None
    if not hasattr(module, "tictac_control"):
        raise NativeBuildError(
            f"{info.path} loaded without its TictacControl op: this process already "
            "loaded another build of the TicTac library; restart it")
    _LOADED[:] = [module, info.path]
    return module
