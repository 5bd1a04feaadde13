"""torch's own c10d tests (test/distributed/test_c10d_gloo.py) with ringreduce in gloo's place.

Loaded by sitecustomize.py beside this file in every Python process of the run (pytest and the
ranks that torch's MultiProcessTestCase spawns) when RR_C10D_AS_GLOO=1. It changes nothing in
the tests; it changes where their "gloo" goes, in three places:

1. Groups made by name: torch.distributed's one place that turns a backend name into a backend,
   distributed_c10d._new_process_group_helper (init_process_group, new_group, new_subgroups all
   go through it), is given "ringreduce" where it was given "gloo" ("cpu:gloo" likewise). The
   group is then a ringreduce group in every respect, its name included: get_backend() says
   "ringreduce", and torch's own code that asks for gloo by name (dist.monitored_barrier, the
   sequence numbers of ProcessGroup) treats it as the third-party backend it is.
2. Backends made by hand: torch.distributed.ProcessGroupGloo(store, rank, size, options or
   timeout), which the ProcessGroupGlooTest tests call and then use directly (pg.allreduce(...),
   pg.broadcast(...), dist.barrier(group=pg)), makes a ringreduce Backend instead, with the
   options' timeout, in a ProcessGroup of its own: torch takes a bare Backend for a group only
   when it is gloo's (_get_object_coll_device), and a ProcessGroup has the same calls. gloo's
   other options (_devices, _threads) have no meaning for ringreduce and are ignored.
   ProcessGroupGloo._Options and create_device stay gloo's, as the tests build options with them.
   Only the name torch.distributed.ProcessGroupGloo, which the tests use, is replaced:
   distributed_c10d's own ProcessGroupGloo (torch's isinstance checks) stays gloo's.
3. create_device: some tests call backend.create_device(interface=...) on the group's backend,
   gloo's factory of its transport devices, and drop the result; ringreduce's backend gets
   gloo's static method so that the call does what it does for gloo (makes a device, unused).

For the classification only, never for a count of passes: with RR_C10D_WORDING=1,
assertRaisesRegex checks the exception's type and not its message, which tells the tests that
fail only on gloo's wording of an error (scripts/torch-c10d-tests --wording).
"""

import os

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

import ringreduce.torch as rt

_GLOO = dist.ProcessGroupGloo
_helper = distributed_c10d._new_process_group_helper


def as_ringreduce(backend):
    """'gloo' -> 'ringreduce'; 'cpu:gloo,cuda:nccl' -> 'cpu:ringreduce,cuda:nccl'."""
    if backend is None:
        return backend
    s = str(backend)
    if s.lower() == "gloo":
        return rt.BACKEND
    if ":" in s:
        return ",".join(
            f"{dev}:{rt.BACKEND if name.strip().lower() == 'gloo' else name}"
            for dev, name in (part.split(":", 1) for part in s.split(",")))
    return backend


def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, *args,
                              **kwargs):
    return _helper(group_size, group_rank, global_ranks_in_group, as_ringreduce(backend), *args,
                   **kwargs)


class ProcessGroupGloo:
    """Stands in for torch.distributed.ProcessGroupGloo: a ProcessGroup whose CPU backend is a
    ringreduce Backend."""

    _Options = _GLOO._Options
    create_device = staticmethod(_GLOO.create_device)
    create_default_device = staticmethod(_GLOO.create_default_device)

    def __new__(cls, store, rank, size, options=None, timeout=None):
        if timeout is None:
            timeout = getattr(options, "_timeout", options)
        if timeout is None:
            timeout = distributed_c10d.default_pg_timeout
        pg = dist.ProcessGroup(store, rank, size)
        cpu = torch.device("cpu")
        pg._register_backend(cpu, dist.ProcessGroup.BackendType.CUSTOM,
                             rt._create(store, rank, size, timeout))
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        return pg


def _type_not_wording():
    from torch.testing._internal import common_utils

    def assertRaisesRegex(self, expected_exception, expected_regex, *args, **kwargs):
        return self.assertRaises(expected_exception, *args, **kwargs)

    common_utils.TestCase.assertRaisesRegex = assertRaisesRegex


def install():
    distributed_c10d._new_process_group_helper = _new_process_group_helper
    dist.ProcessGroupGloo = ProcessGroupGloo
    torch._C._distributed_c10d.Backend.create_device = staticmethod(_GLOO.create_device)
    if os.environ.get("RR_C10D_WORDING") == "1":
        _type_not_wording()
