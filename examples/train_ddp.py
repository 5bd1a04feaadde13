#!/usr/bin/env python3
"""Data-parallel training with torch DistributedDataParallel over ringreduce (or gloo).

Trains a small MLP on scikit-learn's handwritten digits (1797 8x8 images, 10 classes):

    build/tools/ringrun -n 4 python3 examples/train_ddp.py --backend ringreduce
    build/tools/ringrun -n 4 python3 examples/train_ddp.py --backend gloo
    python3 examples/train_ddp.py                 # one process, no process group
    build/tools/ringrun -n 4 python3 examples/train_ddp.py --hook fp8-ef   # gradients as fp8

--hook sends the gradients compressed: fp16 (torch's fp16_compress_hook), powersgd (torch's
PowerSGD, rank 2), or ringreduce's wire formats (ringreduce.torch.hooks.wire_hook, ringreduce
backend only: bf16, f16, fp8, each with -ef for error feedback); docs/WIRE.md compares them.

Synchronous data-parallel SGD here is, up to float rounding, the same computation as
single-process SGD: every rank walks the same global batches (size --batch, seeded shuffle
per epoch) in the same order and takes the r-th contiguous slice (batch/N samples) of each;
its loss is the mean over that slice, and DDP averages the gradients over the ranks, so
the average of the local means is the mean over the global batch. tests/python/test_ddp.py
checks that the final parameters at 2 and 4 ranks match one process.

Rank 0 prints, per epoch, the mean training loss, the test accuracy and the median time of
one training step (forward + backward with DDP's gradient allreduce + optimizer step), and
at the end a line `final: backend=... ranks=... test_accuracy=... step_ms_median=...
time_to_target_s=...` (the training time, steps only, until the test accuracy first reached
--target at an epoch's end; nan if it never did).
"""

import os
import sys

import example_env  # noqa: E402  (examples/example_env.py: the interpreter, the build tree)

example_env.prepare()
import torch  # noqa: E402

import argparse
import statistics
import time
from datetime import timedelta

import numpy as np
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits

SEED = 1234
N_TRAIN = 1500
WARMUP_STEPS = 5  # excluded from the overall median step time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["ringreduce", "gloo"], default="ringreduce")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=64, help="global batch size (divisible by ranks)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--save", default=None, help="rank 0 saves the flattened final parameters (.npy)")
    p.add_argument("--quiet", action="store_true", help="print only the final line")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model and its gradients live (cuda: GPU LOCAL_RANK mod the "
                        "GPUs; the backend then reduces CUDA tensors)")
    p.add_argument("--hook", default="none",
                   choices=["none", "fp16", "powersgd", "bf16", "bf16-ef", "f16", "f16-ef", "fp8",
                            "fp8-ef"],
                   help="DDP communication hook (default none: float32 gradients)")
    p.add_argument("--target", type=float, default=0.95,
                   help="test accuracy whose first epoch time_to_target_s reports")
    return p.parse_args()


def register_hook(model, name, backend):
    """DDP's gradients compressed by `name` (--hook)."""
    if name == "none":
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    if name == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                            start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        if backend != "ringreduce":
            sys.exit(f"--hook {name}: ringreduce's wire formats need --backend ringreduce")
        from ringreduce.torch.hooks import wire_hook
        wire, _, ef = name.partition("-")
        model.register_comm_hook(None, wire_hook(wire, error_feedback=bool(ef)))


def load_data():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)  # pixels are 0..16
    y = d.target.astype(np.int64)
    perm = np.random.RandomState(SEED).permutation(len(y))
    x, y = torch.from_numpy(x[perm]), torch.from_numpy(y[perm])
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(SEED)

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        if args.backend == "ringreduce":
            import ringreduce.torch  # noqa: F401  (registers the backend)
        dist.init_process_group(args.backend, timeout=timedelta(seconds=120))
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    if args.batch % world:
        sys.exit(f"--batch {args.batch} is not divisible by the {world} ranks")
    local = args.batch // world

    dev = torch.device("cpu")
    if args.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    xtr, ytr, xte, yte = (t.to(dev) for t in load_data())
    # Same seed on every rank, so the same initial parameters (DDP broadcasts rank 0's anyway).
    net = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10)).to(dev)
    model = torch.nn.parallel.DistributedDataParallel(
        net, device_ids=[dev.index] if dev.type == "cuda" else None) if distributed else net
    if distributed:
        register_hook(model, args.hook, args.backend)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    def log(*a):
        if rank == 0 and not args.quiet:
            print(*a, flush=True)

    def accuracy():
        with torch.no_grad():
            return (net(xte).argmax(1) == yte).float().mean().item()

    log(f"backend={args.backend if distributed else 'none'} ranks={world} device={dev} "
        f"global_batch={args.batch} local_batch={local} train={len(ytr)} test={len(yte)}")
    batches = len(ytr) // args.batch  # the last partial batch is dropped
    all_ms, step, acc, to_target = [], 0, 0.0, float("nan")
    for epoch in range(args.epochs):
        order = torch.from_numpy(
            np.random.RandomState(SEED + 1 + epoch).permutation(len(ytr))).to(dev)
        loss_sum, ms = torch.zeros(1, dtype=torch.float64), []
        for b in range(batches):
            if args.steps is not None and step >= args.steps:
                break
            idx = order[b * args.batch + rank * local: b * args.batch + (rank + 1) * local]
            xb, yb = xtr[idx], ytr[idx]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)  # mean over the local slice
            loss.backward()  # DDP averages the gradients over the ranks here
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)  # the step's time, not its launches'
            ms.append((time.perf_counter() - t0) * 1e3)
            loss_sum += loss.item()
            step += 1
        if not ms:
            break
        if distributed:  # mean of the ranks' local means = mean over the global batches
            dist.all_reduce(loss_sum)
        train_loss = loss_sum.item() / world / len(ms)
        all_ms += ms
        acc = accuracy() if rank == 0 else 0.0
        if acc >= args.target and to_target != to_target:
            to_target = sum(all_ms) / 1e3
        log(f"epoch {epoch + 1:3d}  steps {len(ms):3d}  train_loss {train_loss:.4f}  "
            f"test_acc {acc:.4f}  step_ms_median {statistics.median(ms):.3f}")

    steady = all_ms[WARMUP_STEPS:] or all_ms
    if rank == 0:
        print(f"final: backend={args.backend if distributed else 'none'} ranks={world} "
              f"device={dev.type} "
              f"steps={step} test_accuracy={acc:.4f} "
              f"step_ms_median={statistics.median(steady) if steady else float('nan'):.3f} "
              f"hook={args.hook} time_to_target_s={to_target:.3f}",
              flush=True)
        if args.save:
            np.save(args.save, flat_params(net))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
