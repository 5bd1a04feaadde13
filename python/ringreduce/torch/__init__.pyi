# Type stubs of ringreduce.torch: importing it registers the torch.distributed backend BACKEND.
from typing import Any, Optional

BACKEND: str

def agree(group: Optional[Any] = None, flag: bool = True) -> tuple[bool, list[int]]: ...
