"""One rank of test_torch_backend: torch.distributed with backend "ringreduce", every call the
backend implements, every dtype it reduces, checked against torch on every rank. Prints "FAIL ..."
per wrong result and "OK <checks>"; exits 1 on any failure."""

import sys

import torch
import torch.distributed as dist

import ringreduce.torch  # noqa: F401  registers the backend

dist.init_process_group("ringreduce")
R, N = dist.get_rank(), dist.get_world_size()
failures = []
checks = 0


def check(what, got, want):
    global checks
    checks += 1
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        failures.append(f"{what}: got {got.flatten()[:6].tolist()} want "
                        f"{want.flatten()[:6].tolist()}")


def val(rank, n, dtype, prod=False):
    i = torch.arange(n)
    v = 1 + (i + rank) % 2 if prod else (rank + 1) + i % 3
    return v.to(dtype)


DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
          torch.int32, torch.int64]
OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MIN: "min",
       dist.ReduceOp.MAX: "max"}
if hasattr(dist.ReduceOp, "AVG"):
    OPS[dist.ReduceOp.AVG] = "avg"


def ref(tensors, name, dtype):
    s = torch.stack([t.to(torch.float64) for t in tensors])
    if name == "sum":
        r = s.sum(0)
    elif name == "prod":
        r = s.prod(0)
    elif name == "min":
        r = s.min(0).values
    elif name == "max":
        r = s.max(0).values
    else:
        r = s.sum(0) / N
        if not dtype.is_floating_point:
            r = torch.trunc(r)
    return r.to(dtype)


for dtype in DTYPES:
    for op, name in OPS.items():
        for n in (1, 1000):
            prod = name == "prod"
            want = ref([val(r, n, dtype, prod) for r in range(N)], name, dtype)
            t = val(R, n, dtype, prod)
            dist.all_reduce(t, op=op)
            check(f"all_reduce {dtype} {name} {n}", t, want)
            # reduce to rank N-1; the others keep their input
            t = val(R, n, dtype, prod)
            dist.reduce(t, dst=N - 1, op=op)
            check(f"reduce {dtype} {name} {n}", t, want if R == N - 1 else val(R, n, dtype, prod))
            # reduce_scatter (list) and the single-tensor form
            full = ref([val(r, n * N, dtype, prod) for r in range(N)], name, dtype)
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out, list(val(R, n * N, dtype, prod).chunk(N)), op=op)
            check(f"reduce_scatter {dtype} {name} {n}", out, full[R * n:(R + 1) * n])
            out = torch.empty(n, dtype=dtype)
            dist._reduce_scatter_base(out, val(R, n * N, dtype, prod), op=op)
            check(f"_reduce_scatter_base {dtype} {name} {n}", out, full[R * n:(R + 1) * n])
    # data movement
    outs = [torch.empty(5, dtype=dtype) for _ in range(N)]
    dist.all_gather(outs, val(R, 5, dtype))
    for r in range(N):
        check(f"all_gather {dtype} block {r}", outs[r], val(r, 5, dtype))
    flat = torch.empty(5 * N, dtype=dtype)
    dist._all_gather_base(flat, val(R, 5, dtype))
    check(f"_all_gather_base {dtype}", flat, torch.cat([val(r, 5, dtype) for r in range(N)]))
    t = val(R, 7, dtype)
    dist.broadcast(t, src=N - 1)
    check(f"broadcast {dtype}", t, val(N - 1, 7, dtype))
    inp = (torch.arange(4 * N) + 10 * R).to(dtype)
    out = torch.empty(4 * N, dtype=dtype)
    dist.all_to_all_single(out, inp)
    check(f"all_to_all_single {dtype}", out,
          torch.cat([(torch.arange(4 * N) + 10 * r).to(dtype)[4 * R:4 * R + 4] for r in range(N)]))
    outs = [torch.empty(3, dtype=dtype) for _ in range(N)]
    dist.all_to_all(outs, [torch.full((3,), R * N + j, dtype=dtype) for j in range(N)])
    for r in range(N):
        check(f"all_to_all {dtype} from {r}", outs[r], torch.full((3,), r * N + R, dtype=dtype))

# Any dtype moves as bytes (broadcast of bool and int16), 2-d tensors.
b = torch.tensor([True, False, True]) if R == 0 else torch.zeros(3, dtype=torch.bool)
dist.broadcast(b, src=0)
check("broadcast bool", b, torch.tensor([True, False, True]))
m = torch.full((4, 6), float(R + 1))
dist.all_reduce(m)
check("all_reduce 2-d", m, torch.full((4, 6), float(N * (N + 1) // 2)))

# allreduce_coalesced: several tensors, one collective.
ts = [torch.full((3,), float(R + 1)), torch.full((2, 2), float(R + 1))]
dist.all_reduce_coalesced(ts)
check("all_reduce_coalesced 0", ts[0], torch.full((3,), float(N * (N + 1) // 2)))
check("all_reduce_coalesced 1", ts[1], torch.full((2, 2), float(N * (N + 1) // 2)))

# Async: several outstanding, completed through wait() and through the future; small ones run
# in the calling thread, large ones (> 64 KiB) in ringreduce's progress thread: both sizes.
xs = [torch.full((1000 if i % 2 else 100003,), float(R + i)) for i in range(4)]
works = [dist.all_reduce(x, async_op=True) for x in xs]
futs = [w.get_future() for w in works]
for i, f in enumerate(futs):
    res = f.wait()
    check(f"future value {i}", res[0],
          torch.full((len(xs[i]),), float(N * (N - 1) // 2 + N * i)))
for w in works:
    w.wait()
    assert w.is_completed() and w.is_success()
dist.barrier()

# A collective issued from a future's callback (as PowerSGD's DDP hook does): the callback runs in
# the thread that completed the op, maybe ringreduce's progress thread; it must not deadlock.
big, small, later = torch.ones(100003), torch.ones(10), []


def issue_next(fut):
    later.append(dist.all_reduce(small, async_op=True))
    return fut.value()


dist.all_reduce(big, async_op=True).get_future().then(issue_next).wait()
later[0].wait()
check("collective from a future callback", small, torch.full((10,), float(N)))

# Blocks are whole rows: a dim 0 that does not divide over the ranks is refused, not split mid-row.
try:
    dist.all_to_all_single(torch.empty(N + 1, 2), torch.zeros(N + 1, 2))
    failures.append("all_to_all_single of N+1 rows did not raise")
except ValueError as e:
    if "dim 0" not in str(e):
        failures.append(f"all_to_all_single error: {e}")
checks += 1

# Unsupported calls name themselves.
try:
    dist.send(torch.zeros(1), dst=(R + 1) % N)
    failures.append("send did not raise")
except RuntimeError as e:
    if "send" not in str(e):
        failures.append(f"send error does not name the call: {e}")
checks += 1

dist.destroy_process_group()
for f in failures:
    print("FAIL", f)
print("OK" if not failures else "FAILED", checks, flush=True)
sys.exit(1 if failures else 0)
