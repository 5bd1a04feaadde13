"""The torch.distributed backend "ringreduce".

    import torch.distributed as dist
    import ringreduce.torch  # registers the backend
    dist.init_process_group("ringreduce")  # rank, size, store from torchrun/ringrun's environment
    model = torch.nn.parallel.DistributedDataParallel(model)  # unchanged

CPU tensors, torch 1.13 (a ProcessGroup) and torch 2.x (a Backend registered for "cpu", so that
torch routes every call to it, point to point included). Every torch.distributed call that gloo
takes on CPU tensors works here, and more (docs/PYTHON.md lists them per torch version): all
reduce ops (AVG, BAND, BOR, BXOR, PREMUL_SUM included) on every dtype they apply to (int16 and
bool included), non-contiguous tensors, uneven all_gather, reduce_scatter and all_to_all, gather,
scatter, send/recv/irecv from any source, monitored_barrier, new_group and new_subgroups.
"""

import torch
import torch.distributed as _dist

from .. import _ringreduce  # noqa: F401  (its exception translator maps ringreduce's errors)
from . import _torch_backend

BACKEND = "ringreduce"


def _create(store, rank, size, timeout):
    return _torch_backend.create(store, rank, size, timeout)


def _create_extended(opts, backend_options):
    # torch 2.14's creator arguments (extended_api): enable_reconfigure makes a group without
    # members until torch.distributed._reconfigure names them (docs/PYTHON.md).
    return _torch_backend.create(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                                 bool(getattr(opts, "enable_reconfigure", False)))


def _has_fault_tolerance():
    """torch 2.14's Backend fault-tolerance contract (shrink_group, reconfigure), compiled in."""
    return bool(getattr(_torch_backend, "FAULT_TOLERANCE", False)) and hasattr(
        _dist.distributed_c10d._DistributedBackendOptions(), "enable_reconfigure")


if BACKEND.upper() not in _dist.Backend._plugins:
    # torch 2.x dispatches per device: without "cpu" here it finds no backend for CPU tensors'
    # point-to-point calls; with "cuda" too, CUDA tensors come here as well (one backend serves
    # both: torch makes one when every device names the same backend). They are staged through
    # host memory on torch's current stream (docs/GPU.md), where torch gives extensions that
    # stream (2.11 on); an older torch has them refused with a message saying so.
    if _has_fault_tolerance():
        _dist.Backend.register_backend(BACKEND, _create_extended, extended_api=True,
                                       devices=["cpu", "cuda"])
    elif _torch_backend.TORCH_MAJOR >= 2:
        _dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
    else:
        _dist.Backend.register_backend(BACKEND, _create)


def agree(group=None, flag=True):
    """Fault-tolerant agreement among the ranks of `group` (default: the world) still alive, over
    ringreduce's own connections (no store): returns (the AND of every survivor's flag, the
    ranks taken as failed), the same on every survivor, also after a failure aborted the group.
    What `dist.shrink_group` needs to be told: `flag, failed = ringreduce.torch.agree();
    dist.shrink_group(failed)`."""
    pg = group if group is not None else _dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu")) if _torch_backend.TORCH_MAJOR >= 2 else pg
    return _torch_backend.agree(backend, flag)


def _backend(group):
    pg = group if group is not None else _dist.group.WORLD
    return pg._get_backend(torch.device("cpu"))


def shrink_group(ranks_to_exclude, group=None, shrink_flags=0, pg_options=None):
    """torch.distributed.shrink_group (torch 2.14) with a repair of torch's: it registers the
    shrunk group's CPU backend as gloo's (ProcessGroup.BackendType.GLOO), and DDP then takes the
    ringreduce backend for a ProcessGroupGloo (its logger crashes the process). Registered again
    as what it is (CUSTOM), DDP works. The group then holds the backend under two types, and
    torch's ProcessGroup-level reconfigure refuses such a group: use get_reconfigure_handle and
    reconfigure below, which call the backend. Returns the new group (the new default group when
    `group` was the default one)."""
    new = _dist.shrink_group(ranks_to_exclude, group=group, shrink_flags=shrink_flags,
                             pg_options=pg_options)
    cpu = torch.device("cpu")
    backend = new._get_backend(cpu)
    if new.name() == "gloo" and backend.name() == BACKEND:
        new._register_backend(cpu, _dist.ProcessGroup.BackendType.CUSTOM, backend)
        new._set_default_backend(_dist.ProcessGroup.BackendType.CUSTOM)
    return new


def get_reconfigure_handle(group=None):
    """This rank's reconfigure handle (torch.distributed._get_reconfigure_handle), from the
    ringreduce backend itself: it also works on a group shrink_group above has repaired."""
    return _backend(group).get_reconfigure_handle()


def reconfigure(uuid, handles, group=None, timeout=None):
    """torch.distributed._reconfigure, on the ringreduce backend itself (see shrink_group): the
    members of `handles` (one per rank, in rank order) make a communicator; `uuid` fresh each
    time. Returns a completed Work."""
    opts = _dist.distributed_c10d.ReconfigureOptions()
    opts.uuid = uuid
    opts.handles = list(handles)
    if timeout is not None:
        opts.timeout = timeout
    return _backend(group).reconfigure(opts)
