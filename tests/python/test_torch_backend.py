"""torch.distributed with backend "ringreduce": every call it implements, every dtype it
reduces, against torch's own arithmetic, at 2 and 4 ranks (workers/torch_dist.py)."""

import pytest

from conftest import have_module, launch

pytest.importorskip("torch")
if not have_module("_torch_backend"):
    pytest.skip("the torch backend was not built (libtorch-dev missing)", allow_module_level=True)


@pytest.mark.parametrize("n", [2, 4])
def test_every_call_and_dtype_matches_torch(n):
    _, lines, out = launch(n, "torch_dist.py")
    assert sorted(lines) == list(range(n)), out[-3000:]
    for rank, ls in lines.items():
        fails = [l for l in ls if l.startswith("FAIL")]
        assert not fails, f"rank {rank}:\n" + "\n".join(fails)
        oks = [l for l in ls if l.startswith("OK ")]
        assert oks and int(oks[-1].split()[1]) > 300, f"rank {rank}: {ls[-3:]}"
