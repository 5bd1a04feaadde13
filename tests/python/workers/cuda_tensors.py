"""One rank of gpu-check's Python step: the module's calls on torch CUDA tensors (ordered on the
current stream) and, where CuPy is installed, CuPy arrays (__cuda_array_interface__), checked
against the same calls on CPU tensors. Needs a GPU: scripts/gpu-check runs it under ringrun.
Prints one "FAIL ..." line per wrong result and "OK <checks>" at the end; exits 1 on a failure.
"""

import torch
from gpu_checks import Checks

import ringreduce

comm = ringreduce.init()
R, N = comm.rank, comm.size
checks = Checks(R)
check = checks.check


dev = torch.device("cuda", 0)
for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
              torch.int64, torch.uint8):
    for count in (1, 7, 1000, 1 << 20):
        for op in ("sum", "max", "min"):
            base = (torch.arange(count) % 3 + R + 1).to(dtype)
            want = base.clone()
            comm.allreduce(want, op=op)
            # Produced by a kernel on the current stream right before the call: the call must
            # wait for it (stream order), not read the memory as it was.
            got = torch.zeros(count, dtype=dtype, device=dev)
            got.add_(base.to(dev))
            comm.allreduce(got, op=op)
            check(f"allreduce {dtype} x{count} {op}", got, want)
    # allgather out of place, async, then a kernel on the result
    src = torch.full((1001,), R + 1, dtype=dtype, device=dev)
    out = torch.zeros(1001 * N, dtype=dtype, device=dev)
    comm.allgather_async(src, out).wait()
    torch.cuda.current_stream().synchronize()
    check(f"allgather {dtype}", out, torch.cat([torch.full((1001,), q + 1, dtype=dtype)
                                                for q in range(N)]))

# On a side stream of the caller's: ordered there, not on the default stream.
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    t = torch.ones(1 << 18, device=dev) * (R + 1)
    comm.allreduce(t)
    t.mul_(2)
s.synchronize()
check("allreduce on a side stream", t, torch.full((1 << 18,), float(N * (N + 1))))

try:
    import cupy
except ImportError:
    cupy = None
if cupy is not None:
    a = cupy.full(4099, R + 1, dtype=cupy.float32)
    comm.allreduce(a)
    check("allreduce of a CuPy array", torch.as_tensor(a.get()),
          torch.full((4099,), float(N * (N + 1) // 2)))

checks.finish("" if cupy else " (no CuPy)")
