"""A worker of torchrun's elastic c10d rendezvous (tests/multiprocess/cluster.sh, case
torchrun-elastic): backend ringreduce on the agents' store; every step an allreduce whose exact
result depends on the world size, printed as "STEP restart=R world=N rank=K step=S ok" (R: this
node's agent's restart count). Worker groups run until the agents stop them (a node leaving or
joining restarts the group), except that once the file named by the first argument exists, a
group that has run 5 steps ends (exit 0 on every rank: the job is over)."""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ringreduce.torch  # noqa: F401

# Debian's torch 2.x is built without libuv, and under torchrun's agent store its env://
# rendezvous makes the store's client with libuv whatever USE_LIBUV says (_create_c10d_store in
# torch/distributed/rendezvous.py passes no use_libuv there): the default that
# scripts/torchrun-nolibuv turns off in the agent is turned off here for the worker.
if os.environ.get("USE_LIBUV") == "0" and "use_libuv" in (dist.TCPStore.__init__.__doc__ or ""):
    import importlib

    # (the module, not torch.distributed's function of the same name)
    rdzv = importlib.import_module("torch.distributed.rendezvous")

    class _NoLibuvStore(dist.TCPStore):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    rdzv.TCPStore = _NoLibuvStore

FINISH = sys.argv[1]
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("ringreduce", timeout=timedelta(seconds=30))
r, n = dist.get_rank(), dist.get_world_size()
step = 0
while True:
    t = torch.full((1000,), float(r + 1))
    dist.all_reduce(t)
    want = n * (n + 1) / 2
    if not bool((t == want).all()):
        print(f"WRONG restart={restart} world={n} step={step} got {t[0].item()} want {want}",
              flush=True)
        sys.exit(1)
    print(f"STEP restart={restart} world={n} rank={r} step={step} ok", flush=True)
    step += 1
    # Decided alike on every rank (an allreduce), so that no rank leaves the others waiting.
    flag = torch.tensor([1.0 if os.path.exists(FINISH) and step >= 5 else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if flag.item() == 1.0:
        break
    time.sleep(0.2)
dist.destroy_process_group()
print(f"DONE restart={restart} world={n} rank={r}", flush=True)
