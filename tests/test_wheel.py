"""What ``pip install .`` ships (issue #55): every module of the package, the native
gate's sources and the built-in profiles; not the lab (benchmarks/, its research probes)
nor anything else of the repository. The wheel is built here (about a second)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    """Built from a copy of what the package is made of (a build in the working tree
    would leave build/ there, and a stale build/lib could ship moved modules)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("tictac_hooks", "patches"):
        shutil.copytree(os.path.join(ROOT, name), src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                          "--no-build-isolation", str(src), "-w", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (path,) = glob.glob(str(out / "*.whl"))
    return zipfile.ZipFile(path).namelist()


def _source_modules() -> set[str]:
    found = set()
    for base, prefix in ((os.path.join(ROOT, "tictac_hooks"), "tictac_hooks"),
                         (os.path.join(ROOT, "patches"), "tictac_hooks/patches")):
        for path in glob.glob(os.path.join(base, "**", "*.py"), recursive=True):
            found.add(prefix + "/" + os.path.relpath(path, base).replace(os.sep, "/"))
    return found


def test_the_wheel_ships_every_module_the_gate_sources_and_the_profiles(wheel_names):
    names = set(wheel_names)
    missing = _source_modules() - names
    assert not missing, f"modules not in the wheel: {sorted(missing)}"
    assert {"tictac_hooks/enforce/native/gate.cc", "tictac_hooks/enforce/native/gate.h",
            "tictac_hooks/graph/profiles/resnet50.json.gz"} <= names


def test_the_wheel_leaves_the_lab_and_the_repository_out(wheel_names):
    tops = {n.split("/")[0] for n in wheel_names}
    assert all(t == "tictac_hooks" or t.endswith(".dist-info") for t in tops), tops
    lab = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "benchmarks", "lab",
                                                               "*.py"))} - {"__init__.py"}
    assert lab, "benchmarks/lab/ has no modules: the check below would be empty"
    shipped = {os.path.basename(n) for n in wheel_names}
    assert not lab & shipped, f"lab modules in the wheel: {sorted(lab & shipped)}"
