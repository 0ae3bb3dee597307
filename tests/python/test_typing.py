"""The type stubs (python/microscale/*.pyi) pass mypy --strict on ordinary use: typing_usage.py
always, typing_usage_torch.py where torch is installed. Skipped where mypy is not installed."""

import importlib.util
import os
import site
import subprocess
import sys

import pytest

import microscale

HERE = os.path.dirname(os.path.abspath(__file__))


def _mypy(path):
    pytest.importorskip("mypy", reason="mypy is not installed: the stub check needs it")
    env = dict(os.environ)
    # A package imported from a source checkout (PYTHONPATH) is found through MYPYPATH; an
    # installed one through its py.typed marker (mypy refuses site-packages in MYPYPATH).
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(microscale.__file__)))
    installed = {os.path.abspath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}
    if pkg_parent not in installed:
        env["MYPYPATH"] = pkg_parent
    cmd = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable",
           sys.executable, path]
    run = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert os.path.isfile(os.path.join(os.path.dirname(microscale.__file__), "py.typed"))


def test_stubs_numpy_usage():
    _mypy("typing_usage.py")


def test_stubs_torch_usage():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: microscale.torch's stubs need it")
    _mypy("typing_usage_torch.py")
