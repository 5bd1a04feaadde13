"""One rank of test_torch_programs: programs users write on top of torch.distributed, each run
twice in this job, once on the default group (backend "ringreduce") and once on a gloo group
over the same ranks, from the same seeds, and compared:

- the parameters (and whatever else the program returns) of the ringreduce run against the gloo
  run's, within RTOL/ATOL (wider where a program's arithmetic is coarser, said there);
- every rank against rank 0 (over the gloo group, so a wrong backend cannot hide its own error);
- where the program is mathematically one process doing full-batch training (no_sync gradient
  accumulation, ZeRO, find_unused_parameters, FSDP), the parameters of one process doing that,
  computed here from every rank's data;
- what each program states about itself (PowerSGD compressed, an unused branch did not move, the
  objects gathered are what each rank sent, ...).

    usage: torch_programs.py PROGRAM...   (under ringrun or torchrun; the names are in PROGRAMS)

The torch.distributed APIs given `group` route every call to it (DDP, ZeroRedundancyOptimizer,
Join through its joinables, the comm hooks' states, the object collectives, FSDP): the gloo run
sends nothing through ringreduce. Output, per program: "BEGIN name", any "FAIL name: why",
"DONE name <seconds> max|ringreduce-gloo|=... max|rank-rank0|=..."; a program that raises
prints "FAIL name: raised ..." with the traceback and the rank exits 1 at once (ringrun then
stops the job; the test runs the remaining programs in a new job). At the end "OK <checks>" or
"FAILED <checks>".
Runs on torch 1.13 and 2.x.
"""

import gc
import os
import sys
import time
import traceback
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce.torch  # noqa: F401  registers the backend
from gloo_probe import gloo_takes_half

RTOL, ATOL = 1e-4, 1e-5
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
torch.set_num_threads(1)

dist.init_process_group("ringreduce", timeout=timedelta(seconds=30))  # a hang fails soon
R, N = dist.get_rank(), dist.get_world_size()
GLOO = dist.new_group(backend="gloo", timeout=timedelta(seconds=30))
assert dist.get_backend() == "ringreduce" and dist.get_backend(GLOO) == "gloo"
GLOO_HALF = gloo_takes_half(GLOO)
failures, checks = [], 0


def fail(prog, why):
    failures.append(prog)
    print(f"FAIL {prog}: {why}", flush=True)


def check(ok, prog, why):
    global checks
    checks += 1
    if not ok:
        fail(prog, why() if callable(why) else why)
    return ok


def backend_of(group):
    return dist.get_backend(group) if group is not None else dist.get_backend()


# ---- shared pieces: data, models, the one-process reference -------------------------------------
PROGRAM_IDS = {}


def batch(prog, step, rank, size=8):
    """Rank `rank`'s batch at `step` of program `prog`: 16 features, 4 classes; the same on every
    rank that asks (so any rank can compute the one-process reference)."""
    g = torch.Generator().manual_seed(1_000_003 * PROGRAM_IDS[prog] + 1009 * step + rank)
    return torch.randn(size, 16, generator=g), torch.randint(0, 4, (size,), generator=g)


def mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def clean(name):
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "module."):
        name = name.replace(wrapper, "")
    return name


def params_of(module):
    return {clean(k): v.detach().clone() for k, v in module.named_parameters()}


def train(model, opt, steps, loss_of):
    """Trains `model` for `steps` steps; loss_of(model, step) is a step's loss: the full batch's
    (the one-process reference) or this rank's own batch (a DDP or FSDP model)."""
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_of(model, s).backward()
        opt.step()
    return params_of(model)


def own_batch_ce(prog):
    """This rank's loss at step s: cross-entropy of its own batch."""
    def loss(model, step):
        x, y = batch(prog, step, R)
        return F.cross_entropy(model(x), y)
    return loss


def diff(a, b):
    """max |a - b| over the tensors of two {name: tensor} (or tensors)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), (sorted(a), sorted(b))
        return max((diff(a[k], b[k]) for k in a), default=0.0)
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def allclose(a, b, rtol=RTOL, atol=ATOL):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(allclose(a[k], b[k], rtol, atol) for k in a)
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol)


def moved(after, before):
    return diff(after, before) > 1e-3


def full_batch_ce(prog, s, n=N):
    """Loss of the global batch at step s (mean over every rank's batch of the same size)."""
    def loss(model, step):
        xs, ys = zip(*(batch(prog, step, r) for r in range(n)))
        return F.cross_entropy(model(torch.cat(xs)), torch.cat(ys))
    return loss


# ---- the programs: each takes the group to run on and returns {name: tensor} to compare --------
def prog_no_sync(group, P="no_sync"):
    """Gradient accumulation: K micro-batches per step, the first K-1 backwards under no_sync()
    (no communication), the last one synchronizing the accumulated gradients."""
    K, steps = 3, 6
    model = DDP(mlp(11), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        for k in range(K):
            x, y = batch(P, s * K + k, R)
            with model.no_sync() if k < K - 1 else nullcontext():
                (F.cross_entropy(model(x), y) / K).backward()
        opt.step()
    got = params_of(model)

    def ref_loss(m, s):  # the mean over every rank's K micro-batches
        return sum(F.cross_entropy(m(x), y) for x, y in
                   (batch(P, s * K + k, r) for r in range(N) for k in range(K))) / (N * K)
    ref = mlp(11)
    want = train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), steps,
                       ref_loss)
    check(allclose(got, want), P, lambda: f"{backend_of(group)}: parameters differ from one "
          f"process accumulating the global batch by up to {diff(got, want):.3g}")
    check(moved(got, params_of(mlp(11))), P, "parameters did not move")
    return got


def prog_fp16_hook(group, P="fp16_hook"):
    """DDP with the fp16 compression hook: gradients cast to float16, divided by the world size,
    allreduced as float16, cast back."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    steps = 8
    model = DDP(mlp(12), process_group=group)
    model.register_comm_hook(group, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    got = train(model, opt, steps, own_batch_ce(P))
    ref = mlp(12)
    want = train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), steps,
                       full_batch_ce(P, steps))
    # float16 gradients: 2^-11 relative per element, over 8 steps with momentum; a hook that
    # summed instead of averaging, or dropped a rank, is off by far more than 2e-3.
    check(allclose(got, want, rtol=0, atol=2e-3), P, lambda: f"{backend_of(group)}: "
          f"parameters differ from one process in float32 by {diff(got, want):.3g} (> 2e-3)")
    return got


def prog_powersgd(group, P="powersgd"):
    """DDP with PowerSGD (rank-1 approximation, error feedback, warm start) from step 2 on: the
    hook allreduces P and Q matrices from inside Future callbacks."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    steps = 10
    model = DDP(mlp(13), process_group=group)
    state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                               start_powerSGD_iter=2, min_compression_rate=2,
                               use_error_feedback=True, warm_start=True, random_seed=0)
    model.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        x, y = batch(P, s, R)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    rate, before, after = state.compression_stats()
    check(state.iter >= steps and rate > 2, P, f"{backend_of(group)}: PowerSGD did not compress "
          f"(iter {state.iter}, compression rate {rate:.2f}, numel {before} -> {after})")
    got = params_of(model)
    check(moved(got, params_of(mlp(13))) and all(torch.isfinite(v).all() for v in got.values()),
          P, "parameters did not move or are not finite")
    # PowerSGD's approximation is computed from allreduced P and Q; its error feedback keeps
    # what it left out for the next step: the same arithmetic on either backend.
    got["local.losses"] = torch.tensor(losses)  # this rank's own: not compared across ranks
    got["compression"] = torch.tensor([float(rate)])
    return got


class Branchy(nn.Module):
    """A trunk and a head, used on every step; `extra`, used by every rank on steps divisible by
    3 and by none on the others; `aux`, used by some ranks and not others on every step."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.trunk, self.head = nn.Linear(16, 32), nn.Linear(32, 4)
        self.extra, self.aux = nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x, use_extra, use_aux):
        h = F.relu(self.trunk(x))
        if use_extra:
            h = h + F.relu(self.extra(h))
        out = self.head(h)
        return out + self.aux(h) if use_aux else out


def branches(step, rank):
    return step % 3 == 0, (step + rank) % 2 == 0


def prog_find_unused(group, P="find_unused"):
    """DDP(find_unused_parameters=True) on a model whose branches are unused on some steps, by
    every rank (`extra`) or by some ranks (`aux`): DDP allreduces which parameters each rank used
    (an int map), gives the partly unused ones the average over all ranks, and leaves the
    gradients of the ones nobody used unset (so SGD leaves them alone)."""
    steps = 7
    model = DDP(Branchy(14), process_group=group, find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    extra_before = None
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        x, y = batch(P, s, R)
        F.cross_entropy(model(x, *branches(s, R)), y).backward()
        if s == 4:
            extra_before = model.module.extra.weight.detach().clone()
        opt.step()
        if s == 5:  # nobody used `extra` on steps 4 and 5 (and the momentum buffer is not used
            # without a gradient): it has not moved since step 3
            check(torch.equal(model.module.extra.weight, extra_before), P,
                  f"{backend_of(group)}: `extra`, unused by every rank, moved on step 4-5")
    got = params_of(model)

    def ref_loss(m, s):  # mean over ranks of each rank's loss with its own branches
        return sum(F.cross_entropy(m(*((x,) + branches(s, r))), y) for r, (x, y) in
                   ((r, batch(P, s, r)) for r in range(N))) / N
    ref = Branchy(14)
    want = train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), steps,
                       ref_loss)
    check(allclose(got, want), P, lambda: f"{backend_of(group)}: parameters differ from one "
          f"process by up to {diff(got, want):.3g}")
    return got


def prog_zero(group, P="zero"):
    """DDP + ZeroRedundancyOptimizer(Adam): each rank steps its shard of the parameters and
    broadcasts it; then the optimizer state is consolidated on rank 0 (a checkpoint)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    steps = 6
    model = DDP(mlp(15), process_group=group)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                  process_group=group, lr=0.01)
    got = train(model, opt, steps, own_batch_ce(P))
    ref = mlp(15)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    want = train(ref, ref_opt, steps, full_batch_ce(P, steps))
    check(allclose(got, want), P, lambda: f"{backend_of(group)}: parameters differ from one "
          f"process with Adam by up to {diff(got, want):.3g}")
    opt.consolidate_state_dict(to=0)
    if R == 0:
        sd, ref_sd = opt.state_dict()["state"], ref_opt.state_dict()["state"]
        check(sorted(sd) == sorted(ref_sd), P, f"consolidated state has params {sorted(sd)}, "
              f"one process {sorted(ref_sd)}")
        for i in ref_sd:
            for key in ("exp_avg", "exp_avg_sq"):
                a, b = sd.get(i, {}).get(key), ref_sd[i][key]
                if check(a is not None and allclose(a, b, atol=1e-7), P, lambda: f"consolidated "
                         f"{key} of param {i} differs from one process's"):
                    got[f"state.{i}.{key}"] = a.clone()
    return got


def prog_join(group, P="join"):
    """Uneven inputs: rank r has 3 + 2r batches. Join([DDP, ZeRO]) lets the ranks that run out
    shadow the others' gradient allreduces and ZeRO's parameter broadcasts until all are done."""
    from torch.distributed.algorithms.join import Join
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = DDP(mlp(16), process_group=group)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                  process_group=group, lr=0.1, momentum=0.9)
    mine = 3 + 2 * R
    with Join([model, opt]):
        for s in range(mine):
            opt.zero_grad(set_to_none=True)
            x, y = batch(P, s, R)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    got = params_of(model)
    check(moved(got, params_of(mlp(16))), P, "parameters did not move")
    return got


def prog_objects(group, P="objects"):
    """Object collectives in a training loop: rank 0 broadcasts the run's config; every step each
    rank's metrics are all-gathered (and checked against what each rank computes for every other
    rank's batch with the same parameters); rank 0 broadcasts the decision to stop; at the end the
    ranks all-gather their state_dicts to check they agree, and gather a summary on rank 0."""
    want_cfg = {"seed": 17, "lr": 0.1, "max_steps": 9, "stop_after": 6, "name": "objects-run"}
    box = [want_cfg, "set by rank 0"] if R == 0 else [None, None]
    dist.broadcast_object_list(box, src=0, group=group)
    cfg, note = box
    check(cfg == want_cfg and note == "set by rank 0", P,
          f"broadcast_object_list gave {cfg}, {note}")
    model = DDP(mlp(cfg["seed"]), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    history, steps = [], 0
    for s in range(cfg["max_steps"]):
        with torch.no_grad():  # every rank's loss at these parameters (they agree before a step)
            expect = [F.cross_entropy(model.module(x), y).item()
                      for x, y in (batch(P, s, r) for r in range(N))]
        opt.zero_grad(set_to_none=True)
        x, y = batch(P, s, R)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        mine = {"rank": R, "step": s, "loss": loss.item(), "tag": "x" * (R * 37 + s)}
        got = [None] * N
        dist.all_gather_object(got, mine, group=group)
        check(all(isinstance(m, dict) and m["rank"] == r and m["step"] == s
                  and m["tag"] == "x" * (r * 37 + s)
                  and abs(m["loss"] - expect[r]) <= 1e-5 * (1 + expect[r])
                  for r, m in enumerate(got)), P,
              lambda: f"step {s}: all_gather_object gave {[(m or {}).get('loss') for m in got]}, "
              f"expected losses {expect}")
        history.append([m["loss"] for m in got])
        decision = [{"stop": s + 1 >= cfg["stop_after"], "mean": sum(history[-1]) / N}
                    if R == 0 else None]
        dist.broadcast_object_list(decision, src=0, group=group)
        steps += 1
        if decision[0]["stop"]:
            break
    check(steps == cfg["stop_after"], P, f"stopped after {steps} steps, not {cfg['stop_after']}")
    sds = [None] * N
    dist.all_gather_object(sds, model.module.state_dict(), group=group)
    own = model.module.state_dict()
    check(all(s is not None and s.keys() == own.keys() and all(torch.equal(s[k], own[k])
                                                                for k in own) for s in sds),
          P, "the ranks' state_dicts gathered with all_gather_object differ")
    summary = [None] * N if R == 0 else None
    dist.gather_object({"rank": R, "last_loss": history[-1][R]}, summary, dst=0, group=group)
    if R == 0:
        check(summary == [{"rank": r, "last_loss": history[-1][r]} for r in range(N)], P,
              f"gather_object gave {summary}")
    got = params_of(model)
    got["history"] = torch.tensor(history, dtype=torch.float64)
    return got


def prog_fsdp(group, P="fsdp"):
    """FullyShardedDataParallel on CPU (torch 2.x), each Linear its own FSDP unit, FULL_SHARD:
    parameters all-gathered for forward and backward, gradients reduce-scattered; then the full
    parameters gathered back (summon_full_params)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    kw = {}
    try:
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        kw["auto_wrap_policy"] = ModuleWrapPolicy({nn.Linear})
    except ImportError:
        pass
    steps = 6
    model = FSDP(mlp(18), process_group=group, device_id=torch.device("cpu"),
                 sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, steps, own_batch_ce(P))
    with FSDP.summon_full_params(model):
        got = params_of(model)
    ref = mlp(18)
    want = train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), steps,
                       full_batch_ce(P, steps))
    check(allclose(got, want), P, lambda: f"{backend_of(group)}: parameters differ from one "
          f"process by up to {diff(got, want):.3g}")
    return got


# name -> (program, rtol, atol of ringreduce against gloo)
PROGRAMS = {
    "no_sync": (prog_no_sync, RTOL, ATOL),
    # float16 sums of N values: each backend rounds its own way (order, accumulation width), up
    # to a float16 ulp (2^-11 relative) of a gradient per step; over 8 steps at lr 0.1 with
    # momentum that is up to a few 1e-4 on parameters of size ~0.2 (7.9e-5 measured at N=4,
    # torch 1.13; bitwise equal at N=2). A wrong allreduce is off by 1e-2 and more.
    "fp16_hook": (prog_fp16_hook, 1e-3, 1e-3),
    "powersgd": (prog_powersgd, RTOL, ATOL),
    "find_unused": (prog_find_unused, RTOL, ATOL),
    "zero": (prog_zero, RTOL, ATOL),
    "join": (prog_join, RTOL, ATOL),
    "objects": (prog_objects, RTOL, ATOL),
    "fsdp": (prog_fsdp, RTOL, ATOL),
}
for i, name in enumerate(PROGRAMS):
    PROGRAM_IDS[name] = i + 1


def shared(result):
    """What every rank must hold the same of a program's result: not "local.*" (this rank's own,
    e.g. its losses) nor "state.*" (what rank 0 alone holds: zero's consolidated checkpoint)."""
    return {k: v for k, v in result.items() if not k.startswith(("local.", "state."))}


def same_on_every_rank(prog, label, tensors):
    """All-gathers the flattened tensors over gloo; every rank checks them against rank 0's."""
    flat = torch.cat([t.reshape(-1).double() for _, t in sorted(tensors.items())])
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(N)]
    dist.all_gather(sizes, torch.tensor([flat.numel()]), group=GLOO)
    if not check(all(int(s) == flat.numel() for s in sizes), prog,
                 f"{label}: ranks return different numbers of values: {[int(s) for s in sizes]}"):
        return
    every = [torch.empty_like(flat) for _ in range(N)]
    dist.all_gather(every, flat, group=GLOO)
    worst = max(float((e - every[0]).abs().max()) for e in every)
    check(all(torch.allclose(e, every[0], rtol=RTOL, atol=ATOL) for e in every), prog,
          f"{label}: ranks disagree, by up to {worst:.3g}")
    return worst


def main(names):
    global GLOO
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        sys.exit(f"unknown programs {unknown}; known: {list(PROGRAMS)}")
    print(f"torch {torch.__version__} world {N} backend {dist.get_backend()}", flush=True)
    for name in names:
        run, rtol, atol = PROGRAMS[name]
        print("BEGIN", name, flush=True)
        t0 = time.perf_counter()
        try:
            ours = run(None)
            dist.barrier()
            if name == "fp16_hook" and not GLOO_HALF:
                # This gloo takes no float16: ringreduce's run is checked against the single-
                # process reference (inside the program) and across ranks only.
                print(f"NOTE {name}: gloo here takes no float16; not compared with gloo",
                      flush=True)
                theirs = ours
            else:
                theirs = run(GLOO)
                dist.barrier(group=GLOO)
        except Exception as e:  # noqa: BLE001  reported, then this rank stops the job
            fail(name, f"raised {type(e).__name__}: {e}\n" + traceback.format_exc())
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        rank_diff = same_on_every_rank(name, "ringreduce", shared(ours))
        same_on_every_rank(name, "gloo", shared(theirs))
        d = None
        if check(ours.keys() == theirs.keys(), name,
                 f"ringreduce returned {sorted(ours)}, gloo {sorted(theirs)}"):
            d = diff(ours, theirs)
            check(allclose(ours, theirs, rtol, atol), name, f"ringreduce and gloo differ by up to "
                  f"{d:.3g} (rtol={rtol}, atol={atol}): " + ", ".join(
                      f"{k} {diff(ours[k], theirs[k]):.3g}" for k in sorted(ours)
                      if not allclose(ours[k], theirs[k], rtol, atol)))
        print(f"DONE {name} {time.perf_counter() - t0:.2f}s max|ringreduce-gloo|="
              f"{d if d is None else f'{d:.3g}'} max|rank-rank0|={rank_diff}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # destroy_process_group() forgets the groups, but GLOO (a global) would keep gloo's process
    # group and its worker threads alive into interpreter finalization, where a thread that takes
    # the GIL is ended by pthread_exit; inside a destructor that is std::terminate ("terminate
    # called without an active exception", pytorch/pytorch#179291). Release it while Python runs.
    GLOO = None
    gc.collect()
    print("OK" if not failures else "FAILED", checks, flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
