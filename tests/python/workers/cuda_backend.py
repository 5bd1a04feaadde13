"""One rank of gpu-check's torch backend step: torch.distributed with backend "ringreduce" on CUDA
tensors (ordered on torch's current stream, staged through host memory), every form the backend
takes them in, checked against the same call on CPU tensors; the list forms refused, naming the
form to use. Needs a GPU and torch 2.11 or later: scripts/gpu-check runs it under ringrun.
Prints one "FAIL ..." line per wrong result and "OK <checks>" at the end; exits 1 on a failure.
"""

import os

import torch
import torch.distributed as dist
from gpu_checks import Checks

import ringreduce.torch  # noqa: F401  (registers the backend)

dist.init_process_group("ringreduce")
R, N = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", R)) % torch.cuda.device_count())
torch.cuda.set_device(dev)
checks = Checks(R)
check = checks.check


def on_gpu(t):
    """t on the GPU, produced by a kernel right before the call: the call must wait for it."""
    g = torch.zeros_like(t, device=dev)
    g.add_(t.to(dev))
    return g


for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
              torch.int64):
    for count in (1, 1000, 1 << 20):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            base = (torch.arange(count) % 5 + R + 1).to(dtype)
            want = base.clone()
            dist.all_reduce(want, op=op)
            got = on_gpu(base)
            dist.all_reduce(got, op=op)
            check(f"all_reduce {dtype} x{count} {op}", got, want)
    x = (torch.arange(3000) + R).to(dtype)
    # broadcast and reduce from the last rank
    want, got = x.clone(), on_gpu(x)
    dist.broadcast(want, src=N - 1)
    dist.broadcast(got, src=N - 1)
    check(f"broadcast {dtype}", got, want)
    want, got = x.clone(), on_gpu(x)
    dist.reduce(want, dst=N - 1)
    dist.reduce(got, dst=N - 1)
    check(f"reduce {dtype}", got, want)
    # into one tensor and out of one (FSDP's forms), async, then a kernel on the result
    out = torch.zeros(3000 * N, dtype=dtype, device=dev)
    dist.all_gather_into_tensor(out, on_gpu(x), async_op=True).wait()
    out.mul_(1)
    check(f"all_gather_into_tensor {dtype}", out, torch.cat([(torch.arange(3000) + q).to(dtype)
                                                             for q in range(N)]))
    big = (torch.arange(1000 * N) + R).to(dtype)
    want, got = torch.zeros(1000, dtype=dtype), torch.zeros(1000, dtype=dtype, device=dev)
    dist.reduce_scatter_tensor(want, big)
    dist.reduce_scatter_tensor(got, on_gpu(big))
    check(f"reduce_scatter_tensor {dtype}", got, want)
    want, got = torch.zeros(1000 * N, dtype=dtype), torch.zeros(1000 * N, dtype=dtype, device=dev)
    dist.all_to_all_single(want, big)
    dist.all_to_all_single(got, on_gpu(big))
    check(f"all_to_all_single {dtype}", got, want)

# Point to point around the ring.
t = torch.full((4097,), float(R), device=dev)
r = torch.zeros(4097, device=dev)
reqs = [dist.isend(t, (R + 1) % N), dist.irecv(r, (R - 1) % N)]
for q in reqs:
    q.wait()
check("isend/irecv", r, torch.full((4097,), float((R - 1) % N)))

# On a side stream of the caller's: ordered there, not on the default stream.
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    t = torch.ones(1 << 18, device=dev) * (R + 1)
    dist.all_reduce(t)
    t.mul_(2)
s.synchronize()
check("all_reduce on a side stream", t, torch.full((1 << 18,), float(N * (N + 1))))

# A list form is refused, naming the form that takes CUDA tensors.
checks.count += 1
try:
    dist.all_gather([torch.zeros(4, device=dev) for _ in range(N)], torch.ones(4, device=dev))
    checks.fail("all_gather into a list of CUDA tensors", "no error")
except Exception as e:  # noqa: BLE001
    if "all_gather_into_tensor" not in str(e):
        checks.fail("all_gather into a list of CUDA tensors", str(e))

dist.barrier()
dist.destroy_process_group()
checks.finish()
