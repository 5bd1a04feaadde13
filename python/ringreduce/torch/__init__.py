"""The torch.distributed backend "ringreduce".

    import torch.distributed as dist
    import ringreduce.torch  # registers the backend
    dist.init_process_group("ringreduce")  # rank, size, store from torchrun/ringrun's environment
    model = torch.nn.parallel.DistributedDataParallel(model)  # unchanged

CPU tensors. Implemented: allreduce (SUM, PRODUCT, MIN, MAX, AVG), allreduce_coalesced,
broadcast, allgather, _allgather_base, reduce_scatter, _reduce_scatter_base, reduce,
alltoall_base and alltoall (equal splits), barrier. Any other call raises an error naming it.
"""

import torch.distributed as _dist

from .. import _ringreduce  # noqa: F401  (its exception translator maps ringreduce's errors)
from . import _torch_backend

BACKEND = "ringreduce"


def _create(store, rank, size, timeout):
    return _torch_backend.create(store, rank, size, timeout)


if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, _create)
