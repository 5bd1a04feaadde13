"""torch.distributed.all_reduce timed per size, nccl-tests style, for one backend.

    ringrun -n 4 /usr/bin/python3 bench/drivers/torch_allreduce.py --backend ringreduce -b 4 -e 256M -f 4

Rank 0 prints one row per size: size (B), count, type, redop, time (us, mean per call of the
fastest of --reps timed batches), algbw, busbw (GB/s; busbw = algbw * 2(N-1)/N as nccl-tests),
#wrong (elements off the expected sum after the timed calls). float32 sum in place, one thread per
rank (torch.set_num_threads(1)): what DDP's gradient allreduces are, minus the overlap.
"""

import time

from torch_bench import parse_size, start  # first: it finds the interpreter that has torch

import torch
import torch.distributed as dist

args, R, N = start(default_max="256M")
if R == 0:
    print(f"# torch {torch.__version__} backend {args.backend} ranks {N}", flush=True)
    print(f"# {'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time':>10} {'algbw':>7} "
          f"{'busbw':>7} {'#wrong':>6}", flush=True)
    print(f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'(us)':>10} {'(GB/s)':>7} "
          f"{'(GB/s)':>7}", flush=True)

size = parse_size(args.minbytes)
maxbytes = parse_size(args.maxbytes)
while size <= maxbytes:
    count = max(1, size // 4)
    t = torch.ones(count)
    # Calibrate the batch length on a few calls, agreed on by every rank (max of their
    # estimates), so that every rank makes the same number of calls.
    for _ in range(2):
        dist.all_reduce(t)
    t0 = time.perf_counter()
    dist.all_reduce(t)
    est = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    iters = int(max(2, min(10000, args.budget / max(float(est[0]), 1e-7))))
    best = float("inf")
    for _ in range(args.reps):
        t.fill_(1.0)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        # The slowest rank's time is the collective's.
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        best = min(best, float(elapsed[0]) / iters)
    # After iters in-place sums of ones: N ** iters (exact in float32 while it fits; check the
    # last call alone instead).
    t.fill_(1.0)
    dist.all_reduce(t)
    wrong = int((t != float(N)).sum())
    if R == 0:
        algbw = count * 4 / best / 1e9
        busbw = algbw * 2 * (N - 1) / N
        print(f"  {count * 4:>12} {count:>12} {'float':>6} {'sum':>6} {best * 1e6:>10.1f} "
              f"{algbw:>7.3f} {busbw:>7.3f} {wrong:>6}", flush=True)
    del t
    size *= args.stepfactor
dist.destroy_process_group()
