"""One rank under torchrun (test_torchrun): the two ways a Python program meets ringreduce there.

1. ringreduce.init(): the C++ Communicator::from_env, which finds torchrun's variables and, with
   TORCHELASTIC_USE_AGENT_STORE=True, rendezvouses as a client of the agent's TCPStore.
2. torch.distributed.init_process_group("ringreduce"): torch connects to the same store itself and
   hands it to the backend (python/src/torch_group.h's TorchStore).

An allreduce on each, checked on every rank; prints "OK rank R of N (numpy S, torch S)" and exits
0, or raises.
"""

import os

import numpy as np
import torch
import torch.distributed as dist

import ringreduce
import ringreduce.torch  # noqa: F401  (registers the backend)

comm = ringreduce.init()
R, N = comm.rank, comm.size
want = N * (N + 1) // 2
x = np.full(4096, R + 1, dtype=np.float32)
comm.allreduce(x)
assert (x == want).all(), f"rank {R}: numpy allreduce gave {x[:4]}..., expected {want}"

if int(torch.__version__.split(".")[0]) >= 2 and os.environ.get("USE_LIBUV") == "0":
    # Debian's torch 2.6 has no libuv, and under the agent store init_process_group creates its
    # client TCPStore with the default use_libuv=True whatever USE_LIBUV says: it would fail
    # before reaching the backend (test_torchrun.py does the same for torchrun itself).
    import sys

    # (the module: torch.distributed.rendezvous is also the name of a function there)
    rdzv = sys.modules["torch.distributed.rendezvous"]

    class _TCPStore(rdzv.TCPStore):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    rdzv.TCPStore = _TCPStore
dist.init_process_group("ringreduce")
assert (dist.get_rank(), dist.get_world_size()) == (R, N), "torch and ringreduce disagree on ranks"
t = torch.full((4096,), float(R + 1))
dist.all_reduce(t)
assert bool((t == want).all()), f"rank {R}: torch all_reduce gave {t[:4]}..., expected {want}"
dist.barrier()
dist.destroy_process_group()
comm.close()
print(f"OK rank {R} of {N} (numpy {x[0]:g}, torch {t[0].item():g})", flush=True)
