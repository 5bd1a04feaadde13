"""One rank of test_torch_backend: every torch.distributed call on CPU tensors with backend
"ringreduce" (the default group), against gloo's results in the same job (a gloo group over the
same ranks) wherever gloo takes the call and gets it right, and against torch's own arithmetic
everywhere. Also the interleavings of sends and collectives that would deadlock a backend that
queued them together. Runs on torch 1.13 and 2.x.

Prints "FAIL <case>: <why>" per wrong result and "OK <checks>" at the end; exits 1 on any failure.
"""

import sys
import time

import torch
import torch.distributed as dist

import ringreduce.torch  # noqa: F401  registers the backend
from gloo_probe import gloo_takes_half

dist.init_process_group("ringreduce")
R, N = dist.get_rank(), dist.get_world_size()
GLOO = dist.new_group(backend="gloo")
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
GLOO_HALF = gloo_takes_half(GLOO)
failures, checks = [], 0


def fail(case, why):
    failures.append(case)
    print("FAIL", case + ":", why, flush=True)


def same(a, b):
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        if a.is_sparse:
            a, b = a.to_dense(), b.to_dense()
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def case(name, run, want=None, gloo=True, compare_gloo=True):
    """run(group) -> result. Checks ringreduce's result against `want` and against gloo's. `gloo`
    must be the same on every rank (it is a collective there too); `compare_gloo` may differ."""
    global checks
    checks += 1
    try:
        ours = run(None)
    except Exception as e:  # noqa: BLE001  (any error is this case's failure)
        return fail(name, f"raised {type(e).__name__}: {e}")
    if want is not None and not same(ours, want):
        return fail(name, f"got {ours} want {want}")
    if gloo:
        try:
            theirs = run(GLOO)
        except Exception as e:  # noqa: BLE001
            return fail(name, f"gloo raised {type(e).__name__}: {e} (drop gloo=True?)")
        if compare_gloo and not same(ours, theirs):
            return fail(name, f"ringreduce {ours} but gloo {theirs}")


def vals(rank, n, dtype, op="sum"):
    """Rank's input: small values every dtype holds, products of 1s and 2s, bools mixed."""
    i = torch.arange(n)
    if dtype == torch.bool:
        return ((i + rank) % 3 != 0)
    if op == "PRODUCT":
        v = 1 + (i + rank) % 2
    else:
        v = (rank + 1) + i % 3
    if dtype.is_complex:
        return torch.complex(v.float(), -v.float()).to(dtype)
    return v.to(dtype)


def reference(op, dtype, ins, factor=1.0):
    s = torch.stack(ins)
    if dtype == torch.bool:
        return {"SUM": s.any(0), "MAX": s.any(0), "BOR": s.any(0), "PRODUCT": s.all(0),
                "MIN": s.all(0), "BAND": s.all(0), "BXOR": s.sum(0) % 2 == 1}[op]
    if op in ("BAND", "BOR", "BXOR"):
        r = s[0].clone()
        for x in s[1:]:
            r = {"BAND": r & x, "BOR": r | x, "BXOR": r ^ x}[op]
        return r
    wide = s.to(torch.complex128 if dtype.is_complex else torch.float64)
    r = {"SUM": wide.sum(0), "PRODUCT": wide.prod(0), "AVG": wide.sum(0) / N,
         "PREMUL_SUM": wide.sum(0) * factor}.get(op)
    if r is None:
        r = wide.min(0).values if op == "MIN" else wide.max(0).values
    if op == "AVG" and not (dtype.is_floating_point or dtype.is_complex):
        r = torch.trunc(r)
    return r.to(dtype)


def redop(op, factor=0.5):
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)
    return getattr(dist.ReduceOp, op)


# What gloo reduces (docs/PYTHON.md has the table): no AVG or PREMUL_SUM anywhere, bitwise only
# on integers, no int16, and bfloat16 and bool only from torch 2.
def gloo_reduces(dtype, op, call="all_reduce"):
    if op in ("AVG", "PREMUL_SUM") or dtype == torch.int16:
        return False
    if dtype in (torch.float16, torch.bfloat16) and not GLOO_HALF:
        return False
    if dtype in (torch.bfloat16, torch.bool) and not TORCH2:
        return False
    if dtype.is_complex:
        return op == "SUM" and call == "all_reduce"
    return op not in ("BAND", "BOR", "BXOR") or not dtype.is_floating_point


DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM"]


def applies(dtype, op):
    if op in ("BAND", "BOR", "BXOR"):
        return not (dtype.is_floating_point or dtype.is_complex)
    if op == "PREMUL_SUM":
        return dtype.is_floating_point or dtype.is_complex
    if dtype.is_complex:
        return op in ("SUM", "AVG")
    return not (dtype == torch.bool and op == "AVG")


# ---- reductions: every dtype x op, small (run in the caller) and large (the progress thread) ----
for dtype in DTYPES:
    for op in OPS:
        if not applies(dtype, op):
            continue
        for n in (5, 100003):
            def ar(g, dtype=dtype, op=op, n=n):
                t = vals(R, n, dtype, op)
                dist.all_reduce(t, op=redop(op), group=g)
                return t
            want = reference(op, dtype, [vals(r, n, dtype, op) for r in range(N)], 0.5)
            case(f"all_reduce {dtype} {op} {n}", ar, want, gloo_reduces(dtype, op))

        def rd(g, dtype=dtype, op=op):
            t = vals(R, 7, dtype, op)
            dist.reduce(t, dst=N - 1, op=redop(op), group=g)
            return t
        want = reference(op, dtype, [vals(r, 7, dtype, op) for r in range(N)], 0.5)
        # gloo leaves partial sums in the other ranks' tensors; ringreduce leaves their input.
        case(f"reduce {dtype} {op}", rd, want if R == N - 1 else vals(R, 7, dtype, op),
             gloo_reduces(dtype, op, "reduce"), compare_gloo=R == N - 1)

        def rs(g, dtype=dtype, op=op):
            out = torch.empty(3, dtype=dtype)
            dist.reduce_scatter(out, list(vals(R, 3 * N, dtype, op).chunk(N)), op=redop(op),
                                group=g)
            return out
        full = reference(op, dtype, [vals(r, 3 * N, dtype, op) for r in range(N)], 0.5)
        case(f"reduce_scatter {dtype} {op}", rs, full[3 * R:3 * R + 3], gloo=False)

        def rst(g, dtype=dtype, op=op):
            out = torch.empty(3, dtype=dtype)
            dist._reduce_scatter_base(out, vals(R, 3 * N, dtype, op), op=redop(op), group=g)
            return out
        # gloo (torch 2 only) gets SUM right and ignores every other op.
        case(f"reduce_scatter_tensor {dtype} {op}", rst, full[3 * R:3 * R + 3],
             gloo=TORCH2 and op == "SUM" and gloo_reduces(dtype, op, "reduce_scatter"))

# ---- data movement: every dtype -----------------------------------------------------------------
for dtype in DTYPES:
    moves_on_gloo = (dtype not in (torch.int16,) and
                     (TORCH2 or dtype not in (torch.bfloat16, torch.bool)) and
                     (GLOO_HALF or dtype not in (torch.float16, torch.bfloat16)))

    def bc(g, dtype=dtype):
        t = vals(R, 9, dtype)
        dist.broadcast(t, src=N - 1, group=g)
        return t
    case(f"broadcast {dtype}", bc, vals(N - 1, 9, dtype), moves_on_gloo and not dtype.is_complex)

    def ag(g, dtype=dtype):
        outs = [torch.empty(4, dtype=dtype) for _ in range(N)]
        dist.all_gather(outs, vals(R, 4, dtype), group=g)
        return outs
    case(f"all_gather {dtype}", ag, [vals(r, 4, dtype) for r in range(N)], moves_on_gloo)

    def agt(g, dtype=dtype):
        out = torch.empty(4 * N, dtype=dtype)
        dist._all_gather_base(out, vals(R, 4, dtype), group=g)
        return out
    case(f"all_gather_into_tensor {dtype}", agt, torch.cat([vals(r, 4, dtype) for r in range(N)]),
         TORCH2 and moves_on_gloo and not dtype.is_complex)

    def ga(g, dtype=dtype):
        outs = [torch.empty(3, dtype=dtype) for _ in range(N)] if R == 0 else None
        dist.gather(vals(R, 3, dtype), outs, dst=0, group=g)
        return outs
    case(f"gather {dtype}", ga, [vals(r, 3, dtype) for r in range(N)] if R == 0 else None,
         moves_on_gloo and not dtype.is_complex)

    def sc(g, dtype=dtype):
        out = torch.empty(3, dtype=dtype)
        ins = [vals(10 + r, 3, dtype) for r in range(N)] if R == N - 1 else None
        dist.scatter(out, ins, src=N - 1, group=g)
        return out
    case(f"scatter {dtype}", sc, vals(10 + R, 3, dtype), moves_on_gloo and not dtype.is_complex)

    def a2a(g, dtype=dtype):
        out = torch.empty(2 * N, dtype=dtype)
        dist.all_to_all_single(out, vals(R, 2 * N, dtype), group=g)
        return out
    case(f"all_to_all_single {dtype}", a2a,
         torch.cat([vals(r, 2 * N, dtype)[2 * R:2 * R + 2] for r in range(N)]),
         moves_on_gloo and not dtype.is_complex)

    def sr(g, dtype=dtype):
        got = torch.empty(6, dtype=dtype)
        w = dist.isend(vals(R, 6, dtype), (R + 1) % N, group=g)
        dist.recv(got, (R - 1) % N, group=g)
        w.wait()
        return got
    case(f"send/recv {dtype}", sr, vals((R - 1) % N, 6, dtype))

# ---- uneven sizes (gloo refuses all of these) ----------------------------------------------------
def ag_uneven(g):
    outs = [torch.empty(r + 1) for r in range(N)]
    dist.all_gather(outs, torch.full((R + 1,), float(R)), group=g)
    return outs
case("all_gather uneven", ag_uneven, [torch.full((r + 1,), float(r)) for r in range(N)], gloo=False)


def ag_inference(g):
    # Outputs made under inference mode are written from the thread that completes the op, which
    # must act in the caller's mode (torch refuses in-place writes to inference tensors outside
    # it); found by torch's own test_allgather_inference_mode. Async, so the progress thread does.
    with torch.inference_mode():
        outs = [torch.full((1000,), -1.0) for _ in range(N)]
        dist.all_gather(outs, torch.full((1000,), float(R)), group=g, async_op=True).wait()
        bc = torch.full((1000,), float(R))
        dist.broadcast(bc, 0, group=g, async_op=True).wait()
        return outs + [bc]
# (gloo=False: torch 1.13's gloo raises exactly that error; 2.x's carries the mode.)
case("all_gather and broadcast under inference_mode", ag_inference,
     [torch.full((1000,), float(r)) for r in range(N)] + [torch.zeros(1000)], gloo=False)


def rs_uneven(g):
    out = torch.empty(R + 2)
    dist.reduce_scatter(out, [torch.full((r + 2,), float(R + 1)) for r in range(N)], group=g)
    return out
case("reduce_scatter uneven", rs_uneven, torch.full((R + 2,), float(N * (N + 1) // 2)), gloo=False)


def a2a_list(g):
    outs = [torch.empty(R + 1 + r, dtype=torch.int64) for r in range(N)]
    dist.all_to_all(outs, [torch.full((j + 1 + R,), 100 * R + j) for j in range(N)], group=g)
    return outs
case("all_to_all uneven", a2a_list, [torch.full((R + 1 + r,), 100 * r + R) for r in range(N)],
     gloo=False)


def a2a_splits(g):
    # Rank R sends rank j (R + j) % 3 rows of 2; receives (j + R) % 3 rows from j.
    ins = [(R + j) % 3 for j in range(N)]
    outs = [(j + R) % 3 for j in range(N)]
    inp = torch.cat([torch.full(((R + j) % 3, 2), float(10 * R + j)) for j in range(N)])
    out = torch.empty(sum(outs), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=outs, input_split_sizes=ins, group=g)
    return out
case("all_to_all_single uneven splits", a2a_splits,
     torch.cat([torch.full(((j + R) % 3, 2), float(10 * j + R)) for j in range(N)]))

# ---- non-contiguous tensors (gloo reads strided views as if contiguous: wrong) -------------------
base = torch.arange(24, dtype=torch.float32).reshape(4, 6) + R


def ar_view(g, how):
    x = base.clone()
    v = x.t() if how == "transposed" else x[:, ::2]
    dist.all_reduce(v, group=g)
    return x


for how in ("transposed", "strided"):
    want = base.clone()
    idx = (slice(None), slice(None)) if how == "transposed" else (slice(None), slice(None, None, 2))
    want[idx] = (torch.arange(24, dtype=torch.float32).reshape(4, 6)[idx]) * N + N * (N - 1) // 2
    case(f"all_reduce {how} view", lambda g, how=how: ar_view(g, how), want, gloo=how == "transposed")


def bc_view(g):
    x = base.clone()
    dist.broadcast(x[:, 1::2], src=0, group=g)
    return x


want = base.clone()
want[:, 1::2] = (base - R)[:, 1::2]
case("broadcast strided view", bc_view, want, gloo=False)


def sr_view(g):
    x = torch.zeros(4, 6)
    w = dist.isend(base[:, ::3], (R + 1) % N, group=g)
    dist.recv(x[:, 1::3], (R - 1) % N, group=g)
    w.wait()
    return x


want = torch.zeros(4, 6)
want[:, 1::3] = (base - R + (R - 1) % N)[:, ::3]
case("send/recv strided views", sr_view, want, gloo=False)

# ---- coalesced, async and futures ----------------------------------------------------------------
def arc(g):
    ts = [torch.full((3,), float(R + 1)), torch.full((2, 2), float(R + 1))]
    dist.all_reduce_coalesced(ts, group=g)
    return ts
tri = float(N * (N + 1) // 2)
case("all_reduce_coalesced", arc, [torch.full((3,), tri), torch.full((2, 2), tri)])


def agc(g):
    outs = [[torch.empty(2), torch.empty(3)] for _ in range(N)]
    dist.all_gather_coalesced(outs, [torch.full((2,), float(R)), torch.full((3,), float(-R))],
                              group=g)
    return outs
case("all_gather_coalesced", agc,
     [[torch.full((2,), float(r)), torch.full((3,), float(-r))] for r in range(N)])


def futures(g):
    xs = [torch.full((1000 if i % 2 else 100003,), float(R + i)) for i in range(4)]
    works = [dist.all_reduce(x, async_op=True, group=g) for x in xs]
    res = [w.get_future().wait()[0] for w in works]
    for w in works:
        w.wait()
        assert w.is_completed()
    return res
case("async all_reduce futures", futures,
     [torch.full((1000 if i % 2 else 100003,), float(N * (N - 1) // 2 + N * i)) for i in range(4)])


def p2p_futures(g):
    got = torch.empty(5)
    rw = dist.irecv(got, (R - 1) % N, group=g)
    sw = dist.isend(torch.full((5,), float(R)), (R + 1) % N, group=g)
    return [rw.get_future().wait()[0], sw.get_future().wait()[0]]
case("isend/irecv futures", p2p_futures,
     [torch.full((5,), float((R - 1) % N)), torch.full((5,), float(R))], gloo=False)

checks += 1
dist.barrier()
dist.barrier(async_op=True).wait()

# ---- point to point ------------------------------------------------------------------------------
def any_source(g):
    if R == 0:
        got = {}
        for _ in range(N - 1):
            t = torch.empty(3)
            w = dist.irecv(t, group=g, tag=4)  # no src: from whichever rank sends first
            w.wait()
            got[w._source_rank()] = t
        return sorted((k, v.tolist()) for k, v in got.items())
    dist.send(torch.full((3,), float(R)), 0, group=g, tag=4)
    return None
case("irecv from any source", any_source,
     [(r, [float(r)] * 3) for r in range(1, N)] if R == 0 else None)


def batch(g):
    got = [torch.empty(4) for _ in range(2)]
    ops = [dist.P2POp(dist.isend, torch.full((4,), float(R)), (R + 1) % N, g),
           dist.P2POp(dist.irecv, got[0], (R - 1) % N, g),
           dist.P2POp(dist.isend, torch.full((4,), float(-R)), (R - 1) % N, g, tag=1),
           dist.P2POp(dist.irecv, got[1], (R + 1) % N, g, tag=1)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return got
case("batch_isend_irecv", batch,
     [torch.full((4,), float((R - 1) % N)), torch.full((4,), float(-((R + 1) % N)))])

# The issue's interleavings (ringreduce only: they are about its queue).
t0 = torch.ones(200000)
if R == 0:
    w = dist.isend(torch.full((300000,), 7.0), 1)
    dist.all_reduce(t0)
    back = torch.empty(10)
    dist.recv(back, 1)
    w.wait()
    checks += 1
    if not torch.equal(back, torch.full((10,), 8.0)):
        fail("isend -> collective -> recv", str(back))
elif R == 1:
    dist.all_reduce(t0)
    got = torch.empty(300000)
    w = dist.irecv(got, 0)
    dist.send(torch.full((10,), 8.0), 0)
    w.wait()
    checks += 1
    if not torch.equal(got, torch.full((300000,), 7.0)):
        fail("collective -> irecv -> send", str(got[:3]))
else:
    dist.all_reduce(t0)
# Many outstanding sends to every peer, received in reverse; a receive long before its send.
outs, ins, works = [], [], []
for k in range(10):
    for q in range(N):
        if q != R:
            outs.append(torch.full((100 + k,), float(1000 * R + k)))
            works.append(dist.isend(outs[-1], q, tag=k))
late = torch.empty(3)
lw = dist.irecv(late, (R - 1) % N, tag=99)
for k in reversed(range(10)):
    for q in range(N):
        if q != R:
            ins.append((q, k, torch.empty(100 + k)))
            works.append(dist.irecv(ins[-1][2], q, tag=k))
for w in works:
    w.wait()
checks += 1
for q, k, t in ins:
    if not torch.equal(t, torch.full((100 + k,), float(1000 * q + k))):
        fail("many outstanding sends", f"from {q} tag {k}: {t[:3]}")
dist.all_reduce(torch.ones(10))
time.sleep(0.1)
dist.send(torch.full((3,), float(R)), (R + 1) % N, tag=99)
lw.wait()
checks += 1
if not torch.equal(late, torch.full((3,), float((R - 1) % N))):
    fail("a receive posted long before its send", str(late))

# ---- objects, sparse, groups ----------------------------------------------------------------------
def objs(g):
    a = [{"rank": R, "x": [R] * R}]
    dist.broadcast_object_list(a, src=N - 1, group=g)
    b = [None] * N
    dist.all_gather_object(b, ("r", R, "y" * R), group=g)
    c = [None] * N if R == 0 else None
    dist.gather_object({R: R * R}, c, dst=0, group=g)
    d = [None]
    dist.scatter_object_list(d, [f"to {r}" for r in range(N)] if R == 0 else None, src=0, group=g)
    return [a, b, c, d]
case("object collectives", objs,
     [[{"rank": N - 1, "x": [N - 1] * (N - 1)}], [("r", r, "y" * r) for r in range(N)],
      [{r: r * r} for r in range(N)] if R == 0 else None, [f"to {R}"]])

if hasattr(dist, "send_object_list"):
    def sol(g):
        box = [None]
        if R == 0:
            dist.send_object_list([{"from": 0}], dst=1, group=g)
            return None
        if R == 1:
            dist.recv_object_list(box, src=0, group=g)
            return box
        return None
    case("send/recv_object_list", sol, [{"from": 0}] if R == 1 else None)


def sparse(g):
    i = torch.tensor([[R, R + 1], [0, 1]])
    t = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0]), (N + 1, 2))
    w = dist.all_reduce(t, group=g, async_op=True)
    w.wait()
    return w.result()[0].to_dense()


want = torch.zeros(N + 1, 2)
for r in range(N):
    want[r, 0] += 1.0
    want[r + 1, 1] += 2.0
case("all_reduce sparse", sparse, want)

# Groups: a subgroup's collectives interleaved with the world's; members in any order.
sub = dist.new_group([N - 1, 0])
rev = dist.new_group(list(reversed(range(N))))
x, y = torch.full((5,), float(R)), torch.full((5,), 1.0)
if R in (0, N - 1):
    w = dist.all_reduce(x, group=sub, async_op=True)
dist.all_reduce(y, group=rev)
if R in (0, N - 1):
    w.wait()
    checks += 1
    if not torch.equal(x, torch.full((5,), float(N - 1))):
        fail("new_group all_reduce", str(x))
checks += 1
if not torch.equal(y, torch.full((5,), float(N))):
    fail("reversed new_group all_reduce", str(y))
if TORCH2 and N % 2 == 0:
    mine, _ = dist.new_subgroups(group_size=2)
    z = torch.full((2,), float(R))
    dist.all_reduce(z, group=mine)
    checks += 1
    if not torch.equal(z, torch.full((2,), float((R // 2) * 4 + 1))):
        fail("new_subgroups all_reduce", str(z))

# A collective issued from a future's callback (as PowerSGD's DDP hook does): the callback runs in
# the thread that completed the op, maybe ringreduce's progress thread; it must not deadlock.
big, small, later = torch.ones(100003), torch.ones(10), []


def issue_next(fut):
    later.append(dist.all_reduce(small, async_op=True))
    return fut.value()


dist.all_reduce(big, async_op=True).get_future().then(issue_next).wait()
later[0].wait()
checks += 1
if not torch.equal(small, torch.full((10,), float(N))):
    fail("collective from a future callback", str(small))

# The sequence number of the group (torch's desync debugging) agrees on every rank; the monitored
# barrier (torch's Python wrapper allows it for gloo only; the group's own method works).
# On torch 2.x the ProcessGroup wrapper answers for gloo, nccl and ucc only ("ProcessGroup custom
# does not yet support sequence numbers"): the backend under it is asked.
pg = dist.distributed_c10d._get_default_group()
seq_of = pg._get_backend(torch.device("cpu")) if TORCH2 else pg
seq = torch.tensor([seq_of._get_sequence_number_for_group()], dtype=torch.int64)
seqs = [torch.zeros(1, dtype=torch.int64) for _ in range(N)]
dist.all_gather(seqs, seq)
checks += 1
if len({int(t) for t in seqs}) != 1 or int(seq) == 0:
    fail("sequence numbers", str(seqs))
try:
    pg.monitored_barrier()
    checks += 1
except Exception as e:  # noqa: BLE001
    fail("monitored_barrier through the group", f"{type(e).__name__}: {e}")

# ---- errors name the call and the ranks, on every rank --------------------------------------------
# Blocks are whole rows: a dim 0 that does not divide over the ranks is refused, not split mid-row.
try:
    dist.all_to_all_single(torch.empty(N + 1, 2), torch.zeros(N + 1, 2))
    fail("all_to_all_single of N+1 rows", "accepted")
except ValueError as e:
    checks += 1
    if "dim 0" not in str(e):
        fail("all_to_all_single of N+1 rows", str(e))
try:
    dist.all_reduce(torch.ones(2, dtype=torch.complex64), op=dist.ReduceOp.MAX)
    fail("complex MAX", "accepted")
except (RuntimeError, ValueError) as e:
    checks += 1
    if "complex" not in str(e):
        fail("complex MAX", str(e))

dist.barrier()
dist.destroy_process_group()
print("OK" if not failures else "FAILED", checks, flush=True)
sys.exit(1 if failures else 0)
