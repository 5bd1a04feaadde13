"""gather, scatter, allgatherv, reduce_scatterv, alltoallv, int16 and bool buffers, the bitwise
ops and premul_sum through the Python module (tests/python/workers/more.py) at 1-4 ranks."""

import pytest

from conftest import launch


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_gather_scatter_uneven_dtypes_ops(n):
    _, lines, out = launch(n, "more.py")
    assert sorted(lines) == list(range(n)), out[-3000:]
    for rank, ls in lines.items():
        assert not [l for l in ls if l.startswith("FAIL")], f"rank {rank}:\n" + "\n".join(ls)
        assert ls[-1].startswith("OK "), f"rank {rank}: {ls[-3:]}"
