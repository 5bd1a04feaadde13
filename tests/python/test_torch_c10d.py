"""torch's own c10d tests (test/distributed/test_c10d_gloo.py, from Debian's pytorch source
package of the torch that runs) with ringreduce in gloo's place: the tests that passed when the
whole file was run (docs/PYTHON.md, "torch's own c10d tests") must still pass.

The tests come from scripts/torch-c10d-tests --fetch, which puts them, and TORCH_VERSION, into
<build>/torch-c10d/; the adapter is torch_c10d/rr_as_gloo.py (loaded in every process by
torch_c10d/sitecustomize.py). torch_c10d/expected_pass_<version>.txt lists the passing tests;
those marked "*" run here (a few minutes: every test spawns its ranks afresh, and each imports
torch), all of them with RR_C10D_ALL=1. Skipped where the tests were not fetched, where the torch
that runs is not the one they belong to, or where the torch backend was not built.
"""

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import BUILD, PYDIR, have_module

HERE = Path(__file__).resolve().parent / "torch_c10d"
TESTS = BUILD / "torch-c10d"


def expected_passes():
    """(torch version, the tests to run): those marked "*" in expected_pass_<version>.txt, or
    all of them with RR_C10D_ALL=1."""
    torch = pytest.importorskip("torch")
    if not (TESTS / "test_c10d_gloo.py").exists():
        pytest.skip(f"torch's c10d tests are not in {TESTS}: scripts/torch-c10d-tests --fetch "
                    "(--suite sid or trixie) puts them there")
    version = (TESTS / "TORCH_VERSION").read_text().strip()
    if torch.__version__.split("+")[0] != version:
        pytest.skip(f"{TESTS} has torch {version}'s tests, this is torch {torch.__version__}")
    if not have_module("_torch_backend"):
        pytest.skip(f"the torch backend is not built in {BUILD}")
    listing = HERE / f"expected_pass_{version}.txt"
    if not listing.exists():
        pytest.skip(f"no list of torch {version}'s tests that pass ({listing})")
    tests = []
    for line in listing.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and (line.startswith("*") or os.environ.get("RR_C10D_ALL") == "1"):
            tests.append(line.lstrip("* "))
    return version, tests


def test_torch_c10d_gloo_tests_pass_with_ringreduce_in_gloos_place(tmp_path):
    version, tests = expected_passes()
    assert tests, "nothing to run"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(PYDIR), env.get("PYTHONPATH", "")])
    env["RR_C10D_AS_GLOO"] = "1"
    env.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120")
    env.setdefault("RINGREDUCE_TIMEOUT", "60")
    junit = tmp_path / "junit.xml"
    ids = [f"test_c10d_gloo.py::{t.replace('.', '::')}" for t in tests]
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                        "no:warnings", "-q", f"--junitxml={junit}", *ids],
                       cwd=TESTS, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120 * len(tests) + 60)
    assert junit.exists(), f"pytest wrote no results (exit {p.returncode}):\n{p.stdout[-6000:]}"
    outcome = {}
    for case in ET.parse(junit).iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}.{case.get('name')}"
        bad = [t for t in ("failure", "error", "skipped") if case.find(t) is not None]
        outcome[name] = bad[0] if bad else "passed"
    missing = [t for t in tests if t not in outcome]
    not_passed = {t: o for t, o in outcome.items() if o != "passed"}
    assert not missing and not not_passed, (
        f"torch {version}'s c10d tests that passed with ringreduce do not now: "
        f"{not_passed}, not run: {missing}\n{p.stdout[-8000:]}")
    assert re.search(rf"\b{len(tests)} passed\b", p.stdout), p.stdout[-4000:]
