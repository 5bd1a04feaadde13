"""One rank of test_p2p: sends and receives of the Python module on NumPy arrays and CPU torch
tensors, blocking and async, from a given rank and from any rank, interleaved with collectives.
Prints "FAIL ..." per wrong result and "OK <checks>" at the end; exits 1 on any failure."""

import sys

import numpy as np

import ringreduce

comm = ringreduce.init()
R, N = comm.rank, comm.size
failures = []
checks = 0


def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print("FAIL", what, flush=True)


def msg(src, dst, k, n, dtype=np.float32):
    return (np.arange(n) % 1000 + src * 10 + dst + k).astype(dtype)


right, left = (R + 1) % N, (R - 1) % N
# Every size class: empty, eager, rendezvous; blocking, even ranks send first.
for k, n in enumerate([0, 1, 1000, 16384, 16385, 1 << 20]):
    got = np.empty(n, np.float32)
    if R % 2 == 0:
        comm.send(msg(R, right, k, n), right, tag=k)
        src = comm.recv(got, left, tag=k)
    else:
        src = comm.recv(got, left, tag=k)
        comm.send(msg(R, right, k, n), right, tag=k)
    check(src == left and np.array_equal(got, msg(left, R, k, n)), f"ring k={k} n={n}")

# Async, with an allreduce in between, and a receive from any source on rank 0.
works, bufs = [], []
for q in range(N):
    if q != R:
        bufs.append((q, np.zeros(5000, np.int64)))
        works.append(comm.recv_async(bufs[-1][1], q, tag=7))
        works.append(comm.send_async(msg(R, q, 7, 5000, np.int64), q, tag=7))
x = np.ones(100, np.float32)
comm.allreduce(x)
check(x[0] == N, "allreduce between async sends and receives")
for w in works:
    w.wait()
for q, b in bufs:
    check(np.array_equal(b, msg(q, R, 7, 5000, np.int64)), f"async from {q}")
if R == 0:
    seen = set()
    for _ in range(N - 1):
        b = np.zeros(10, np.int32)
        w = comm.recv_async(b, tag=3)
        w.wait()
        seen.add(w.source)
        check(np.array_equal(b, msg(w.source, 0, 3, 10, np.int32)), f"any source {w.source}")
    check(seen == set(range(1, N)), f"any source saw {sorted(seen)}")
else:
    comm.send(msg(R, 0, 3, 10, np.int32), 0, tag=3)

# CPU torch tensors, when torch is there.
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    t = torch.arange(12, dtype=torch.float64) + R
    got = torch.empty(12, dtype=torch.float64)
    w = comm.send_async(t, right, tag=11)
    comm.recv(got, left, tag=11)
    w.wait()
    check(torch.equal(got, torch.arange(12, dtype=torch.float64) + left), "torch tensors")

comm.barrier()
print("OK", checks, flush=True)
sys.exit(1 if failures else 0)
