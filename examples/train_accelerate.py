#!/usr/bin/env python3
"""A small GPT-2 trained with Hugging Face Accelerate (or the Transformers Trainer) on CPU, over
the ringreduce process group (or gloo's, as a control).

    torchrun --nproc_per_node 2 examples/train_accelerate.py --backend ringreduce
    torchrun --nproc_per_node 2 examples/train_accelerate.py --backend gloo
    torchrun --nproc_per_node 2 examples/train_accelerate.py --trainer      # Trainer instead
    build/tools/ringrun -n 2 python3 examples/train_accelerate.py           # ringrun works too

(Debian's torch 2.x has no libuv: there, USE_LIBUV=0 and scripts/torchrun-nolibuv in place of
torchrun.) Nothing is downloaded: the model is built from a GPT2Config written here (random
initial weights, seeded), and the tokens come from a seeded Markov chain over a 64-token
vocabulary (each token has 4 likely successors), so the loss has somewhere to go: from ln 64 =
4.16 towards the chain's entropy, 1.11.

Accelerate 1.14 on CPU names the process group's backend itself: `Accelerator(cpu=True)`
picks gloo (mpi where torch has it, as Debian's does), and it refuses
`InitProcessGroupKwargs(backend="ringreduce")` ("Your assigned backend ringreduce is not
available, please use gloo"); without cpu=True on a machine without GPUs it calls
`init_process_group("ringreduce")` but then sees no distributed run and leaves the model
without DDP. It uses a process group that already exists, though, so the way in is one line
before the Accelerator:

    dist.init_process_group("ringreduce")      # after `import ringreduce.torch`
    accelerator = Accelerator(cpu=True)        # DDP, gather, the data loader: on ringreduce

The Trainer goes through Accelerate the same way (TrainingArguments(ddp_backend=...) reaches the
same refusal), and the same line before TrainingArguments(use_cpu=True) is its way in. Both runs
here, ringreduce's and gloo's, take this same path, so that they differ in the backend only.
--init accelerate lets Accelerate make the group from InitProcessGroupKwargs(backend=...)
instead (and --init trainer from TrainingArguments(ddp_backend=...)), to see what it says.

Rank 0 prints `losses: l1 l2 ...` (each step's loss averaged over the ranks, as Accelerate's
gather gives it, or as the Trainer logs it) and a last line `final: mode=... backend=...
ranks=... steps=... params=... loss_first=... loss_last=... step_ms_median=...` (forward,
backward with DDP's gradient allreduce, optimizer step; the median over the steps after the
first WARMUP_STEPS). --bench trains a larger model (4 layers, width 128: 805,632 parameters,
a 3.2 MB gradient allreduce per step) for the step time; the default one has 106,240 (425 KB).
"""

import os
import sys

# No network: Transformers must not look for anything on the Hub (nothing here needs it).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import example_env  # noqa: E402  (examples/example_env.py: the interpreter, the build tree)

example_env.prepare()
import torch  # noqa: E402

import argparse
import statistics
import time
from datetime import timedelta

import numpy as np
import torch.distributed as dist

SEED = 1234
VOCAB = 64
SEQ = 32
N_SEQ = 2048  # the data set: 2048 sequences of 32 tokens
WARMUP_STEPS = 3  # not in step_ms_median: first-touch allocations, DDP's first bucket rebuild


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["ringreduce", "gloo"], default="ringreduce")
    p.add_argument("--trainer", action="store_true", help="train with transformers.Trainer")
    p.add_argument("--init", choices=["self", "accelerate", "trainer"], default="self",
                   help="who makes the process group: this script before Accelerate (default), "
                        "Accelerate from InitProcessGroupKwargs(backend=), or the Trainer from "
                        "TrainingArguments(ddp_backend=)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--bench", action="store_true",
                   help="the larger model, for step time (and only the final line)")
    p.add_argument("--quiet", action="store_true", help="print only the losses and final lines")
    return p.parse_args()


def make_tokens():
    """N_SEQ sequences from a seeded Markov chain: the same data on every rank and every run."""
    rng = np.random.RandomState(SEED)
    succ = np.stack([rng.choice(VOCAB, 4, replace=False) for _ in range(VOCAB)])  # 4 successors
    probs = np.array([0.55, 0.25, 0.15, 0.05])
    toks = np.empty((N_SEQ, SEQ), dtype=np.int64)
    toks[:, 0] = rng.randint(VOCAB, size=N_SEQ)
    for t in range(1, SEQ):
        pick = rng.choice(4, size=N_SEQ, p=probs)
        toks[:, t] = succ[toks[:, t - 1], pick]
    return torch.from_numpy(toks)


def make_model(bench):
    from transformers import GPT2Config, GPT2LMHeadModel
    width, layers = (128, 4) if bench else (64, 2)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=width, n_layer=layers,
                        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    # Dropout off: the loss then depends on the weights and the data alone, so two runs that
    # differ in the backend only can be compared step by step.
    torch.manual_seed(SEED)  # the same initial weights on every rank and in every run
    return GPT2LMHeadModel(config)


def no_libuv_under_torchrun():
    """Debian's torch 2.x has no libuv (USE_LIBUV=0 there). Under torchrun, init_process_group
    connects to the agent's store with a TCPStore whose use_libuv defaults to True whatever
    USE_LIBUV says, and fails before reaching any backend; this makes that default False.
    (scripts/torchrun-nolibuv does the same for torchrun itself.) Torch from pip has libuv."""
    if os.environ.get("USE_LIBUV") != "0" or int(torch.__version__.split(".")[0]) < 2:
        return
    rdzv = sys.modules["torch.distributed.rendezvous"]  # the module, not the function

    class TCPStore(rdzv.TCPStore):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    rdzv.TCPStore = TCPStore


def init_group(backend):
    """The process group, made before Accelerate sees it (the one line in the docstring)."""
    if backend == "ringreduce":
        import ringreduce.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(backend, timeout=timedelta(seconds=120))


def train_accelerate(args, tokens):
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, set_seed

    if args.init == "self":
        init_group(args.backend)
        accelerator = Accelerator(cpu=True)
    else:  # Accelerate makes the group: it refuses ringreduce (above)
        if args.backend == "ringreduce":
            import ringreduce.torch  # noqa: F401
        accelerator = Accelerator(cpu=True, kwargs_handlers=[
            InitProcessGroupKwargs(backend=args.backend, timeout=timedelta(seconds=120))])
    set_seed(SEED)
    model = make_model(args.bench)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # Each rank gets its own batches of the one shuffled order (Accelerate shards the loader).
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens),
                                         batch_size=args.batch, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(SEED))
    model, opt, loader = accelerator.prepare(model, opt, loader)
    model.train()
    losses, ms = [], []
    while len(losses) < args.steps:
        for (batch,) in loader:
            t0 = time.perf_counter()
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)  # DDP averages the gradients over the ranks here
            opt.step()
            opt.zero_grad(set_to_none=True)
            ms.append((time.perf_counter() - t0) * 1e3)
            # Through the group too: an all_gather of every rank's loss.
            losses.append(accelerator.gather(loss.detach()).mean().item())
            if len(losses) == args.steps:
                break
    group = accelerator.state.backend, dist.get_backend()
    return losses, ms, accelerator.num_processes, accelerator.process_index, group, model


def train_trainer(args, tokens):
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Sequences(torch.utils.data.Dataset):  # the dicts the Trainer feeds the model
        def __len__(self):
            return len(tokens)

        def __getitem__(self, i):
            return {"input_ids": tokens[i], "labels": tokens[i]}

    class StepTimer(TrainerCallback):  # step begin to step end: forward, backward, optimizer
        def __init__(self):
            self.ms, self.t0 = [], 0.0

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.ms.append((time.perf_counter() - self.t0) * 1e3)

    if args.init == "self":
        init_group(args.backend)
        backend_arg = {}
    else:  # the Trainer hands ddp_backend to Accelerate, which refuses ringreduce
        if args.backend == "ringreduce":
            import ringreduce.torch  # noqa: F401
        backend_arg = {"ddp_backend": args.backend}
    targs = TrainingArguments(
        output_dir=os.environ.get("TMPDIR", "/tmp") + f"/train_accelerate-{os.getpid()}",
        use_cpu=True, per_device_train_batch_size=args.batch, max_steps=args.steps,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        logging_steps=1, save_strategy="no", report_to=[], seed=SEED, data_seed=SEED,
        dataloader_num_workers=0, disable_tqdm=True, ddp_timeout=120, **backend_arg)
    model = make_model(args.bench)
    timer = StepTimer()
    trainer = Trainer(model=model, args=targs, train_dataset=Sequences(), callbacks=[timer])
    trainer.train()
    # The Trainer logs each step's loss averaged over the ranks (it gathers them).
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    group = trainer.accelerator.state.backend, dist.get_backend()
    return losses, timer.ms, targs.world_size, targs.process_index, group, model


def main():
    args = parse_args()
    torch.set_num_threads(1)  # one core per rank: on a small machine the ranks share them
    if "WORLD_SIZE" not in os.environ:
        sys.exit("run under torchrun or ringrun (it needs a process group)")
    no_libuv_under_torchrun()
    tokens = make_tokens()
    run = train_trainer if args.trainer else train_accelerate
    losses, ms, world, rank, (accel_says, group), model = run(args, tokens)
    params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        mode = "trainer" if args.trainer else "accelerate"
        if not (args.quiet or args.bench):
            print(f"mode={mode} process group={group} (Accelerate's state says {accel_says}) "
                  f"ranks={world} batch={args.batch}/rank", flush=True)
        if not args.bench:
            print("losses: " + " ".join(f"{x:.7g}" for x in losses), flush=True)
        steady = ms[WARMUP_STEPS:] or ms
        print(f"final: mode={mode} backend={group} ranks={world} steps={len(losses)} "
              f"params={params} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} "
              f"step_ms_median={statistics.median(steady):.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
