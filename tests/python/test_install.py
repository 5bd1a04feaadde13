"""The package works from the build tree (every other test) and after `cmake --install`: installed
into a fresh prefix, imported with only that prefix's dist-packages on the path, it finds
libringreduce.so through its RPATH and runs a one-rank communicator."""

import os
import subprocess
import sys

import pytest

from conftest import BUILD, have_module


def test_cmake_install_then_import(tmp_path):
    if not have_module("_ringreduce"):
        pytest.skip(f"ringreduce not built in {BUILD}")
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    site = list(prefix.glob("lib/python3*/dist-packages"))
    assert len(site) == 1, list(prefix.rglob("*"))[:20]
    # The type stubs and py.typed come along (PEP 561).
    pkg = site[0] / "ringreduce"
    for f in ("py.typed", "__init__.pyi", "_ringreduce.pyi", "torch/__init__.pyi"):
        assert (pkg / f).exists(), f
    code = ("import numpy as np, ringreduce\n"
            "c = ringreduce.Communicator(rank=0, size=1, addr='127.0.0.1:1')\n"
            "a = np.arange(4.0); c.allreduce(a, op='max'); c.close()\n"
            "print(ringreduce.__file__, a.tolist())\n")
    if have_module("_torch_backend"):
        code = "import ringreduce.torch\n" + code
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGREDUCE_", "PYTHON"))}
    env["PYTHONPATH"] = str(site[0])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(site[0])), out.stdout
    assert out.stdout.split(" ", 1)[1].strip() == "[0.0, 1.0, 2.0, 3.0]"
