"""examples/train_accelerate.py: a small GPT-2 (Transformers, built from a config: nothing is
downloaded) trained on CPU with Accelerate and with the Trainer over the ringreduce process group,
against the same run over gloo's: the losses must agree step by step.

At 2 ranks they agree exactly (the tolerance, RTOL, only keeps the test from failing on a
last-bit change): DDP divides each gradient by the number of ranks and the allreduce adds two
float32 values, and a + b is the same number whatever the algorithm; Accelerate's gather of the
loss moves values without arithmetic. Every run starts from the same seeded weights and data. So
any difference means a gradient went wrong, not noise; the loss also has to fall (LEARNS), so
that equal curves are not two runs that did nothing.

And that Accelerate 1.14 still refuses the backend by name on CPU, so that docs/PYTHON.md's way
around it (the process group made first) stays the one needed: a single process with a
2-rank environment meets the refusal before any rendezvous.

Needs Accelerate and Transformers (Debian sid's python3-accelerate and python3-transformers, in
scripts/torch2 --suite sid's root); skipped elsewhere. Launches with torchrun
(scripts/torchrun-nolibuv where Debian's torch has no libuv), each in a session of its own,
killed with its ranks by process group when it fails or runs out of time.
"""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, have_module, rank_env

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate", reason="Accelerate is not installed (python3-accelerate: "
                    "Debian sid has it, scripts/torch2 --suite sid installs it)")
pytest.importorskip("transformers", reason="Transformers is not installed (python3-transformers: "
                    "Debian sid has it, scripts/torch2 --suite sid installs it)")

EXAMPLE = REPO / "examples" / "train_accelerate.py"
STEPS = 20
TIMEOUT = 120  # per launch: importing Transformers in every rank takes seconds on 2 cores
RTOL = 1e-5
LEARNS = 1.0  # the loss falls by more than this over STEPS steps (4.17 to about 2.3 here)


def torchrun():
    """The torchrun of the interpreter that runs the tests; Debian's torch 2.x (no libuv) needs
    scripts/torchrun-nolibuv, which says why."""
    if int(torch.__version__.split(".")[0]) >= 2 and os.environ.get("USE_LIBUV") == "0":
        return [sys.executable, str(REPO / "scripts" / "torchrun-nolibuv")]
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env):
    """Runs cmd in a session of its own; on a timeout kills the session (torchrun and its ranks)
    and fails. Returns (returncode, output)."""
    p = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=TIMEOUT)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(map(str, cmd))} did not finish within {TIMEOUT} s")
    finally:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.communicate()


def env():
    e = rank_env()
    e["OMP_NUM_THREADS"] = "1"
    return e


def train(backend, *args):
    """examples/train_accelerate.py under torchrun, 2 ranks; rank 0's (losses, final values)."""
    if backend == "ringreduce" and not have_module("_torch_backend"):
        pytest.skip("the ringreduce torch backend was not built")
    cmd = [*torchrun(), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
           str(free_port()), str(EXAMPLE), "--backend", backend, "--steps", str(STEPS), "--quiet",
           *args]
    rc, out = run(cmd, env())
    assert rc == 0, f"{' '.join(cmd)} exited {rc}:\n{out[-6000:]}"
    losses = [line for line in out.splitlines() if line.startswith("losses: ")]
    final = [line for line in out.splitlines() if line.startswith("final: ")]
    assert len(losses) == 1 and len(final) == 1, out[-6000:]
    values = dict(kv.split("=", 1) for kv in final[0].split()[1:])
    return [float(x) for x in losses[0].split()[1:]], values


@pytest.mark.parametrize("mode", ["accelerate", "trainer"])
def test_losses_equal_gloo(mode):
    extra = ["--trainer"] if mode == "trainer" else []
    ours, ours_final = train("ringreduce", *extra)
    gloo, gloo_final = train("gloo", *extra)
    # DDP ran on the group named: ringreduce's, not a gloo group Accelerate made instead.
    assert ours_final["backend"] == "ringreduce" and gloo_final["backend"] == "gloo"
    assert ours_final["mode"] == mode and ours_final["ranks"] == "2"
    assert len(ours) == len(gloo) == STEPS, (ours, gloo)
    assert ours == pytest.approx(gloo, rel=RTOL), f"ringreduce {ours}\ngloo       {gloo}"
    assert ours[-1] < ours[0] - LEARNS, f"the loss did not fall: {ours}"


@pytest.mark.parametrize("mode", ["accelerate", "trainer"])
def test_named_backend_is_refused(mode):
    """Accelerate (InitProcessGroupKwargs(backend=)) and the Trainer (TrainingArguments(
    ddp_backend=)) on CPU refuse any backend but gloo and mpi: the documented way in is making
    the group first. If this starts passing the name through, docs/PYTHON.md should say so."""
    e = env()
    # One process that believes it is rank 0 of 2: the refusal comes before any rendezvous.
    e.update({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    args = ["--trainer", "--init", "trainer"] if mode == "trainer" else ["--init", "accelerate"]
    cmd = [sys.executable, str(EXAMPLE), "--backend", "ringreduce", *args]
    rc, out = run(cmd, e)
    assert rc != 0, out[-4000:]
    assert "Your assigned backend ringreduce is not available, please use gloo" in out, out[-4000:]
