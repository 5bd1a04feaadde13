"""ringreduce: bandwidth-optimal collectives (ring allreduce and friends) for Python.

    import numpy as np, ringreduce
    comm = ringreduce.init()                 # rank, size, store address from the environment
    grad = np.ones(1 << 20, dtype=np.float32)
    comm.allreduce(grad, op="avg")           # in place, no copies
    w = comm.allreduce_async(grad)           # returns a Work; the GIL is free meanwhile
    w.wait()

Buffers are NumPy arrays (or anything with the buffer protocol) and CPU torch tensors, used in
place. Errors are ringreduce.Error and its subclasses (TimeoutError, PeerError, MismatchError,
InvalidArgument), with the C++ library's messages: they name the rank, the call and its number.
ringreduce.TimeoutError is Python's TimeoutError too; InvalidArgument is a ValueError. Each call
takes only its own arguments: one it does not take (allgather(op=...)) is an InvalidArgument.

ringreduce.__version__ is the running library's version (libringreduce's rr_version()).

`import ringreduce.torch` registers the torch.distributed backend "ringreduce".
"""

from ._ringreduce import (  # noqa: F401
    ANY_SOURCE,
    NO_COLOR,
    Agreement,
    Communicator,
    Error,
    ErrorCode,
    InvalidArgument,
    Memory,
    MismatchError,
    PeerError,
    ReduceOp,
    TimeoutError,
    Work,
    __version__,
)

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


def init(*, rank=None, size=None, addr=None, token=None, timeout=None, settings=None):
    """A Communicator whose rank, size and store address come from the environment (ringrun,
    torchrun, mpirun, srun); the arguments given (rank, size, addr, token, timeout in seconds,
    settings: RINGREDUCE_* names to values) override it."""
    return Communicator(rank=rank, size=size, addr=addr, token=token, timeout=timeout,
                        settings=settings or {})
