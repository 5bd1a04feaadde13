"""One rank of test_observe's torch.profiler check: profiles an all_reduce that runs inline (4
floats), one that goes through the progress thread (1 Mi floats, waited on), a broadcast and a
barrier on the ringreduce backend, and prints, per line, "NAME <count> <cpu us>" for every profiler
event whose name starts with "ringreduce:" or "gloo:" (a gloo group alongside shows what torch's
own backend records). Runs on torch 1.13 and 2.x."""

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import ringreduce.torch  # noqa: F401  registers the backend

dist.init_process_group("ringreduce")
gloo = dist.new_group(backend="gloo")
small = torch.ones(4)
big = torch.ones(1 << 20)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    dist.all_reduce(small)
    dist.all_reduce(big, async_op=True).wait()
    dist.broadcast(small, src=0)
    dist.barrier()
    dist.all_reduce(small, group=gloo)
n = dist.get_world_size()
# small: summed by ringreduce, then by gloo.
assert small.tolist() == [float(n * n)] * 4 and big[0].item() == n and big[-1].item() == n
for e in prof.key_averages():
    if e.key.startswith(("ringreduce:", "gloo:")):
        print("NAME", e.key, e.count, round(e.cpu_time_total))
dist.destroy_process_group()
print("DONE")
