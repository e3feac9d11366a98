"""Fixtures of the gate tests."""

import pytest


@pytest.fixture(scope="session")
def gate_library() -> str:
    """The C++ gate alone (no TensorFlow), built once. Skips only where no C++
    compiler is installed; a gate that does not compile fails the tests that need it."""
    from tictac_hooks.enforce.native.build import NativeBuildError, build, compiler
    try:
        compiler()
    except NativeBuildError as e:
        pytest.skip(f"no C++ toolchain for the native gate: {e}")
    return build(with_tensorflow=False, quiet=True).path
