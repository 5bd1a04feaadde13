# Type stubs of the package ringreduce (the C++ module's names are in _ringreduce.pyi).
from typing import Optional

from ._ringreduce import ANY_SOURCE as ANY_SOURCE
from ._ringreduce import NO_COLOR as NO_COLOR
from ._ringreduce import Agreement as Agreement
from ._ringreduce import Communicator as Communicator
from ._ringreduce import Error as Error
from ._ringreduce import ErrorCode as ErrorCode
from ._ringreduce import InvalidArgument as InvalidArgument
from ._ringreduce import Memory as Memory
from ._ringreduce import MismatchError as MismatchError
from ._ringreduce import PeerError as PeerError
from ._ringreduce import ReduceOp as ReduceOp
from ._ringreduce import TimeoutError as TimeoutError
from ._ringreduce import Work as Work
from ._ringreduce import __version__ as __version__

__all__ = [
    "ANY_SOURCE",
    "NO_COLOR",
    "Agreement",
    "Communicator",
    "Error",
    "ErrorCode",
    "InvalidArgument",
    "Memory",
    "MismatchError",
    "PeerError",
    "ReduceOp",
    "TimeoutError",
    "Work",
    "init",
]

def init(
    *,
    rank: Optional[int] = None,
    size: Optional[int] = None,
    addr: Optional[str] = None,
    token: Optional[str] = None,
    timeout: Optional[float] = None,
    settings: Optional[dict[str, str]] = None,
) -> Communicator: ...
