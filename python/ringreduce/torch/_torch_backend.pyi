# Type stubs of the C++ module ringreduce.torch._torch_backend (python/src/torch_backend.cc).
from datetime import timedelta
from typing import Any

# The torch major version the module was built against (1 or 2).
TORCH_MAJOR: int

# The ProcessGroup (torch 1.13) or Backend (torch 2.x) for "ringreduce"; torch.distributed calls it.
def create(store: Any, rank: int, size: int, timeout: timedelta) -> Any: ...
