"""Keeping a job alive when a rank dies, from Python: agree, shrink, and exact collectives on
the survivors (workers/elastic.py), under ringrun --elastic."""

from conftest import launch


def test_survivors_agree_shrink_and_go_on_exactly_after_a_sigkill():
    rc, lines, out = launch(4, "elastic.py", "numpy", elastic=True, timeout=60, expect_ok=False)
    assert rc == 0, out[-4000:]  # the survivors finished the job
    assert "rank 2 killed by signal 9 (SIGKILL)" in out, out[-4000:]
    for r in (0, 1, 3):
        ls = lines[r]
        err = [l for l in ls if l.startswith("ERROR ")]
        assert err and "rank 2" in err[0], ls
        assert "AGREED flag=True failed=[2]" in ls, ls
        shrunk = [l for l in ls if l.startswith("SHRUNK ")][0]
        assert f"size=3 rank={[0, 1, 3].index(r)} parents=[0, 1, 3]" in shrunk, shrunk
        # From the kill to the shrunk communicator, in well under the second here.
        assert float(shrunk.split("after=")[1]) < 2.0, shrunk
        assert f"EXACT {(1.0 + 2.0 + 4.0, 7.0)}" in ls, ls


def test_bad_shrink_arguments_fail_every_rank_at_once():
    _, lines, _ = launch(3, "elastic.py", "bad", timeout=60)
    for r in range(3):
        ls = lines[r]
        invalid = [l for l in ls if l.startswith("INVALID ")]
        assert len(invalid) == 2, ls
        assert f"rank {r}: shrink: exclude names rank 3, which is not a rank" in invalid[0], ls
        assert "twice" in invalid[1], ls
        assert "OK" in ls, ls


def test_a_newcomer_joins_what_the_members_grow():
    _, lines, _ = launch(4, "elastic.py", "grow", timeout=60)
    for r in range(4):
        assert f"GROWN size=4 rank={r} sum=10.0" in lines[r], lines[r]


def test_torch_agree_names_the_dead_rank_on_every_survivor():
    import pytest

    from conftest import have_module

    pytest.importorskip("torch")
    if not have_module("_torch_backend"):
        pytest.skip("the torch backend was not built")
    rc, lines, out = launch(4, "elastic.py", "torch_agree", elastic=True, timeout=90,
                            expect_ok=False)
    assert rc == 0, out[-4000:]
    for r in (0, 1, 3):
        assert "TORCH_AGREED (False, [2])" in lines[r], lines[r]
