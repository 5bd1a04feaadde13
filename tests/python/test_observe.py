"""What ringreduce shows to the tools people look with: torch.profiler names its calls as it does
gloo's ("ringreduce:all_reduce" beside "gloo:all_reduce"). RINGREDUCE_TIMELINE and the logs are
tested through launches in tests/multiprocess/observe.py."""

import pytest

from conftest import have_module, launch

pytest.importorskip("torch")
if not have_module("_torch_backend"):
    pytest.skip("the torch backend was not built (libtorch-dev missing)", allow_module_level=True)


def test_torch_profiler_names_ringreduce_calls():
    _, lines, out = launch(2, "profiled.py", timeout=120)
    for rank in (0, 1):
        ls = lines.get(rank, [])
        assert "DONE" in ls, out[-3000:]
        names = {l.split()[1]: int(l.split()[2]) for l in ls if l.startswith("NAME ")}
        # gloo's own record, as the reference for what a backend's record looks like.
        assert names.get("gloo:all_reduce") == 1, (rank, names)
        # The inline small one and the async big one; then a broadcast and a barrier.
        assert names.get("ringreduce:all_reduce") == 2, (rank, names)
        assert names.get("ringreduce:broadcast") == 1, (rank, names)
        assert names.get("ringreduce:barrier") == 1, (rank, names)
