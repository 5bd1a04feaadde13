#!/usr/bin/env python3
"""How much of DDP's gradient allreduce hides behind backprop: one rank of the benchmark.

    build/tools/ringrun -n 2 python3 bench/drivers/ddp_overlap.py --backend ringreduce
    build/tools/ringrun -n 2 python3 bench/drivers/ddp_overlap.py --backend gloo

A model whose gradients are large enough for communication to matter (an MLP of --width wide
layers, 42M parameters by default: 168 MB of float32 gradients), DDP with its default 25 MiB
buckets, synthetic data, one thread per rank. Four timings in the same processes, each the
median over --steps steps after --warmup:
  - step:   forward + backward (DDP's bucket allreduces overlapped with it) + optimizer step;
  - nocomm: the same step with DDP's buckets filled and emptied as usual but no allreduce (a comm
            hook that returns the bucket as it is): what DDP costs without communication;
  - ideal:  the same step under DDP's no_sync(): no buckets, no communication;
  - comm:   the gradients' allreduce alone, bucket by bucket as DDP sends them (25 MiB each),
            with nothing to hide behind.
All four run in the same processes, competing for the same cores. Rank 0 prints one line:
  ddp: backend=B ranks=N params=P step_ms=S nocomm_ms=D ideal_ms=I comm_ms=C overhead_ms=S-D
       hidden=H
where hidden = 1 - (step - nocomm) / comm: the share of the communication that backprop covered
(1: all of it; 0: none, the step paid the whole allreduce on top).

Memory: by default the ranks run with glibc's malloc told to keep what it frees
(GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=...). torch allocates each
large gradient afresh every step; glibc maps such blocks anew and unmaps them when freed, so
every step touches fresh pages, and on a VM where a first touch costs 18 us per 4 KiB page (this
one) the page faults took more of a step than the arithmetic, and varied by seconds. --malloc
system leaves glibc's defaults.
"""

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

# glibc reads its tunables at start-up: re-exec with them before anything large is allocated.
_KEEP = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
_malloc = argparse.ArgumentParser(add_help=False)
_malloc.add_argument("--malloc", choices=["keep", "system"], default="keep")
if _malloc.parse_known_args()[0].malloc == "keep" and os.environ.get("GLIBC_TUNABLES") != _KEEP:
    os.environ["GLIBC_TUNABLES"] = _KEEP
    os.execv(sys.executable, [sys.executable] + sys.argv)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import example_env  # noqa: E402  (examples/example_env.py: the interpreter, the build tree)

example_env.prepare()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["ringreduce", "gloo"], default="ringreduce")
    p.add_argument("--width", type=int, default=4096, help="hidden width (default 4096)")
    p.add_argument("--layers", type=int, default=2, help="hidden width x width layers")
    p.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    p.add_argument("--malloc", choices=["keep", "system"], default="keep",
                   help="keep: glibc keeps freed memory (default); system: glibc's defaults")
    return p.parse_args()


def median_ms(fn, steps, warmup):
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    if args.backend == "ringreduce":
        import ringreduce.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()

    width, inner = args.width, 1024
    layers = [torch.nn.Linear(inner, width), torch.nn.ReLU()]
    for _ in range(args.layers):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers += [torch.nn.Linear(width, inner)]
    net = torch.nn.Sequential(*layers)
    params = sum(p.numel() for p in net.parameters())
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
    # DDP's own allreduce hook, or (nocomm) the bucket handed back untouched: the same Python
    # hook path either way, so the difference is the communication alone.
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    comm_on = [True]

    def hook(state, bucket):
        if comm_on[0]:
            return allreduce_hook(None, bucket)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, inner)
    y = torch.randn(args.batch, inner)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    def nocomm():
        comm_on[0] = False
        try:
            step()
        finally:
            comm_on[0] = True

    def ideal():
        with model.no_sync():
            step()

    # The allreduce alone, in DDP's buckets: the gradients' bytes cut into bucket-sized pieces.
    flat = torch.randn(params)
    bucket = int(args.bucket_mb * 1024 * 1024) // 4
    pieces = [flat[i:i + bucket] for i in range(0, flat.numel(), bucket)]

    def comm():
        works = [dist.all_reduce(p, async_op=True) for p in pieces]
        for w in works:
            w.wait()

    # Interleaved, so that the four see the same machine; each phase starts together.
    phases = (("step", step), ("nocomm", nocomm), ("ideal", ideal), ("comm", comm))
    results = {name: [] for name, _ in phases}
    for _ in range(3):
        for name, fn in phases:
            dist.barrier()
            results[name].append(median_ms(fn, args.steps, args.warmup))
    # The slowest rank's figure of the best round.
    best = torch.tensor([min(results[name]) for name, _ in phases], dtype=torch.float64)
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    s, d, i, c = best.tolist()
    if rank == 0:
        hidden = 1 - (s - d) / c if c > 0 else float("nan")
        print(f"ddp: backend={args.backend} ranks={world} params={params} "
              f"grad_mb={params * 4 / 1e6:.0f} step_ms={s:.1f} nocomm_ms={d:.1f} ideal_ms={i:.1f} "
              f"comm_ms={c:.1f} overhead_ms={s - d:.1f} hidden={hidden:.2f}", flush=True)
    # No destroy_process_group(): with torch 1.13's gloo it could hang at exit here; the
    # process's end closes every connection either way.
    dist.barrier()


if __name__ == "__main__":
    main()
