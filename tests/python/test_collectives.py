"""Every collective, dtype and op of the Python module against NumPy, at 2 and 4 ranks (the
checks run in the ranks: tests/python/workers/collectives.py)."""

import pytest

from conftest import launch


@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_dtype_and_op_matches_numpy(n):
    _, lines, out = launch(n, "collectives.py")
    assert sorted(lines) == list(range(n)), out[-3000:]
    for rank, ls in lines.items():
        assert not [l for l in ls if l.startswith("FAIL")], f"rank {rank}:\n" + "\n".join(ls)
        assert ls[-1].startswith("OK "), f"rank {rank}: {ls[-3:]}"
        assert int(ls[-1].split()[1]) > 1000  # every case ran


@pytest.mark.parametrize("n", [1, 3])
def test_one_and_three_ranks(n):
    # One rank (every call a copy or no-op) and a size that is not a power of two.
    _, lines, out = launch(n, "collectives.py")
    assert all(ls[-1].startswith("OK ") for ls in lines.values()), out[-3000:]
