"""The module's surface, in one process (a 1-rank communicator needs no launcher): __version__ is
the library's and version.h's, each call takes only its own arguments (one it does not take is an
InvalidArgument, a ValueError naming the rank, the call and the argument), and
ringreduce.TimeoutError is Python's TimeoutError."""

import ctypes
import re
import socket

import pytest

from conftest import BUILD, PYDIR, REPO, have_module

if not have_module("_ringreduce"):
    pytest.skip(f"ringreduce not built in {BUILD}", allow_module_level=True)

import sys  # noqa: E402

sys.path.insert(0, str(PYDIR))
np = pytest.importorskip("numpy")
import ringreduce  # noqa: E402

# Every argument some call takes; each call is tried with each one it does not take.
ALL_ARGS = ["send", "recv", "op", "root", "dtype", "timeout", "premul_factor", "wire", "counts",
            "send_counts", "recv_counts", "buf", "dst", "src", "tag"]
# What each call takes, in order (the stub and the error message must say the same).
TAKES = {
    "allreduce": ["send", "recv", "op", "dtype", "timeout", "premul_factor", "wire"],
    "reduce_scatter": ["send", "recv", "op", "dtype", "timeout", "premul_factor", "wire"],
    "allgather": ["send", "recv", "dtype", "timeout", "wire"],
    "alltoall": ["send", "recv", "dtype", "timeout"],
    "broadcast": ["send", "recv", "root", "dtype", "timeout"],
    "reduce": ["send", "recv", "op", "root", "dtype", "timeout", "premul_factor"],
    "gather": ["send", "recv", "root", "dtype", "timeout"],
    "scatter": ["send", "recv", "root", "dtype", "timeout"],
    "allgatherv": ["send", "recv", "counts", "dtype", "timeout"],
    "reduce_scatterv": ["send", "recv", "counts", "op", "dtype", "timeout", "premul_factor"],
    "alltoallv": ["send", "recv", "send_counts", "recv_counts", "dtype", "timeout"],
    "send": ["buf", "dst", "tag", "dtype", "timeout"],
    "recv": ["buf", "src", "tag", "dtype", "timeout"],
    "barrier": ["timeout"],
}
CALLS = [c for name in TAKES for c in (name, name + "_async")]
# A value of the right type for each argument a call requires.
REQUIRED = {"send": np.zeros(2), "recv": np.zeros(2), "buf": np.zeros(2), "counts": [2],
            "send_counts": [2], "recv_counts": [2], "dst": 0}


def one_rank():
    """A 1-rank communicator; its store listens on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return ringreduce.Communicator(rank=0, size=1, addr=f"127.0.0.1:{port}")


@pytest.fixture(scope="module")
def comm():
    c = one_rank()
    yield c
    c.close()


def header_version():
    text = (REPO / "include" / "ringreduce" / "version.h").read_text()
    return re.search(r'^#define RINGREDUCE_VERSION_STRING "([^"]+)"', text, re.M).group(1)


def test_version_is_the_running_librarys_and_version_h():
    lib = ctypes.CDLL(str(BUILD / "libringreduce.so.0"))
    lib.rr_version.restype = ctypes.c_char_p
    assert ringreduce.__version__ == lib.rr_version().decode()
    assert ringreduce.__version__ == header_version()
    assert ringreduce._ringreduce.__version__ == ringreduce.__version__


def test_setup_py_reads_the_same_version():
    # setup.py runs setup() when executed; its read_version() alone, from the file's source.
    src = (REPO / "setup.py").read_text()
    ns = {"__file__": str(REPO / "setup.py")}
    exec(compile(src.split("\nclass ")[0], "setup.py", "exec"), ns)
    assert ns["read_version"]() == header_version()
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject
    assert not re.search(r"^version\s*=", pyproject, re.M), "a second version in pyproject.toml"


@pytest.mark.parametrize("call", CALLS)
def test_each_call_refuses_an_argument_it_does_not_take(comm, call):
    takes = TAKES[call.removesuffix("_async")]
    required = [REQUIRED[a] for a in takes if a in REQUIRED]
    others = [a for a in ALL_ARGS if a not in takes] + ["tiemout"]
    for arg in others:
        with pytest.raises(ringreduce.InvalidArgument) as e:
            getattr(comm, call)(*required, **{arg: 1})
        assert isinstance(e.value, ValueError)
        assert str(e.value) == (f"rank 0: {call}: does not take '{arg}' "
                                f"(its arguments: {', '.join(takes)})")
    # ... and what it does take is taken, by keyword (send and recv: test_send_and_recv_...).
    if call.startswith(("send", "recv")):
        return
    kw = {a: REQUIRED[a] for a in takes if a in REQUIRED}
    out = getattr(comm, call)(**kw, timeout=30)
    if call.endswith("_async"):
        assert out.wait(timeout=30)


def test_send_and_recv_take_their_arguments_by_keyword(comm):
    # One rank has no peer to talk to: the refusal that comes is the call's own, past the
    # arguments (an async call's, from its Work; tests/python/test_p2p.py exchanges messages).
    def run(call, **kw):
        out = call(**kw)
        if isinstance(out, ringreduce.Work):
            out.wait(timeout=30)

    for call in (comm.send, comm.send_async):
        with pytest.raises(ringreduce.InvalidArgument, match="cannot send to or receive from itself"):
            run(call, buf=np.arange(3.0), dst=0, tag=5, dtype="float64", timeout=30)
    for call in (comm.recv, comm.recv_async):
        with pytest.raises(ringreduce.InvalidArgument, match="cannot send to or receive from itself"):
            run(call, buf=np.zeros(3), src=0, tag=5, dtype="float64", timeout=30)


def test_the_issues_examples_are_refused(comm):
    a, b = np.ones(2), np.zeros(2)
    with pytest.raises(ValueError, match=r"allgather: does not take 'op'"):
        comm.allgather(a, b, op="max")
    with pytest.raises(ValueError, match=r"alltoall: does not take 'root'"):
        comm.alltoall(a, b, root=1)
    with pytest.raises(ValueError, match=r"broadcast: does not take 'op', 'premul_factor'"):
        comm.broadcast(a, op="sum", premul_factor=2.0)
    # Nothing ran: b is untouched.
    assert b.tolist() == [0.0, 0.0]


def test_positional_surplus_or_missing_arguments_stay_pythons_type_error(comm):
    a, b = np.ones(2), np.zeros(2)
    with pytest.raises(TypeError):
        comm.allgather(a, b, None, None, "extra")
    with pytest.raises(TypeError):
        comm.allgather(a)  # recv is required
    with pytest.raises(TypeError):
        comm.allgather(a, b, send=a)  # twice


def test_a_refused_argument_on_a_closed_communicator_still_names_the_call():
    c = one_rank()
    c.close()
    with pytest.raises(ringreduce.InvalidArgument, match=r"^allgather: does not take 'op'"):
        c.allgather(np.ones(1), np.ones(1), op="max")


def test_timeout_error_is_pythons_timeout_error():
    assert issubclass(ringreduce.TimeoutError, TimeoutError)
    assert issubclass(ringreduce.TimeoutError, ringreduce.Error)
    assert issubclass(ringreduce.InvalidArgument, ValueError)
    # A receive nobody sends to times out: caught as the builtin, carrying ringreduce's fields.
    # (A timeout ends the communicator, as an abort: this one is the test's own.)
    comm = one_rank()
    try:
        comm.recv(np.zeros(1), tag=7, timeout=0.05)
    except TimeoutError as e:
        assert type(e) is ringreduce.TimeoutError
        assert isinstance(e, ringreduce.Error)
        assert e.code == int(ringreduce.ErrorCode.TIMEOUT)
        assert e.peer is None
        assert "rank 0: recv" in str(e) and "timed out" in str(e), str(e)
    else:
        pytest.fail("recv from nobody did not time out")
    finally:
        comm.close()
