"""torch 2.14's fault-tolerance contract on the backend (workers/torch_fault.py, under ringrun
--elastic): the supports_* answers, shrink_group after a SIGKILL with both flags, reconfigure
from handles before and after a SIGKILL, split_group, get_error, set_timeout, abort hooks; and
examples/train_elastic.py killed, shrunk and given a replacement, against its undisturbed run.
Skipped where torch has no such contract (1.13, 2.6: docs/PYTHON.md says what each has)."""

import pytest

from conftest import have_module, launch


def fault_tolerant_torch():
    torch = pytest.importorskip("torch")
    if not have_module("_torch_backend"):
        pytest.skip("the torch backend was not built")
    import torch.distributed as dist

    if not hasattr(dist, "shrink_group") or not hasattr(dist, "_reconfigure"):
        pytest.skip(f"torch {torch.__version__} has no shrink_group/_reconfigure (2.14 has)")


def facts(lines, rank, key):
    got = [l for l in lines.get(rank, []) if l.startswith(key + " ") or l == key]
    assert got, f"rank {rank} printed no {key}: {lines.get(rank)}"
    return got[0]


def test_surface_supports_split_timeout_error_and_abort_hooks():
    fault_tolerant_torch()
    _, lines, out = launch(4, "torch_fault.py", "surface", elastic=True, timeout=90)
    for r in range(4):
        assert facts(lines, r, "SUPPORTS") == "SUPPORTS splitting=True shrinking=True reconfigure=True"
        assert facts(lines, r, "ERROR_BEFORE").endswith("SUCCESS"), lines[r]
    for r in (0, 1):
        assert facts(lines, r, "SPLIT") == "SPLIT size=2 rank=%d sum=2.0" % r, lines[r]
    # torch's dist.split_group refuses a CPU-only default group before it reaches any backend
    # (gloo's alike): said here, so that a torch that lets it through is noticed.
    split = facts(lines, 0, "DIST_SPLIT")
    assert split == "DIST_SPLIT ok" or "No device associated" in split, split
    timed = facts(lines, 0, "TIMED_OUT")
    assert "TimeoutError" in timed or "DistBackendError" in timed or "RuntimeError" in timed, timed
    assert float(timed.split("after=")[1].split()[0]) < 3.0, timed
    after = facts(lines, 0, "ERROR_AFTER")
    assert "TIMEOUT" in after and after.endswith("hooked=1"), after


@pytest.mark.parametrize("flag", ["default", "abort"])
def test_shrink_group_after_a_sigkill(flag):
    fault_tolerant_torch()
    rc, lines, out = launch(4, "torch_fault.py", "shrink", flag, elastic=True, timeout=90,
                            expect_ok=False)
    assert rc == 0, out[-4000:]
    for r in (0, 1, 3):
        assert "rank 2" in facts(lines, r, "FAILED"), lines[r]
        assert facts(lines, r, "GET_ERROR").split()[-1] in ("ErrorType.REMOTE_ERROR",
                                                            "ErrorType.COMM_ERROR"), lines[r]
        shrunk = facts(lines, r, "SHRUNK")
        assert f"size=3 rank={[0, 1, 3].index(r)} default=True" in shrunk, shrunk
        exact = facts(lines, r, "EXACT")
        assert exact.startswith("EXACT 7.0 "), exact
        # From the kill to the first exact collective on the shrunk group.
        assert float(exact.split("after=")[1]) < 2.0, exact


def test_reconfigure_from_handles_before_and_after_a_sigkill():
    fault_tolerant_torch()
    rc, lines, out = launch(4, "torch_fault.py", "reconfigure", elastic=True, timeout=90,
                            expect_ok=False)
    assert rc == 0, out[-4000:]
    for r in range(4):
        assert "has no members yet" in facts(lines, r, "BEFORE"), lines[r]
        assert facts(lines, r, "CONFIGURED") == f"CONFIGURED size=4 rank={r} sum=10.0", lines[r]
    for r in (0, 1, 2):
        again = facts(lines, r, "RECONFIGURED")
        assert f"size=3 rank={r} sum=6.0" in again, again
        assert float(again.split("after=")[1].split()[0]) < 3.0, again
        assert "was used before" in facts(lines, r, "REUSED"), lines[r]


def run_elastic_example(*args, elastic=True):
    """examples/train_elastic.py under ringrun (--elastic), 4 ranks; its final lines by rank."""
    import subprocess
    import sys

    from conftest import REPO, RINGRUN, rank_env

    cmd = [str(RINGRUN), "-n", "4", "--timeout", "240", *(["--elastic"] if elastic else []),
           sys.executable, str(REPO / "examples" / "train_elastic.py"), *args]
    p = subprocess.run(cmd, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-5000:]}"
    finals = [dict(kv.split("=", 1) for kv in l.split("final: ", 1)[1].split())
              for l in p.stdout.splitlines() if "final: " in l]
    return finals, p.stdout


def test_elastic_example_shrinks_and_takes_a_replacement_within_the_undisturbed_accuracy():
    fault_tolerant_torch()
    pytest.importorskip("sklearn")
    plain, _ = run_elastic_example(elastic=False)
    shrunk, out_s = run_elastic_example("--kill-step", "40")
    replaced, out_r = run_elastic_example("--kill-step", "40", "--replace")
    base = float(plain[0]["test_accuracy"])
    assert len(plain) == 4 and {f["world"] for f in plain} == {"4"}
    # Shrunk: three ranks finish, at N - 1, with one model, within 0.02 of the undisturbed run.
    assert len(shrunk) == 3 and {f["world"] for f in shrunk} == {"3"}, out_s[-3000:]
    assert len({f["param_sum"] for f in shrunk}) == 1, shrunk
    assert abs(float(shrunk[0]["test_accuracy"]) - base) <= 0.02, (shrunk, base)
    assert "recovered: " in out_s and "shrunk after=" in out_s, out_s[-3000:]
    # Replaced: back at N, the newcomer included, every rank with the same model.
    assert len(replaced) == 4 and {f["world"] for f in replaced} == {"4"}, out_r[-3000:]
    assert len({f["param_sum"] for f in replaced}) == 1, replaced
    assert abs(float(replaced[0]["test_accuracy"]) - base) <= 0.02, (replaced, base)
    assert "joined: rank 3 of 4" in out_r, out_r[-3000:]
