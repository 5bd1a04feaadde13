# Type stubs of the C++ module ringreduce._ringreduce (python/src/module.cc), which ringreduce
# re-exports. tests/python/test_typing.py checks them against the built module: the same public
# names, and for each method the same parameters in the same order with the same defaults.
import builtins
from types import TracebackType
from typing import Any, ClassVar, Optional, Sequence, Union

from typing_extensions import Self, TypeAlias

# NumPy arrays and anything else with the buffer protocol, CPU and CUDA torch tensors, and
# objects with __cuda_array_interface__ (CuPy, Numba): used in place, never copied.
_Buffer: TypeAlias = Any
# A ReduceOp or its name: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "premul_sum".
_Op: TypeAlias = Union["ReduceOp", str]

__version__: str
ANY_SOURCE: int
NO_COLOR: int

# Every error of the library; `code` is its ErrorCode's value, `peer` the rank a PeerError blames.
class Error(RuntimeError):
    code: int
    peer: Optional[int]

class TimeoutError(Error, builtins.TimeoutError): ...
class PeerError(Error): ...
class MismatchError(Error): ...
class InvalidArgument(Error, ValueError): ...

class ErrorCode:
    OK: ClassVar[ErrorCode]
    INTERNAL: ClassVar[ErrorCode]
    INVALID_ARGUMENT: ClassVar[ErrorCode]
    TIMEOUT: ClassVar[ErrorCode]
    PEER: ClassVar[ErrorCode]
    MISMATCH: ClassVar[ErrorCode]
    ABORTED: ClassVar[ErrorCode]
    __members__: ClassVar[dict[str, ErrorCode]]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class ReduceOp:
    SUM: ClassVar[ReduceOp]
    PROD: ClassVar[ReduceOp]
    MIN: ClassVar[ReduceOp]
    MAX: ClassVar[ReduceOp]
    AVG: ClassVar[ReduceOp]
    BAND: ClassVar[ReduceOp]
    BOR: ClassVar[ReduceOp]
    BXOR: ClassVar[ReduceOp]
    PREMUL_SUM: ClassVar[ReduceOp]
    __members__: ClassVar[dict[str, ReduceOp]]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class Memory:
    """Memory from Communicator.alloc(): a writable buffer of bytes (the buffer protocol)."""
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class Work:
    """The handle of an async call."""
    def wait(self, timeout: Optional[float] = None) -> bool: ...
    def is_completed(self) -> bool: ...
    def result(self) -> Any: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def source(self) -> Optional[int]: ...

# Each call takes only the arguments written here: a keyword argument it does not take raises
# InvalidArgument (a ValueError). Timeouts are in seconds; dtype overrides the buffers' element
# type ("bfloat16" for a uint16 array, ...). The blocking calls return their output buffer.
class Agreement:
    @property
    def flag(self) -> bool: ...
    @property
    def failed(self) -> list[int]: ...
    @property
    def completed_min(self) -> int: ...
    @property
    def completed_max(self) -> int: ...

class Communicator:
    def __init__(
        self,
        rank: Optional[int] = None,
        size: Optional[int] = None,
        addr: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Optional[float] = None,
        settings: dict[str, str] = {},
    ) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def tuning(self) -> str: ...
    def close(self) -> None: ...
    def abort(self, reason: str) -> None: ...
    def error(self) -> Optional[Error]: ...
    def set_timeout(self, seconds: float) -> None: ...
    @property
    def parent_ranks(self) -> list[int]: ...
    def agree(self, flag: bool = True, timeout: Optional[float] = None) -> Agreement: ...
    def shrink(
        self,
        exclude: Optional[Sequence[int]] = None,
        abort: bool = False,
        timeout: Optional[float] = None,
    ) -> Communicator: ...
    def grow(self, name: str, newcomers: int, timeout: Optional[float] = None) -> Communicator: ...
    @staticmethod
    def join(
        name: str,
        addr: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Optional[float] = None,
        settings: dict[str, str] = {},
    ) -> Communicator: ...
    def split(self, color: int, key: Optional[int] = None) -> Optional[Communicator]: ...
    def alloc(self, nbytes: int) -> Memory: ...
    def free(self, buffer: _Buffer) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...
    def allreduce(
        self,
        send: _Buffer,
        recv: Optional[_Buffer] = None,
        op: Optional[_Op] = None,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
        premul_factor: float = 1.0,
        *,
        wire: Optional[str] = None,
    ) -> _Buffer: ...
    def allreduce_async(
        self,
        send: _Buffer,
        recv: Optional[_Buffer] = None,
        op: Optional[_Op] = None,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
        premul_factor: float = 1.0,
        *,
        wire: Optional[str] = None,
    ) -> Work: ...
    def reduce_scatter(
        self,
        send: _Buffer,
        recv: _Buffer,
        op: Optional[_Op] = None,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
        premul_factor: float = 1.0,
        *,
        wire: Optional[str] = None,
    ) -> _Buffer: ...
    def reduce_scatter_async(
        self,
        send: _Buffer,
        recv: _Buffer,
        op: Optional[_Op] = None,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
        premul_factor: float = 1.0,
        *,
        wire: Optional[str] = None,
    ) -> Work: ...
    def allgather(
        self,
        send: _Buffer,
        recv: _Buffer,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
        *,
        wire: Optional[str] = None,
    ) -> _Buffer: ...
    def allgather_async(
        self,
        send: _Buffer,
        recv: _Buffer,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
        *,
        wire: Optional[str] = None,
    ) -> Work: ...
    def alltoall(
        self, send: _Buffer, recv: _Buffer, dtype: Optional[str] = None, timeout: Optional[float] = None
    ) -> _Buffer: ...
    def alltoall_async(
        self, send: _Buffer, recv: _Buffer, dtype: Optional[str] = None, timeout: Optional[float] = None
    ) -> Work: ...
    def broadcast(
        self,
        send: _Buffer,
        recv: Optional[_Buffer] = None,
        root: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> _Buffer: ...
    def broadcast_async(
        self,
        send: _Buffer,
        recv: Optional[_Buffer] = None,
        root: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Work: ...
    def reduce(
        self,
        send: _Buffer,
        recv: Optional[_Buffer] = None,
        op: Optional[_Op] = None,
        root: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
        premul_factor: float = 1.0,
    ) -> _Buffer: ...
    def reduce_async(
        self,
        send: _Buffer,
        recv: Optional[_Buffer] = None,
        op: Optional[_Op] = None,
        root: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
        premul_factor: float = 1.0,
    ) -> Work: ...
    # Returns recv on the root, None elsewhere (where recv may be None).
    def gather(
        self,
        send: _Buffer,
        recv: Optional[_Buffer] = None,
        root: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Optional[_Buffer]: ...
    def gather_async(
        self,
        send: _Buffer,
        recv: Optional[_Buffer] = None,
        root: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Work: ...
    # send is only used on the root (None elsewhere).
    def scatter(
        self,
        send: Optional[_Buffer],
        recv: _Buffer,
        root: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> _Buffer: ...
    def scatter_async(
        self,
        send: Optional[_Buffer],
        recv: _Buffer,
        root: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Work: ...
    def allgatherv(
        self,
        send: _Buffer,
        recv: _Buffer,
        counts: Sequence[int],
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> _Buffer: ...
    def allgatherv_async(
        self,
        send: _Buffer,
        recv: _Buffer,
        counts: Sequence[int],
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Work: ...
    def reduce_scatterv(
        self,
        send: _Buffer,
        recv: _Buffer,
        counts: Sequence[int],
        op: Optional[_Op] = None,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
        premul_factor: float = 1.0,
    ) -> _Buffer: ...
    def reduce_scatterv_async(
        self,
        send: _Buffer,
        recv: _Buffer,
        counts: Sequence[int],
        op: Optional[_Op] = None,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
        premul_factor: float = 1.0,
    ) -> Work: ...
    def alltoallv(
        self,
        send: _Buffer,
        recv: _Buffer,
        send_counts: Sequence[int],
        recv_counts: Sequence[int],
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> _Buffer: ...
    def alltoallv_async(
        self,
        send: _Buffer,
        recv: _Buffer,
        send_counts: Sequence[int],
        recv_counts: Sequence[int],
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Work: ...
    def send(
        self,
        buf: _Buffer,
        dst: int,
        tag: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None: ...
    def send_async(
        self,
        buf: _Buffer,
        dst: int,
        tag: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Work: ...
    # Returns the sender's rank.
    def recv(
        self,
        buf: _Buffer,
        src: Optional[int] = None,
        tag: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> int: ...
    def recv_async(
        self,
        buf: _Buffer,
        src: Optional[int] = None,
        tag: int = 0,
        dtype: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Work: ...
    def barrier(self, timeout: Optional[float] = None) -> None: ...
    def barrier_async(self, timeout: Optional[float] = None) -> Work: ...
