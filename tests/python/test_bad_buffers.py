"""Unusable buffers raise ringreduce.InvalidArgument naming the rank, the call and the buffer,
before anything is sent (one rank: no launcher needed)."""

import sys

import numpy as np
import pytest

from conftest import PYDIR, have_module

if not have_module("_ringreduce"):
    pytest.skip("ringreduce not built", allow_module_level=True)
sys.path.insert(0, str(PYDIR))
import ringreduce  # noqa: E402


@pytest.fixture(scope="module")
def comm():
    c = ringreduce.Communicator(rank=0, size=1, addr="127.0.0.1:1")
    yield c
    c.close()


def readonly():
    a = np.ones(4)
    a.setflags(write=False)
    return a


class FakeCudaArray:
    """An object with CuPy's __cuda_array_interface__ (version 3); the pointer is never touched."""

    def __init__(self, typestr="<f4", shape=(4,), strides=None, readonly=False, stream=None):
        self.__cuda_array_interface__ = {
            "data": (0x7f0000000000, readonly), "shape": shape, "typestr": typestr,
            "strides": strides, "version": 3, "stream": stream}


def test_lazy_tensor_views_are_refused(comm):
    torch = pytest.importorskip("torch")
    for t, flag in ((torch.ones(4)._neg_view(), "is_neg"),
                    (torch.ones(4).to_sparse(), "is_sparse")):
        with pytest.raises(ringreduce.InvalidArgument) as e:
            comm.allreduce(t)
        assert f"allreduce: buffer is a tensor with {flag} set" in str(e.value), str(e.value)


@pytest.mark.parametrize("call, expect", [
    (lambda c: c.allreduce(readonly()), "allreduce: buffer must be writable"),
    (lambda c: c.allreduce(np.ones(4), readonly()), "allreduce: recv must be writable"),
    (lambda c: c.allreduce(np.arange(10.0)[::-1]), "allreduce: buffer is not C-contiguous"),
    (lambda c: c.allreduce(np.ones(4), np.ones(4, dtype=np.int32)),
     "allreduce: send is double but recv is int32"),
    (lambda c: c.allreduce([1.0, 2.0]), "allreduce: buffer must be a NumPy array"),
    (lambda c: c.allreduce(np.ones(3, dtype=">f4")), "element format '>f'"),
    (lambda c: c.allgather(np.ones(2), np.ones(3)), "allgather: recv must hold size x send"),
    (lambda c: c.allreduce(np.ones(2), op="xor"), "allreduce: unknown reduce op 'xor'"),
    (lambda c: c.reduce(np.ones(2), op=3), "reduce: op must be a ReduceOp"),
    (lambda c: c.allreduce(np.ones(2), timeout=float("nan")), "timeout must be a finite number"),
    (lambda c: c.allreduce_async(np.ones(2)).wait(timeout=-1.0), "timeout must be a finite"),
    (lambda c: c.allreduce(np.ones(2, dtype=np.uint16), dtype="float32"),
     "dtype float32 has 4-byte elements"),
    # CUDA arrays: the interface is read and checked before anything reaches the device...
    (lambda c: c.allreduce(FakeCudaArray(readonly=True)), "allreduce: buffer is read-only"),
    (lambda c: c.allreduce(FakeCudaArray(shape=(2, 3), strides=(4, 8))),
     "allreduce: buffer is not C-contiguous"),
    (lambda c: c.allreduce(FakeCudaArray(typestr=">f4")), "typestr '>f4' is not little-endian"),
    (lambda c: c.allreduce(FakeCudaArray(typestr="<c8")),
     "buffer has typestr '<c8', which ringreduce does not know"),
    # ...and a well-formed one in a process that does not use CUDA cannot be device memory.
    (lambda c: c.allreduce(FakeCudaArray(stream=1)), "allreduce #"),
    (lambda c: c.allreduce(FakeCudaArray(shape=(2, 2), strides=(8, 4))), "does not use CUDA"),
])
def test_bad_buffer_raises_invalid_argument(comm, call, expect):
    with pytest.raises(ringreduce.InvalidArgument) as e:
        call(comm)
    assert expect in str(e.value), str(e.value)
    # the communicator is still usable
    a = np.ones(3)
    comm.allreduce(a)
    assert a.tolist() == [1.0, 1.0, 1.0]
