# Type stubs of the C++ module ringreduce.torch._torch_backend (python/src/torch_backend.cc).
from datetime import timedelta
from typing import Any

# The torch major version the module was built against (1 or 2).
TORCH_MAJOR: int
# Whether torch's headers had the fault-tolerance contract (torch 2.14: shrink, split,
# reconfigure, abort, shutdown, get_error, set_timeout, abort hooks) and the backend implements it.
FAULT_TOLERANCE: bool

# The ProcessGroup (torch 1.13) or Backend (torch 2.x) for "ringreduce"; torch.distributed calls it.
# reconfigure: made without members until torch.distributed._reconfigure names them.
def create(
    store: Any, rank: int, size: int, timeout: timedelta, reconfigure: bool = False
) -> Any: ...

# Communicator.agree on a ringreduce backend's (or, torch 1.13, process group's) communicator:
# (the AND of the flags, the ranks taken as failed).
def agree(backend: Any, flag: bool = True) -> tuple[bool, list[int]]: ...

# The backend's allreduce (average or sum) of a float32 tensor in place with a narrow wire format
# (docs/WIRE.md); returns its Work. What ringreduce.torch.hooks.wire_hook calls.
def allreduce_wire(backend: Any, tensor: Any, wire: str, average: bool = True) -> Any: ...

# In place: what coding a contiguous float32 CPU tensor in a wire format and decoding it gives.
def wire_round(tensor: Any, wire: str) -> None: ...
