"""torch.distributed send/recv ping-pong timed per size, for one backend.

    ringrun -n 2 /usr/bin/python3 bench/drivers/torch_p2p.py --backend ringreduce -b 4 -e 64M -f 4

Ranks pair up (0 with 1, 2 with 3, ...; every pair at once): the even rank sends a float32 tensor
of the size and receives it back, the odd one receives and sends it back, with blocking
dist.send/dist.recv. Rank 0 prints one row per size: size (B), the one-way time (us: half the
round trip, mean of the fastest of --reps timed batches), the bandwidth (GB/s: size / one-way
time) and #wrong (elements of the last message off what was sent).
"""

import sys
import time

from torch_bench import parse_size, start  # first: it finds the interpreter that has torch

import torch
import torch.distributed as dist

args, R, N = start(default_max="64M")
if N % 2:
    sys.exit("torch_p2p.py: ranks pair up: run an even number of them")
peer = R ^ 1
if R == 0:
    print(f"# torch {torch.__version__} backend {args.backend} ranks {N} (pairs ping-pong)",
          flush=True)
    print(f"# {'size':>12} {'time':>10} {'bw':>8} {'#wrong':>6}", flush=True)
    print(f"# {'(B)':>12} {'(us)':>10} {'(GB/s)':>8}", flush=True)


def round_trip(buf, back):
    if R % 2 == 0:
        dist.send(buf, peer)
        dist.recv(back, peer)
    else:
        dist.recv(back, peer)
        dist.send(back, peer)


size = parse_size(args.minbytes)
maxbytes = parse_size(args.maxbytes)
while size <= maxbytes:
    n = max(1, size // 4)
    buf = torch.arange(n, dtype=torch.float32) + R
    back = torch.empty(n, dtype=torch.float32)
    for _ in range(3):  # warm up: connections, buffers, caches
        round_trip(buf, back)
    # Iterations per batch from one timed trip, agreed on by every rank (they must match).
    t0 = time.perf_counter()
    round_trip(buf, back)
    est = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    iters = max(1, min(20000, int(args.budget / max(est.item(), 1e-7))))
    best = float("inf")
    for _ in range(args.reps):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            round_trip(buf, back)
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        best = min(best, t.item())
    # The even rank got its own message back; the odd one the even rank's.
    want = torch.arange(n, dtype=torch.float32) + (R if R % 2 == 0 else peer)
    wrong = int((back != want).sum())
    one_way = best / 2
    if R == 0:
        print(f"  {n * 4:>12} {one_way * 1e6:>10.2f} {n * 4 / one_way / 1e9:>8.3f} {wrong:>6}",
              flush=True)
    size *= args.stepfactor

dist.barrier()
dist.destroy_process_group()
