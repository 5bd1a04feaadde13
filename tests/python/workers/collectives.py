"""One rank of test_collectives: every collective, dtype and op on NumPy arrays (and CPU torch
tensors when torch is there), checked against NumPy on every rank.

Inputs are deterministic functions of (rank, index), so each rank computes every rank's input and
the exact expected result itself. Values are small and exactly representable in half and bfloat16,
so floating-point results are exact whatever order the reduction ran in. Prints one "FAIL ..." line
per wrong result and "OK <checks>" at the end; exits 1 on any failure.
"""

import sys

import numpy as np

import ringreduce

comm = ringreduce.init()
R, N = comm.rank, comm.size
failures = []
checks = 0

# name -> (numpy dtype of the memory, ringreduce dtype override)
DTYPES = {
    "float16": (np.float16, None),
    "bfloat16": (np.uint16, "bfloat16"),
    "float32": (np.float32, None),
    "float64": (np.float64, None),
    "int8": (np.int8, None),
    "uint8": (np.uint8, None),
    "int32": (np.int32, None),
    "uint32": (np.uint32, None),
    "int64": (np.int64, None),
    "uint64": (np.uint64, None),
}
OPS = ["sum", "prod", "min", "max", "avg"]
COUNTS = [0, 1, 7, 1000, 65537]


def values(rank, count, op):
    """The exact values rank contributes (as float64), kept small so that no dtype overflows."""
    i = np.arange(count)
    if op == "prod":
        return 1.0 + ((i + rank) % 2)  # products of 1s and 2s: <= 2**N
    return (rank + 1) + (i % 3) * 1.0  # sums <= N * 4


def encode(v, name):
    """float64 values -> the array ringreduce sees (bfloat16 as its bit pattern in uint16)."""
    mem, _ = DTYPES[name]
    if name == "bfloat16":
        return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return v.astype(mem)


def decode(a, name):
    if name == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def reduce_ref(stack, op, name):
    if op == "sum":
        return stack.sum(axis=0)
    if op == "prod":
        return stack.prod(axis=0)
    if op == "min":
        return stack.min(axis=0)
    if op == "max":
        return stack.max(axis=0)
    s = stack.sum(axis=0) / N  # avg: integers truncate toward zero
    return s if name in ("float16", "bfloat16", "float32", "float64") else np.trunc(s)


def check(what, got, want):
    global checks
    checks += 1
    if got.shape != want.shape or not np.array_equal(got, want):
        bad = np.flatnonzero(got != want) if got.shape == want.shape else []
        at = int(bad[0]) if len(bad) else -1
        failures.append(f"{what}: first wrong element {at}"
                        + (f": got {got[at]} want {want[at]}" if at >= 0 else f" shape {got.shape}"))


def dt(name):
    return DTYPES[name][1]


for name in DTYPES:
    for op in OPS:
        for count in COUNTS:
            want = reduce_ref(np.stack([values(r, count, op) for r in range(N)]), op, name)
            # allreduce, in place and out of place
            buf = encode(values(R, count, op), name)
            comm.allreduce(buf, op=op, dtype=dt(name))
            check(f"allreduce {name} {op} {count}", decode(buf, name), want)
            src = encode(values(R, count, op), name)
            out = np.empty_like(src)
            comm.allreduce(src, out, op=op, dtype=dt(name))
            check(f"allreduce out-of-place {name} {op} {count}", decode(out, name), want)
            # reduce to the last rank (in place on it)
            root = N - 1
            buf = encode(values(R, count, op), name)
            comm.reduce(buf, op=op, root=root, dtype=dt(name))
            mine = want if R == root else values(R, count, op)
            check(f"reduce {name} {op} {count} root {root}", decode(buf, name), mine)
            # reduce_scatter: rank r gets block r of the reduction of N blocks
            src = encode(values(R, count * N, op), name)
            out = encode(np.zeros(count), name)
            comm.reduce_scatter(src, out, op=op, dtype=dt(name))
            full = reduce_ref(np.stack([values(r, count * N, op) for r in range(N)]), op, name)
            check(f"reduce_scatter {name} {op} {count}", decode(out, name),
                  full[R * count:(R + 1) * count])
        # data movement: allgather, broadcast, alltoall (no op)
        count = 1000
        src = encode(values(R, count, "sum"), name)
        out = encode(np.zeros(count * N), name)
        comm.allgather(src, out, dtype=dt(name))
        check(f"allgather {name}", decode(out, name),
              np.concatenate([values(r, count, "sum") for r in range(N)]))
        for root in (0, N - 1):
            buf = encode(values(R, count, "sum"), name)
            comm.broadcast(buf, root=root, dtype=dt(name))
            check(f"broadcast {name} root {root}", decode(buf, name), values(root, count, "sum"))
        src = encode(values(R, count * N, "sum") + 10 * R, name)
        out = encode(np.zeros(count * N), name)
        comm.alltoall(src, out, dtype=dt(name))
        want = np.concatenate([(values(r, count * N, "sum") + 10 * r)[R * count:(R + 1) * count]
                               for r in range(N)])
        check(f"alltoall {name}", decode(out, name), want)

# Multidimensional arrays, async ops (several outstanding), the ReduceOp enum, barrier.
a = np.full((64, 33), R + 1, dtype=np.float32)
b = np.full((5,), R + 1, dtype=np.int64)
w1 = comm.allreduce_async(a, op=ringreduce.ReduceOp.MAX)
w2 = comm.allreduce_async(b)
g = np.empty(N * 3, dtype=np.float64)
w3 = comm.allgather_async(np.full(3, float(R)), g)
w3.wait()
w2.wait()
assert w1.wait(timeout=30.0)
assert w1.is_completed() and w1.algorithm
check("async allreduce max 2-d", a, np.full((64, 33), N, dtype=np.float32))
check("async allreduce sum int64", b, np.full(5, N * (N + 1) // 2, dtype=np.int64))
check("async allgather", g, np.repeat(np.arange(N, dtype=np.float64), 3))
check("async result()", w1.result(), a)
comm.barrier()
comm.barrier_async().wait()

# Narrow wire formats (docs/WIRE.md): small integers code exactly in every format, so float32
# sums of them come out exact; a call a format cannot serve is refused, naming rank and call.
for w in ("bf16", "f16", "fp8e4m3", "fp8e5m2", "fp8", "auto", "none"):
    a = np.full(1000, R + 1, dtype=np.float32)
    comm.allreduce(a, op="sum", wire=w)
    check(f"allreduce wire={w}", a, np.full(1000, N * (N + 1) // 2, dtype=np.float32))
    rs = np.zeros(300, dtype=np.float32)
    comm.reduce_scatter(np.full(300 * N, 2.0, dtype=np.float32), rs, op="avg", wire=w)
    check(f"reduce_scatter wire={w}", rs, np.full(300, 2.0, dtype=np.float32))
    ag = np.zeros(5 * N, dtype=np.float32)
    comm.allgather(np.full(5, float(R), dtype=np.float32), ag, wire=w)
    check(f"allgather wire={w}", ag, np.repeat(np.arange(N, dtype=np.float32), 5))
for bad_call, name in ((lambda: comm.allreduce(np.ones(4, np.int32), wire="bf16"), "allreduce"),
                       (lambda: comm.allreduce(np.ones(4, np.float32), op="max", wire="fp8"),
                        "allreduce"),
                       (lambda: comm.allreduce(np.ones(4, np.float32), wire="fp4"), "allreduce")):
    checks += 1
    try:
        bad_call()
        failures.append(f"wire refusal of {name}: no error")
    except ringreduce.InvalidArgument as e:
        if f"rank {R}" not in str(e) or name not in str(e):
            failures.append(f"wire refusal: {e}")
print(f"wire ok rank {R}", flush=True)

# CPU torch tensors, used in place through their data pointers (when torch is installed).
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    for tdt in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                torch.uint8, torch.int32, torch.int64):
        t = torch.arange(1000).remainder(3).to(tdt) + (R + 1)
        ptr = t.data_ptr()
        comm.allreduce(t, op="sum")
        want = (torch.arange(1000).remainder(3) * N + N * (N + 1) // 2).to(tdt)
        check(f"torch allreduce {tdt}", t.to(torch.float64).numpy(),
              want.to(torch.float64).numpy())
        assert t.data_ptr() == ptr  # in place, no copy
    t = torch.full((10,), float(R))
    w = comm.broadcast_async(t, root=N - 1)
    w.wait()
    check("torch async broadcast", t.numpy(), np.full(10, float(N - 1), dtype=np.float32))

comm.close()
for f in failures:
    print("FAIL", f)
print("OK" if not failures else "FAILED", checks, flush=True)
sys.exit(1 if failures else 0)
