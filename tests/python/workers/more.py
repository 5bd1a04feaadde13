"""One rank of test_more: what the module has beyond the original collectives: gather, scatter,
allgatherv, reduce_scatterv, alltoallv, int16 and bool buffers, the bitwise ops and premul_sum,
blocking and async, split, alloc and free, against NumPy. Prints "FAIL ..." per wrong result and "OK <checks>" at the
end; exits 1 on any failure."""

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


def block(src, dst, n, dtype=np.int64):
    return (np.arange(n) + src * 1000 + dst * 10).astype(dtype)


for root in {0, N - 1}:
    for n in [0, 1, 5000]:
        # gather: the root's recv holds every rank's send, in rank order
        recv = np.full(N * n, -1, np.int64) if R == root else None
        out = comm.gather(block(R, root, n), recv, root=root)
        if R == root:
            want = np.concatenate([block(q, root, n) for q in range(N)])
            check(np.array_equal(out, want), f"gather root={root} n={n}")
        else:
            check(out is None, "gather returns None off the root")
        # scatter: rank r gets block r of the root's send
        send = np.concatenate([block(root, q, n) for q in range(N)]) if R == root else None
        got = np.full(n, -1, np.int64)
        w = comm.scatter_async(send, got, root=root)
        w.wait()
        check(np.array_equal(got, block(root, R, n)), f"scatter root={root} n={n}")

# Blocks of their own sizes (one of them empty).
counts = [(q * 37) % 5 * 1000 + (q % 2) for q in range(N)]
counts[N // 2] = 0
total = sum(counts)
offs = np.concatenate([[0], np.cumsum(counts)])
mine = block(R, -1, counts[R])
allv = np.full(total, -1, np.int64)
comm.allgatherv(mine, allv, counts)
check(all(np.array_equal(allv[offs[q]:offs[q + 1]], block(q, -1, counts[q])) for q in range(N)),
      "allgatherv")
vals = np.arange(total, dtype=np.float32) % 7 + R
part = np.zeros(counts[R], np.float32)
comm.reduce_scatterv(vals, part, counts, op="max")
want = (np.arange(total, dtype=np.float32) % 7 + (N - 1))[offs[R]:offs[R + 1]]
check(np.array_equal(part, want), "reduce_scatterv max")
sc = [(R + j) % 3 * 100 for j in range(N)]  # rank R sends rank j (R + j) % 3 * 100 elements
rc = [(j + R) % 3 * 100 for j in range(N)]  # and receives that many from rank j
sbuf = np.concatenate([block(R, j, sc[j]) for j in range(N)])
rbuf = np.full(sum(rc), -1, np.int64)
comm.alltoallv_async(sbuf, rbuf, sc, rc).wait()
check(np.array_equal(rbuf, np.concatenate([block(j, R, rc[j]) for j in range(N)])), "alltoallv")

# int16, bool, bitwise ops, premul_sum.
x = (np.arange(100) + R).astype(np.int16)
comm.allreduce(x, op="bxor")
want = np.zeros(100, np.int16)
for q in range(N):
    want ^= (np.arange(100) + q).astype(np.int16)
check(np.array_equal(x, want), "int16 bxor")
flags = np.array([R == 0, True, R % 2 == 1, False])
comm.allreduce(flags, op="bor")
check(np.array_equal(flags, np.array([True, True, N > 1, False])), "bool bor")
f = np.full(10, 2.0, np.float32)
comm.allreduce(f, op="premul_sum", premul_factor=0.5 * (R + 1))
check(np.allclose(f, 2.0 * sum(0.5 * (q + 1) for q in range(N))), "premul_sum")
try:
    comm.allreduce(np.ones(3, np.float32), op="sum", premul_factor=2.0)
    check(False, "premul_factor without premul_sum accepted")
except ringreduce.InvalidArgument as e:
    check("premul_sum" in str(e), "premul_factor without premul_sum: " + str(e))

# split: even and odd ranks, each group in rank order; NO_COLOR gives None.
g = comm.split(R % 2)
check(g.size == (N + 1 - R % 2) // 2 and g.rank == R // 2, f"split: rank {g.rank} of {g.size}")
v = np.array([R], np.int64)
g.allreduce(v)
check(v[0] == sum(q for q in range(N) if q % 2 == R % 2), "allreduce in the group")
check(comm.split(ringreduce.NO_COLOR if R else 0) is None or R == 0, "NO_COLOR gives None")
g.close()

# alloc / free: registered memory (large allreduces on it read the peers' buffers in place).
mem = comm.alloc(300_000 * 4)
a = np.frombuffer(mem, dtype=np.float32)
a[:] = np.arange(a.size, dtype=np.float32) % 7 * (R + 1)
comm.allreduce(a)
check(np.array_equal(a, np.arange(a.size, dtype=np.float32) % 7 * (N * (N + 1) // 2)),
      "allreduce in registered memory")
try:
    comm.free(np.zeros(3) if R == N - 1 else a)
    check(False, "free of memory alloc did not return accepted")
except ringreduce.InvalidArgument as e:
    check(f"rank {N - 1}" in str(e) or "this pointer" in str(e), "free's error: " + str(e))
comm.free(mem)
del a, mem  # invalid after free

comm.barrier()
print("OK", checks, flush=True)
sys.exit(1 if failures else 0)
