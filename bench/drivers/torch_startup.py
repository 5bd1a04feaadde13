"""torch.distributed's gloo backend started as bench/drivers/startup.cc starts ringreduce, for
bench/drivers/startup.sh: launch to init_process_group returned, and to the first allreduce done (slowest
rank), then a barrier and an allreduce of the ranks' numbers checked.

    ringrun -n 16 /usr/bin/python3 bench/drivers/torch_startup.py

Times are seconds after the first process started (/proc/self/stat, as startup.cc); the import
of torch counts, as it does for a user, and "imported" says when the slowest rank had it.
"""

import os
import time


def process_start():
    with open("/proc/self/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[19]) / os.sysconf("SC_CLK_TCK")  # field 22


started = process_start()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

imported = time.clock_gettime(time.CLOCK_BOOTTIME)
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://")
ready = time.clock_gettime(time.CLOCK_BOOTTIME)
t = torch.ones(1)
dist.all_reduce(t)
first = time.clock_gettime(time.CLOCK_BOOTTIME)
n, me = dist.get_world_size(), dist.get_rank()
ok = int(t[0]) == n
dist.barrier()
s = torch.tensor([me], dtype=torch.int64)
dist.all_reduce(s)
ok = ok and int(s[0]) == n * (n - 1) // 2
v = torch.tensor([-started, started, ready, first, 0.0 if ok else 1.0, imported],
                 dtype=torch.float64)
dist.all_reduce(v, op=dist.ReduceOp.MAX)
if me == 0:
    first_start = -float(v[0])
    print(f"startup N={n} first_start 0.00 last_start {float(v[1]) - first_start:.2f} "
          f"ready {float(v[2]) - first_start:.2f} first_allreduce {float(v[3]) - first_start:.2f} "
          f"check {'ok' if float(v[4]) == 0 else 'FAILED'} "
          f"imported {float(v[5]) - first_start:.2f}", flush=True)
dist.destroy_process_group()
