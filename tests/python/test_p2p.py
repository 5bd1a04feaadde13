"""Sends and receives of the Python module (tests/python/workers/p2p.py) at 2, 3 and 4 ranks."""

import pytest

from conftest import launch


@pytest.mark.parametrize("n", [2, 3, 4])
def test_send_recv_blocking_async_any_source(n):
    _, lines, out = launch(n, "p2p.py")
    assert sorted(lines) == list(range(n)), out[-3000:]
    for rank, ls in lines.items():
        assert not [l for l in ls if l.startswith("FAIL")], f"rank {rank}:\n" + "\n".join(ls)
        assert ls[-1].startswith("OK "), f"rank {rank}: {ls[-3:]}"
