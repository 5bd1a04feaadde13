"""Errors reach Python on every rank, as the C++ classes' Python mirrors with the same messages
(workers/errors.py)."""

import pytest

from conftest import have_module, launch

N = 4


def raised(lines):
    out = {}
    for rank, ls in lines.items():
        got = [l for l in ls if l.startswith("RAISED ") or l == "NO ERROR"]
        assert len(got) == 1, f"rank {rank}: {ls}"
        out[rank] = got[0]
    return out


def test_mismatched_call_raises_on_every_rank():
    _, lines, _ = launch(N, "errors.py", "mismatch")
    assert sorted(raised(lines)) == list(range(N))
    for rank, line in raised(lines).items():
        assert line.startswith("RAISED ringreduce.MismatchError "), line
        assert f"rank {rank}: allreduce #1 (float x {100 + (rank == 1)}, sum)" in line, line
        assert "mismatched call: rank " in line, line


def test_bad_root_raises_invalid_argument_and_the_communicator_goes_on():
    _, lines, _ = launch(N, "errors.py", "bad_root")
    for rank, line in raised(lines).items():
        assert line == (f"RAISED ringreduce.InvalidArgument peer=None rank {rank}: broadcast: "
                        f"root {N} is not a rank (size {N})"), line
        assert f"AFTER {[float(N)] * 3}" in lines[rank], lines[rank]


def test_ctrl_c_in_a_blocking_call_raises_keyboard_interrupt_and_aborts_the_peers():
    _, lines, out = launch(2, "errors.py", "sigint", timeout=60)
    got = [l for l in lines.get(0, []) if l.startswith("INTERRUPTED ")]
    assert got, f"rank 0 did not raise KeyboardInterrupt:\n{out[-3000:]}"
    # Within 100 ms of the signal here; the bound leaves room for a loaded machine.
    assert float(got[0].split()[1]) < 1.0, got[0]
    r1 = [l for l in lines.get(1, []) if l.startswith("RAISED ")]
    assert r1 and "rank 0" in r1[0] and "interrupted" in r1[0], f"rank 1: {lines.get(1)}"


@pytest.mark.parametrize("elements", [65536, 16])
def test_ctrl_c_in_a_torch_collective_raises_keyboard_interrupt_and_aborts_the_peers(elements):
    # 65536 floats wait in the Work's wait(); 16 run inline, in the call itself.
    pytest.importorskip("torch")
    if not have_module("_torch_backend"):
        pytest.skip("the torch backend was not built")
    _, lines, out = launch(2, "errors.py", "torch_sigint", str(elements), timeout=90)
    got = [l for l in lines.get(0, []) if l.startswith("INTERRUPTED ")]
    assert got, f"rank 0 did not raise KeyboardInterrupt:\n{out[-3000:]}"
    assert float(got[0].split()[1]) < 1.0, got[0]
    r1 = [l for l in lines.get(1, []) if l.startswith("RAISED ")]
    assert r1 and "rank 0" in r1[0] and "interrupted" in r1[0], f"rank 1: {lines.get(1)}"
    # The large allreduce itself fails on rank 1 (and the barrier after it).
    assert len(r1) == 2 or (elements == 16 and len(r1) == 1), r1


def test_dead_peer_raises_peer_error_naming_it():
    _, lines, _ = launch(N, "errors.py", "dead_peer")
    got = raised({r: ls for r, ls in lines.items() if r != 1})
    assert sorted(got) == [0, 2, 3]
    for rank, line in got.items():
        assert line.startswith("RAISED ringreduce.PeerError peer=1 "), line
        assert f"rank {rank}: allreduce #2 " in line, line


def raised_through_torch(case):
    """Runs an errors.py case over the torch backend; every rank's RAISED line, by rank."""
    pytest.importorskip("torch")
    if not have_module("_torch_backend"):
        pytest.skip("the torch backend was not built")
    _, lines, _ = launch(N, "errors.py", case)
    got = raised(lines)
    assert sorted(got) == list(range(N))
    return got


def test_mismatch_through_torch_distributed_raises_on_every_rank():
    for rank, line in raised_through_torch("torch_mismatch").items():
        assert line.startswith("RAISED ringreduce.MismatchError "), line
        assert "mismatched call" in line and f"rank {rank}: allreduce #2" in line, line  # after a barrier


def test_size_mismatch_of_a_send_through_torch_raises_on_every_rank():
    for rank, line in raised_through_torch("torch_p2p_size").items():
        assert line.startswith("RAISED ringreduce.MismatchError "), line
        # rank 1 raises it; the others hear it from rank 1 at the barrier (rank 0 may already
        # have returned from its eager send)
        assert "rank 1: recv from rank 0 (tag 3, 800 bytes): rank 0 sent 400 bytes" in line, line
        assert line.split(" peer=")[1].split(" ", 1)[1].startswith(f"rank {rank}: "), line
