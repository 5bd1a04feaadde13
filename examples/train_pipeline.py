#!/usr/bin/env python3
"""Two-stage pipeline-parallel training over torch.distributed send/recv, ringreduce (or gloo).

Trains a four-layer MLP on scikit-learn's handwritten digits (1797 8x8 images, 10 classes),
split in two halves, one per rank:

    rank 0 (stage 0): Linear(64, H) ReLU Linear(H, H) ReLU   -> activations (mb x H)
    rank 1 (stage 1): Linear(H, H) ReLU Linear(H, 10)        -> logits, cross-entropy loss

    build/tools/ringrun -n 2 python3 examples/train_pipeline.py --backend ringreduce
    build/tools/ringrun -n 2 python3 examples/train_pipeline.py --backend gloo
    python3 examples/train_pipeline.py            # one process runs both stages (the reference)

Each optimizer step takes a batch of --batch samples cut into --micro micro-batches (a GPipe
step with the last stage running one-forward-one-backward): rank 0 runs stage 0 forward on
every micro-batch and isends each activation as soon as it has it (tag 0); rank 1 receives one,
runs stage 1 forward, the loss and backward, and isends d(loss)/d(activation) back (tag 1)
while rank 0 is still sending the next ones; rank 0 receives each gradient in turn and runs
stage 0's backward with it. Gradients accumulate over the micro-batches (each micro-batch's
loss is its mean divided by --micro, so the sum is the batch mean), then both ranks step their
own optimizer (SGD with momentum) on their own half. Both ranks load the same data with the
same seed, so rank 1 knows the labels without receiving them.

This is, up to nothing at all (activations and gradients cross unchanged), the computation one
process does running both stages on the same micro-batches, which is what the script does when
no launcher sets WORLD_SIZE; tests/python/test_torch_programs.py compares the final parameters
of ringreduce, gloo and that one process.

Rank 1 prints, per epoch, the mean training loss, the test accuracy (rank 0 sends stage 0's
activations of the test set) and the median time of one step; at the end a line
`final: backend=... ranks=2 steps=... test_acc=... loss=... step_ms_median=...` (loss: the mean
training loss of the last epoch). It needs exactly 2 ranks.
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
WARMUP_STEPS = 5   # left out of the overall median step time
TAG_ACT, TAG_GRAD = 0, 1


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["ringreduce", "gloo"], default="ringreduce")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=64, help="samples per optimizer step")
    p.add_argument("--micro", type=int, default=4, help="micro-batches per step (divides --batch)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--save", default=None,
                   help="rank 1 saves the flattened final parameters of both stages (.npy)")
    p.add_argument("--quiet", action="store_true", help="print only the final line")
    return p.parse_args()


def load_data():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)  # pixels are 0..16
    y = d.target.astype(np.int64)
    perm = np.random.RandomState(SEED).permutation(len(y))
    x, y = torch.from_numpy(x[perm]), torch.from_numpy(y[perm])
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def build_stages(hidden):
    """The whole MLP, built from the same seed on every rank, cut in two halves."""
    torch.manual_seed(SEED)
    L = torch.nn.Linear
    net = torch.nn.Sequential(L(64, hidden), torch.nn.ReLU(), L(hidden, hidden), torch.nn.ReLU(),
                              L(hidden, hidden), torch.nn.ReLU(), L(hidden, 10))
    return net[:4], net[4:]


def flat(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


class Pipeline:
    """One rank's part of the step. `stage` is this rank's half (rank 0 or 1), or, in the one
    process reference, None (both halves here, nothing sent)."""

    def __init__(self, args, stages, stage):
        self.args, self.stage = args, stage
        self.s0, self.s1 = stages
        mine = [p for i, s in enumerate(stages) if stage in (None, i) for p in s.parameters()]
        self.opt = torch.optim.SGD(mine, lr=args.lr, momentum=args.momentum)

    def step(self, xb, yb):
        """One optimizer step on a batch; returns the batch's mean loss on rank 1 (or the one
        process), 0.0 on rank 0."""
        m = self.args.micro
        xs, ys = xb.chunk(m), yb.chunk(m)
        self.opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        if self.stage is None:
            for x, y in zip(xs, ys):
                loss = F.cross_entropy(self.s1(self.s0(x)), y) / m
                loss.backward()
                loss_sum += loss.item()
        elif self.stage == 0:
            acts, sends = [], []
            for x in xs:  # all forwards first, each activation on its way as soon as it exists
                a = self.s0(x)
                acts.append(a)
                sends.append(dist.isend(a.detach(), 1, tag=TAG_ACT))
            for a in acts:  # then each gradient as rank 1 sends it back, in order
                g = torch.empty_like(a)
                dist.recv(g, 1, tag=TAG_GRAD)
                a.backward(g)
            for w in sends:
                w.wait()
        else:
            sends, grads = [], []
            for x, y in zip(xs, ys):
                a = torch.empty(len(x), self.args.hidden)
                dist.recv(a, 0, tag=TAG_ACT)
                a.requires_grad_()
                loss = F.cross_entropy(self.s1(a), y) / m
                loss.backward()
                grads.append(a.grad)  # kept until its isend completes
                sends.append(dist.isend(a.grad, 0, tag=TAG_GRAD))
                loss_sum += loss.item()
            for w in sends:
                w.wait()
        self.opt.step()
        return loss_sum

    def accuracy(self, xte, yte):
        """Test accuracy, known on rank 1 (and the one process); None on rank 0."""
        with torch.no_grad():
            if self.stage is None:
                return (self.s1(self.s0(xte)).argmax(1) == yte).float().mean().item()
            if self.stage == 0:
                dist.send(self.s0(xte).contiguous(), 1, tag=TAG_ACT)
                return None
            a = torch.empty(len(xte), self.args.hidden)
            dist.recv(a, 0, tag=TAG_ACT)
            return (self.s1(a).argmax(1) == yte).float().mean().item()

    def all_params(self):
        """Both stages' parameters, flattened, on rank 1 (and the one process); None on rank 0."""
        if self.stage is None:
            return torch.cat([flat(self.s0), flat(self.s1)])
        if self.stage == 0:
            dist.send(flat(self.s0), 1)
            return None
        first = torch.empty(sum(p.numel() for p in self.s0.parameters()))
        dist.recv(first, 0)
        return torch.cat([first, flat(self.s1)])


def main():
    args = parse_args()
    torch.set_num_threads(1)
    if args.batch % args.micro:
        sys.exit(f"--micro {args.micro} does not divide --batch {args.batch}")

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        world = int(os.environ["WORLD_SIZE"])
        if world != 2:
            sys.exit(f"train_pipeline.py is a two-stage pipeline: it runs on exactly 2 ranks, not "
                     f"{world} (ringrun -n 2 ...; or no launcher at all for the one-process "
                     f"reference)")
        if args.backend == "ringreduce":
            import ringreduce.torch  # noqa: F401  (registers the backend)
        dist.init_process_group(args.backend, timeout=timedelta(seconds=120))
        rank = dist.get_rank()
        assert dist.get_world_size() == 2
    else:
        rank, world = None, 1
    last = rank in (None, 1)  # the rank that has the loss and prints

    xtr, ytr, xte, yte = load_data()
    pipe = Pipeline(args, build_stages(args.hidden), rank)

    def log(*a):
        if last and not args.quiet:
            print(*a, flush=True)

    name = args.backend if distributed else "none"
    log(f"backend={name} ranks={world} batch={args.batch} micro_batches={args.micro} "
        f"train={len(ytr)} test={len(yte)}")
    batches = len(ytr) // args.batch  # the last partial batch is dropped
    all_ms, step, acc, train_loss = [], 0, 0.0, float("nan")
    for epoch in range(args.epochs):
        order = torch.from_numpy(np.random.RandomState(SEED + 1 + epoch).permutation(len(ytr)))
        loss_sum, ms = 0.0, []
        for b in range(batches):
            if args.steps is not None and step >= args.steps:
                break
            idx = order[b * args.batch:(b + 1) * args.batch]
            t0 = time.perf_counter()
            loss_sum += pipe.step(xtr[idx], ytr[idx])
            ms.append((time.perf_counter() - t0) * 1e3)
            step += 1
        if not ms:
            break
        train_loss = loss_sum / len(ms)
        all_ms += ms
        acc = pipe.accuracy(xte, yte)
        if last:
            log(f"epoch {epoch + 1:3d}  steps {len(ms):3d}  train_loss {train_loss:.4f}  "
                f"test_acc {acc:.4f}  step_ms_median {statistics.median(ms):.3f}")

    params = pipe.all_params()
    steady = all_ms[WARMUP_STEPS:] or all_ms
    if last:
        print(f"final: backend={name} ranks={world} steps={step} micro_batches={args.micro} "
              f"test_acc={acc:.4f} loss={train_loss:.4f} "
              f"step_ms_median={statistics.median(steady) if steady else float('nan'):.3f}",
              flush=True)
        if args.save:
            np.save(args.save, params.numpy())
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
