#!/usr/bin/env python3
"""Elastic data-parallel training: DDP over ringreduce that keeps going when a rank dies.

    build/tools/ringrun --elastic -n 4 python3 examples/train_elastic.py --kill-step 40
    build/tools/ringrun --elastic -n 4 python3 examples/train_elastic.py --kill-step 40 --replace
    build/tools/ringrun -n 4 python3 examples/train_elastic.py              # undisturbed
    torchrun --nproc-per-node 4 --max-restarts 1 examples/train_elastic.py \\
        --kill-step 40 --checkpoint /tmp/elastic.pt                          # the old way

Trains a small MLP on scikit-learn's digits (as examples/train_ddp.py). With --kill-step S, one
rank (--kill-rank, default the last; never rank 0, whose process hosts torch's env:// store)
SIGKILLs itself during the backward of step S, inside DDP's gradient allreduce. The others:

  1. get the error from that step (DDP's allreduce fails on every survivor within ~0.1 s);
  2. agree on who is gone (ringreduce.torch.agree: over ringreduce's own connections);
  3. shrink_group(gone, SHRINK_ABORT) (torch 2.14's dist.shrink_group, through
     ringreduce.torch.shrink_group, which repairs what torch registers for DDP): the default
     group is now the survivors;
  4. take rank 0's model, optimizer state and step (rank 0 may have finished step S, another may
     not have: everyone adopts one state), re-shard the global batch over the survivors, rebuild
     DDP, and go on;
  5. with --replace, rank 0 starts a replacement process, which joins by torch's reconfigure:
     every member and the newcomer leave a handle (get_reconfigure_handle) in the store and call
     reconfigure with all of them (torch's _reconfigure, on the backend); it receives the model
     by broadcast and training goes on at N again.

Synchronous data-parallel SGD: every rank takes its contiguous slice of each global batch, so the
computation does not depend on the number of ranks (up to rounding), and a run that shrinks ends
within rounding of an undisturbed one; the test-set accuracy is compared. Under torchrun
--max-restarts with --checkpoint, rank 0 saves the state every --checkpoint-every steps and a
restarted job resumes from it: the restart-everything path, for comparison.

Each rank prints at the end `final: world=... steps=... test_accuracy=... param_sum=...`; a
recovery prints `recovered: ...` with the seconds from the kill to the first completed step after
it (the kill's time is in the store, or in --checkpoint's side file under torchrun).
"""

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import example_env  # noqa: E402  (examples/example_env.py: the interpreter, the build tree)

example_env.prepare()
import torch  # noqa: E402

import argparse

import numpy as np
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits

import ringreduce.torch as rt

SEED = 1234
N_TRAIN = 1500


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=60, help="global batch (divisible by 2, 3, 4)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--kill-step", type=int, default=None)
    p.add_argument("--kill-rank", type=int, default=None, help="default: the last rank")
    p.add_argument("--replace", action="store_true", help="a new process joins after the shrink")
    p.add_argument("--checkpoint", default=None, help="torchrun mode: save and resume here")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--join", default=None, help=argparse.SUPPRESS)  # a replacement: its generation
    return p.parse_args()


def load_data():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    perm = np.random.RandomState(SEED).permutation(len(y))
    x, y = torch.from_numpy(x[perm]), torch.from_numpy(y[perm])
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


class Trainer:
    def __init__(self, args, store):
        self.args, self.store = args, store
        self.xtr, self.ytr, self.xte, self.yte = load_data()
        torch.manual_seed(SEED)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(args.hidden, 10))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=args.lr, momentum=0.9)
        self.step = 0
        self.model = None

    def sync_state(self):
        """Everyone takes rank 0's parameters, momentum and step, and DDP is rebuilt on the
        current default group (whose size a shrink or a reconfigure changed)."""
        with torch.no_grad():
            for p in self.net.parameters():
                dist.broadcast(p.data, src=0)
                buf = self.opt.state.setdefault(p, {}).get("momentum_buffer")
                if buf is None:
                    buf = torch.zeros_like(p.data)
                    self.opt.state[p]["momentum_buffer"] = buf
                dist.broadcast(buf, src=0)
        step = torch.tensor([self.step], dtype=torch.int64)
        dist.broadcast(step, src=0)
        self.step = int(step[0])
        self.model = torch.nn.parallel.DistributedDataParallel(self.net)

    def train_step(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        b = self.args.batch
        nb = len(self.ytr) // b
        epoch, k = divmod(self.step, nb)
        order = np.random.RandomState(SEED + 1 + epoch).permutation(len(self.ytr))
        lo = (b * rank) // world
        hi = (b * (rank + 1)) // world
        idx = torch.from_numpy(order[k * b + lo:k * b + hi])
        self.opt.zero_grad(set_to_none=True)
        # The mean over the global batch: each rank's sum over its slice, divided by the global
        # batch, and DDP's average multiplied back by the ranks.
        loss = F.cross_entropy(self.model(self.xtr[idx]), self.ytr[idx], reduction="sum") * world / b
        loss.backward()
        self.opt.step()
        self.step += 1

    def accuracy(self):
        with torch.no_grad():
            return (self.net(self.xte).argmax(1) == self.yte).float().mean().item()

    def save(self, path):
        torch.save({"net": self.net.state_dict(), "opt": self.opt.state_dict(), "step": self.step},
                   path + ".tmp")
        os.replace(path + ".tmp", path)

    def load(self, path):
        state = torch.load(path)
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
        self.step = state["step"]


def side_store(addr, port):
    """A client of torch's env:// store (rank 0's process hosts it), for what the job says to
    itself: the kill's time, the reconfigure handles. Without libuv: Debian's torch has none,
    and the classic server answers either client."""
    return dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=60),
                         use_libuv=False)


def main():
    args = parse_args()
    torch.set_num_threads(1)
    if not hasattr(dist, "shrink_group"):
        sys.exit(f"train_elastic needs torch's shrink_group and _reconfigure (torch 2.14); "
                 f"this is torch {torch.__version__}")
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if args.join is not None:
        # A replacement: no members until the reconfigure names them.
        store = side_store(addr, port)
        gen = args.join
        world = int(store.get(f"elastic/{gen}/world").decode())
        dist.init_process_group("ringreduce", store=dist.PrefixStore("replacement", store),
                                rank=world - 1, world_size=world, enable_reconfigure=True,
                                timeout=timedelta(seconds=60))
    elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # Under torchrun: its agent's store, as env:// would reach it, but without libuv (torch
        # 2.14's env:// asks the agent's store for libuv whatever USE_LIBUV says, and Debian's
        # torch has none); a namespace per attempt, since the store outlives a restart.
        store = side_store(addr, port)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group("ringreduce", store=dist.PrefixStore(f"attempt{attempt}", store),
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timedelta(seconds=60))
    else:
        dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
        store = side_store(addr, port)
    trainer = Trainer(args, store)
    torchrun_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.checkpoint and torchrun_attempt > 0 and os.path.exists(args.checkpoint):
        trainer.load(args.checkpoint)  # the restart-everything path resumes here

    def rejoin(gen, members, newcomer):
        """The members (`members` of them) and the newcomer reconfigure into one communicator:
        each leaves its handle in the store, and all pass the same list, the newcomer last."""
        key = f"elastic/{gen}/handle/{members if newcomer else dist.get_rank()}"
        store.set(key, rt.get_reconfigure_handle())
        handles = [store.get(f"elastic/{gen}/handle/{i}").decode() for i in range(members + 1)]
        rt.reconfigure(1000 + int(gen), handles, timeout=timedelta(seconds=60)).wait()

    if args.join is not None:
        rejoin(args.join, world - 1, newcomer=True)
        print(f"joined: rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
    trainer.sync_state()
    killed_at = None
    if args.checkpoint and torchrun_attempt > 0 and os.path.exists(args.checkpoint + ".killed_at"):
        killed_at = float(Path(args.checkpoint + ".killed_at").read_text())
    kill_rank = args.kill_rank if args.kill_rank is not None else dist.get_world_size() - 1
    generation = 0
    replacement = None
    while trainer.step < args.steps:
        doomed = (args.kill_step is not None and trainer.step == args.kill_step and
                  generation == 0 and args.join is None and torchrun_attempt == 0 and
                  dist.get_rank() == kill_rank and kill_rank != 0)
        if doomed:
            store.set("elastic/killed_at", repr(time.time()))
            if args.checkpoint:
                Path(args.checkpoint + ".killed_at").write_text(repr(time.time()))
            # Die inside the backward's allreduce, as a real failure would come.
            threading.Timer(0.002, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        try:
            trainer.train_step()
        except Exception as e:  # noqa: BLE001  DDP's allreduce failed: a rank is gone
            _, gone = rt.agree()
            print(f"[rank {dist.get_rank()}] step {trainer.step}: {type(e).__name__}; gone: {gone}",
                  flush=True)
            # dist.shrink_group, and the repair DDP needs (ringreduce.torch.shrink_group says why).
            rt.shrink_group(gone, shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
            trainer.sync_state()
            killed_at = float(store.get("elastic/killed_at").decode())
            generation += 1
            if args.replace:
                members = dist.get_world_size()
                if dist.get_rank() == 0:
                    store.set(f"elastic/{generation}/world", str(members + 1))
                    replacement = subprocess.Popen(
                        [sys.executable, __file__, *sys.argv[1:], "--join", str(generation)])
                rejoin(str(generation), members, newcomer=False)
                trainer.sync_state()
            continue
        if killed_at is not None:
            how = "restarted" if torchrun_attempt > 0 else "shrunk" if not args.replace else "replaced"
            print(f"recovered: rank {dist.get_rank()} world={dist.get_world_size()} {how} "
                  f"after={time.time() - killed_at:.3f} s (kill to the first step after it)",
                  flush=True)
            killed_at = None
        if args.checkpoint and dist.get_rank() == 0 and trainer.step % args.checkpoint_every == 0:
            trainer.save(args.checkpoint)
    param_sum = float(sum(p.detach().double().sum() for p in trainer.net.parameters()))
    print(f"final: rank={dist.get_rank()} world={dist.get_world_size()} steps={trainer.step} "
          f"test_accuracy={trainer.accuracy():.4f} param_sum={param_sum:.6f}", flush=True)
    dist.destroy_process_group()
    if replacement is not None:
        replacement.wait(timeout=120)  # its output, under ringrun, is this rank's


if __name__ == "__main__":
    main()
