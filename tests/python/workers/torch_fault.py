"""One rank of test_torch_fault (torch 2.14's fault-tolerance contract, under ringrun --elastic).
argv[1] picks the case; each rank prints what it saw, one line per fact:

  surface     the supports_* answers, get_error, set_timeout, abort hooks, abort from another thread
              while a collective waits, ProcessGroup.split_group, and dist.split_group's answer
  shrink      rank 2 of 4 SIGKILLs itself inside all_reduce; the survivors catch the error and
              dist.shrink_group([2]) (argv[2]: the flag, "default" or "abort"); exact all_reduce
              on the new default group
  reconfigure init_process_group(enable_reconfigure=True); handles swapped through the store;
              _reconfigure(uuid 1) with all 4; then rank 3 SIGKILLs itself and the others
              _reconfigure(uuid 2) with their fresh handles; exact all_reduce each time; a reused
              uuid is refused
"""

import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ringreduce.torch  # noqa: F401

case = sys.argv[1]


def say(*a):
    print(*a, flush=True)


def backend_of(pg=None):
    return (pg or dist.group.WORLD)._get_backend(torch.device("cpu"))


def kill_at(t):
    threading.Timer(max(0.0, t - time.time()), lambda: os.kill(os.getpid(), signal.SIGKILL)).start()


def die_inside_all_reduces(victim):
    """Every rank loops over all_reduce; `victim` SIGKILLs itself 0.3 s in (a moment rank 0's
    clock sets), and the others print how their call failed. Returns that moment."""
    at = torch.tensor([time.time() + 0.3], dtype=torch.float64)
    dist.broadcast(at, src=0)
    at = float(at[0])
    if R == victim:
        kill_at(at)
    x = torch.ones(1 << 18)
    try:
        for _ in range(100000):
            dist.all_reduce(x)
            if time.time() > at + 30:
                break
    except Exception as e:  # noqa: BLE001  the call a dead rank fails
        say(f"FAILED after={time.time() - at:.3f} {type(e).__name__}: {e}")
    return at


def exact(members):
    """all_reduce whose sum says who took part: each adds its first rank + 1."""
    x = torch.full((1 << 16,), float(members[dist.get_rank()] + 1))
    dist.all_reduce(x)
    return float(x[0])


if case == "reconfigure":
    dist.init_process_group("ringreduce", enable_reconfigure=True)
else:
    dist.init_process_group("ringreduce")
R, N = dist.get_rank(), dist.get_world_size()

if case == "surface":
    b = backend_of()
    say(f"SUPPORTS splitting={b.supports_splitting} shrinking={b.supports_shrinking} "
        f"reconfigure={b.supports_reconfigure}")
    say(f"ERROR_BEFORE {b.get_error()}")
    hooked = []
    b.register_abort_hook(7, lambda: hooked.append(1))
    # ProcessGroup.split_group: only the new group's members call it.
    if R < 2:
        sub = dist.group.WORLD.split_group([0, 1], timeout=timedelta(seconds=30))
        x = torch.ones(4)
        dist.all_reduce(x, group=sub)
        say(f"SPLIT size={sub.size()} rank={sub.rank()} sum={float(x[0])}")
    else:
        say("SPLIT not a member")
    try:
        dist.split_group(split_ranks=[[0, 1], [2, 3]])
        say("DIST_SPLIT ok")
    except Exception as e:  # noqa: BLE001  torch refuses CPU-only default groups; said, not hidden
        say(f"DIST_SPLIT {type(e).__name__}: {e}")
    dist.barrier()
    # set_timeout: a collective rank 1 never joins times out in about 1 s.
    b.set_timeout(timedelta(seconds=1))
    if R == 0:
        t0 = time.time()
        try:
            dist.all_reduce(torch.ones(4))
        except Exception as e:  # noqa: BLE001
            say(f"TIMED_OUT after={time.time() - t0:.2f} {type(e).__name__}")
        say(f"ERROR_AFTER {b.get_error()} hooked={len(hooked)}")
    else:
        time.sleep(3)
        # Rank 0's timeout reached this rank's communicator as a notice, or its next call does.
        try:
            dist.all_reduce(torch.ones(4))
        except Exception as e:  # noqa: BLE001
            say(f"PEER_FAILED {type(e).__name__}")
        say(f"ERROR_AFTER {b.get_error()} hooked={len(hooked)}")

elif case == "shrink":
    c10d = dist.distributed_c10d  # torch 2.14 does not export the flags from torch.distributed
    flag = c10d.SHRINK_ABORT if sys.argv[2] == "abort" else c10d.SHRINK_DEFAULT
    victim = 2
    dist.all_reduce(torch.ones(1 << 18))
    at = die_inside_all_reduces(victim)
    say(f"GET_ERROR {backend_of().get_error()}")
    new = dist.shrink_group([victim], shrink_flags=flag)
    say(f"SHRUNK after={time.time() - at:.3f} size={dist.get_world_size()} rank={dist.get_rank()} "
        f"default={new == dist.group.WORLD}")
    members = [0, 1, 3]
    say(f"EXACT {exact(members)} after={time.time() - at:.3f}")
    dist.destroy_process_group()

elif case == "reconfigure":
    store = dist.distributed_c10d._get_default_store()
    b = backend_of()
    try:
        dist.all_reduce(torch.ones(1))
        say("NO ERROR BEFORE RECONFIGURE")
    except Exception as e:  # noqa: BLE001
        say(f"BEFORE {type(e).__name__}: {e}")

    def swap(generation, members):
        store.set(f"handle/{generation}/{R}", dist._get_reconfigure_handle())
        return [store.get(f"handle/{generation}/{r}").decode() for r in members]

    handles = swap(1, range(N))
    dist._reconfigure(uuid=1, handles=handles).wait()
    say(f"CONFIGURED size={dist.get_world_size()} rank={dist.get_rank()} sum={exact(list(range(N)))}")
    victim = 3
    at = die_inside_all_reduces(victim)
    say(f"GET_ERROR {b.get_error()}")
    survivors = [r for r in range(N) if r != victim]
    handles = swap(2, survivors)
    dist._reconfigure(uuid=2, handles=handles, timeout=timedelta(seconds=30)).wait()
    say(f"RECONFIGURED after={time.time() - at:.3f} size={dist.get_world_size()} "
        f"rank={dist.get_rank()} sum={exact(survivors)}")
    try:
        dist._reconfigure(uuid=2, handles=handles).wait()
        say("REUSED accepted")
    except Exception as e:  # noqa: BLE001
        say(f"REUSED {type(e).__name__}: {e}")
    dist.destroy_process_group()
