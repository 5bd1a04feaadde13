"""One rank of test_elastic (under ringrun --elastic). argv[1] picks the case:

  numpy   rank 2 of 4 SIGKILLs itself inside an allreduce; the survivors catch the error, agree on
          who is gone, shrink, and run exact allreduces on the 3 that are left
  bad     bad shrink arguments raise InvalidArgument on every rank at once (no rank dies)
  grow    ranks 0-2 grow their communicator by one newcomer, which ringrun's rank 3 plays
  torch_agree  through torch.distributed: rank 2 dies, the others agree on it (any torch)

Each rank prints what it saw ("ERROR <class> <peer>", "AGREED ...", "SHRUNK ...", "EXACT ...").
"""

import os
import signal
import sys
import threading
import time

import numpy as np

import ringreduce

case = sys.argv[1]
comm = ringreduce.Communicator()
R, N = comm.rank, comm.size


def exact(c, parent_of):
    """An allreduce whose sum says who took part: each rank adds its first rank + 1."""
    x = np.full(1 << 18, parent_of[c.rank] + 1, dtype=np.float32)
    c.allreduce(x)
    return float(x[0]), float(x[-1])


if case == "numpy":
    victim = 2
    x = np.ones(1 << 18, dtype=np.float32)
    comm.allreduce(x)
    at = np.array([time.time() + 0.3])
    comm.broadcast(at, root=0)
    if R == victim:
        threading.Timer(max(0.0, at[0] - time.time()), lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    t0 = None
    try:
        for _ in range(100000):
            comm.allreduce(x)
            if time.time() > at[0] + 30:
                break
    except ringreduce.Error as e:
        t0 = time.time()
        print(f"ERROR {type(e).__name__} peer={getattr(e, 'peer', None)} {e}", flush=True)
    assert comm.error() is not None
    a = comm.agree(True)
    print(f"AGREED flag={a.flag} failed={a.failed}", flush=True)
    small = comm.shrink()
    print(f"SHRUNK size={small.size} rank={small.rank} parents={small.parent_ranks} "
          f"after={time.time() - at[0]:.3f}", flush=True)
    comm.close()
    print(f"EXACT {exact(small, small.parent_ranks)}", flush=True)
    small.close()
elif case == "bad":
    for exclude in ([N], [1, 1]):
        try:
            comm.shrink(exclude)
            print("NO ERROR", flush=True)
        except ringreduce.InvalidArgument as e:
            print(f"INVALID {e}", flush=True)
    comm.allreduce(np.ones(4, dtype=np.float32))  # the communicator is untouched
    print("OK", flush=True)
elif case == "grow":
    # Ranks 0..2 are members; rank 3 of ringrun plays a newcomer: it joins what they grow.
    members = comm.split(0 if R < 3 else ringreduce.NO_COLOR, R)  # every rank takes part
    if R == 3:
        g = ringreduce.Communicator.join("py-grow")
    else:
        g = members.grow("py-grow", 1)
    x = np.full(1000, g.rank + 1, dtype=np.float32)
    g.allreduce(x)
    print(f"GROWN size={g.size} rank={g.rank} sum={float(x[0])}", flush=True)
elif case == "torch_agree":
    # Through torch.distributed (any torch version): a rank killed, the others agree on it.
    import torch
    import torch.distributed as dist

    import ringreduce.torch as rt

    comm.close()
    dist.init_process_group("ringreduce")
    x = torch.ones(1 << 16)
    dist.all_reduce(x)
    if dist.get_rank() == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(1000):
            dist.all_reduce(x)
    except Exception as e:  # noqa: BLE001
        print(f"TORCH_ERROR {type(e).__name__}", flush=True)
    print(f"TORCH_AGREED {rt.agree(flag=dist.get_rank() != 1)}", flush=True)
