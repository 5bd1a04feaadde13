"""Shared by the Python tests: where the build is, and launching N ranks of a worker script.

Every multi-rank test runs a worker under ringrun (bounded by ringrun's --timeout and by
subprocess's timeout, which kills ringrun; ringrun tears its ranks down by process group) and
checks what the ranks printed. The build is <repo>/build unless RINGREDUCE_BUILD says otherwise.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("RINGREDUCE_BUILD", REPO / "build"))
WORKERS = Path(__file__).resolve().parent / "workers"
RINGRUN = BUILD / "tools" / "ringrun"
PYDIR = BUILD / "python"


def have_module(name):
    """Whether the build has the module. One its configuration set out to build
    (<build>/python/expected_modules.txt, python/CMakeLists.txt) but that is missing is a
    failed build: the test fails saying so, rather than skip as it does where the module was
    never meant to be built (no pybind11, no libtorch)."""
    present = any((PYDIR / "ringreduce").rglob(name + ".*.so")) if PYDIR.exists() else False
    expected = PYDIR / "expected_modules.txt"
    if not present and expected.exists() and name in expected.read_text().split():
        pytest.fail(f"{name} should have been built in {BUILD} (its configuration builds it: "
                    f"{expected}) but is not there: the build failed or was not run",
                    pytrace=False)
    return present


def rank_env():
    """The environment of a rank: the build's package first on PYTHONPATH, its location in
    RINGREDUCE_BUILD (for the examples), a 60 s timeout unless one is set, faulthandler on."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(PYDIR) + os.pathsep + e.get("PYTHONPATH", "")
    e["RINGREDUCE_BUILD"] = str(BUILD)
    e.setdefault("RINGREDUCE_TIMEOUT", "60")
    # A rank that dies on a signal (SIGABRT from std::terminate, SIGSEGV) prints every thread's
    # Python stack: where it was, even when the crash is timing-dependent and seen once.
    e.setdefault("PYTHONFAULTHANDLER", "1")
    return e


def final_values(out, rank):
    """The key=value pairs of the examples' last line, "final: k=v ...", as rank `rank` printed
    it (under ringrun, with its "[rank] " prefix; alone, without)."""
    m = re.search(rf"^(?:\[{rank}\] )?final: (.*)$", out, re.M)
    assert m, f"no 'final:' line in the output:\n{out[-4000:]}"
    return dict(kv.split("=", 1) for kv in m.group(1).split())


def launch(n, worker, *args, timeout=120, env=None, expect_ok=True, elastic=False):
    """Runs `ringrun -n n python worker args` (with --elastic: a rank's death does not end the
    job); returns (returncode, {rank: [lines]}, output)."""
    if not RINGRUN.exists() or not have_module("_ringreduce"):
        pytest.skip(f"ringreduce not built in {BUILD} (run scripts/test or scripts/demo)")
    e = rank_env()
    if env:
        e.update(env)
    cmd = [str(RINGRUN), "-n", str(n), "--timeout", str(timeout), *(["--elastic"] if elastic else []),
           sys.executable, str(WORKERS / worker), *map(str, args)]
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout + 30)
    lines = {}
    for line in p.stdout.splitlines():
        if line.startswith("[") and "] " in line:
            rank, rest = line[1:].split("] ", 1)
            if rank.isdigit():
                lines.setdefault(int(rank), []).append(rest)
    if expect_ok:
        assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-6000:]}"
    return p.returncode, lines, p.stdout
