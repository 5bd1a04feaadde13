# Type stubs of ringreduce.torch: importing it registers the torch.distributed backend BACKEND.
from typing import Any, Optional

BACKEND: str

def agree(group: Optional[Any] = None, flag: bool = True) -> tuple[bool, list[int]]: ...
def shrink_group(
    ranks_to_exclude: list[int],
    group: Optional[Any] = None,
    shrink_flags: int = 0,
    pg_options: Optional[Any] = None,
) -> Any: ...
def get_reconfigure_handle(group: Optional[Any] = None) -> str: ...
def reconfigure(
    uuid: int, handles: Any, group: Optional[Any] = None, timeout: Optional[Any] = None
) -> Any: ...
