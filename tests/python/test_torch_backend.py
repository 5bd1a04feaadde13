"""torch.distributed with backend "ringreduce": every call on CPU tensors against gloo's results in
the same job and against torch's arithmetic, every dtype and reduce op, uneven sizes, views that
are not contiguous, point to point and its interleavings with collectives, objects, sparse tensors,
groups, at 2 and 4 ranks (workers/torch_surface.py). The same test runs on torch 1.13 here and on
torch 2.x in scripts/torch2's root."""

import pytest

from conftest import have_module, launch

pytest.importorskip("torch")
if not have_module("_torch_backend"):
    pytest.skip("the torch backend was not built (libtorch-dev missing)", allow_module_level=True)


@pytest.mark.parametrize("n", [2, 4])
def test_every_call_matches_gloo_and_torch(n):
    _, lines, out = launch(n, "torch_surface.py", timeout=300)
    assert sorted(lines) == list(range(n)), out[-3000:]
    for rank, ls in lines.items():
        fails = [l for l in ls if l.startswith("FAIL")]
        assert not fails, f"rank {rank}:\n" + "\n".join(fails)
        oks = [l for l in ls if l.startswith("OK ")]
        assert oks and int(oks[-1].split()[1]) > 400, f"rank {rank}: {ls[-3:]}"
