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
    if _has_fault_tolerance():
        _dist.Backend.register_backend(BACKEND, _create_extended, extended_api=True,
                                       devices=["cpu"])
    elif _torch_backend.TORCH_MAJOR >= 2:
        # torch 2.x dispatches per device: without "cpu" here it finds no backend for CPU
        # tensors' point-to-point calls.
        _dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
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
