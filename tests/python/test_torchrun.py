"""Launching with torchrun, with the command lines README's "Launching" shows, on loopback: two
torchrun processes stand for two hosts (--nnodes 2, --node_rank 0 and 1; RINGREDUCE_HOST_ID tells
ringreduce they are different hosts, so their ranks talk TCP), each starting --nproc_per_node
ranks.

- A C++ program (ringreduce-perf, --no_python): Communicator::from_env. Under torch 2.x (and torch
  1.13's static rendezvous, the default) torchrun's agent hosts torch's TCPStore on MASTER_PORT
  and sets TORCHELASTIC_USE_AGENT_STORE=True; ringreduce rendezvouses there as its client (its
  start-up log says so) instead of hosting its own store on the same port.
- A torch program (workers/torchrun_worker.py): ringreduce.init() and
  init_process_group("ringreduce"), an allreduce through each.

The underscore spellings (--nproc_per_node, --node_rank, --master_addr, --master_port,
--no_python) are the ones both torch 1.13 and 2.x accept. Runs here with the host's torch (1.13)
and in scripts/torch2's root with torch 2.6. Each torchrun runs in a session of its own, killed
(with its ranks) by process group if the test fails or runs out of time; ports are free ones.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BUILD, REPO, WORKERS, have_module, rank_env

torch = pytest.importorskip("torch")
PERF = BUILD / "tools" / "ringreduce-perf"
TIMEOUT = 90  # per launch, all torchruns together


# Debian's torch (2.6, 2.14) is built without libuv (scripts/torch2 sets USE_LIBUV=0 for it), and
# torchrun's rendezvous then needs scripts/torchrun-nolibuv, which says why.
NO_LIBUV_TORCHRUN = REPO / "scripts" / "torchrun-nolibuv"


def torchrun():
    """The torchrun of the interpreter that runs the tests (the one whose torch is tested)."""
    if int(torch.__version__.split(".")[0]) >= 2 and os.environ.get("USE_LIBUV") == "0":
        return [sys.executable, str(NO_LIBUV_TORCHRUN)]
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


# torch 1.13's torchrun on Python 3.11 (Debian bookworm's) fails before starting any rank with its
# default --redirects 0 and --tee 0: Std.from_str("0") is None there (3.11's enum.Flag no longer
# counts the empty flag as a member). Sending stdout to a file and teeing it back avoids the empty
# flag; torch 2.x has no such trouble and runs the plain line.
WORKAROUND = (["--redirects", "1", "--tee", "1"]
              if int(torch.__version__.split(".")[0]) < 2 and sys.version_info >= (3, 11) else [])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nnodes, nproc, program, env=None):
    """One torchrun per emulated host, as README shows; returns [(returncode, output)] by node."""
    port = free_port()
    procs = []
    deadline = time.monotonic() + TIMEOUT
    try:
        for node in range(nnodes):
            e = rank_env()
            e.update({"RINGREDUCE_HOST_ID": f"node{node}", "RINGREDUCE_DEBUG": "INFO",
                      "OMP_NUM_THREADS": "1"})
            e.update(env or {})
            cmd = [*torchrun(), "--nnodes", str(nnodes), "--nproc_per_node", str(nproc),
                   "--node_rank", str(node), "--master_addr", "127.0.0.1",
                   "--master_port", str(port), *WORKAROUND, *map(str, program)]
            procs.append(subprocess.Popen(cmd, env=e, cwd=REPO, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((p.returncode, out))
        return results
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun did not finish within {TIMEOUT} s")
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.communicate()


def check(results):
    text = "\n".join(f"--- node {i} (exit {rc}) ---\n{out[-5000:]}"
                     for i, (rc, out) in enumerate(results))
    assert all(rc == 0 for rc, _ in results), text
    assert "Address already in use" not in text, text
    return text


@pytest.mark.parametrize("nnodes,nproc", [(1, 2), (2, 2)])
def test_cpp_program(nnodes, nproc):
    if not PERF.exists():
        pytest.skip(f"{PERF} was not built")
    results = check(launch(nnodes, nproc, ["--no_python", PERF, "allreduce", "-b", "4", "-e",
                                           "1M", "-f", "32", "-n", "3", "-w", "1"]))
    assert "Out of bounds values : 0 OK" in results, results
    assert f"{nnodes * nproc} ranks" in results, results
    # Rank 0 says where the store is: torchrun's agent store, not one of its own.
    assert "torchrun's agent store: torch's TCPStore" in results, results


def test_torch_program():
    if not have_module("_torch_backend"):
        pytest.skip("the torch backend was not built (libtorch-dev missing)")
    results = check(launch(2, 2, [WORKERS / "torchrun_worker.py"],
                           env={"RINGREDUCE_DEBUG": "WARN"}))
    for r in range(4):
        assert f"OK rank {r} of 4 (numpy 10, torch 10)" in results, results
