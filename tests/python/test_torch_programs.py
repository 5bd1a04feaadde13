"""Real programs on torch.distributed with backend "ringreduce", each against the same program
on gloo (and, where it is one in disguise, against one process), at 2 and 4 ranks:

- DDP with comm hooks: fp16 compression, PowerSGD (compressing from step 2);
- DDP no_sync() gradient accumulation; DDP find_unused_parameters=True with branches unused on
  some steps by some or all ranks;
- ZeroRedundancyOptimizer (Adam), its state consolidated on rank 0;
- Join([DDP, ZeroRedundancyOptimizer]) with uneven inputs per rank;
- object collectives in a training loop (config broadcast, per-step metrics all-gathered, stop
  decision broadcast, state_dicts all-gathered, summary gathered);
- FSDP on CPU, from torch 2.x (torch 1.13's FSDP needs CUDA: skipped there, saying so);
- examples/train_pipeline.py, two-stage pipeline parallelism over send/recv (2 ranks only):
  ringreduce, gloo and one process end with the same parameters and test accuracy.

workers/torch_programs.py runs every program in one job per world size, on the default group
(ringreduce) and on a gloo group over the same ranks, and does the comparisons (its docstring has
them). A program that raises stops the job; the programs after it run in a new job, so each
test reports its own program. Runs on torch 1.13 here and on torch 2.x in scripts/torch2's root.
"""

import subprocess
import sys

import pytest

from conftest import BUILD, REPO, RINGRUN, final_values, have_module, launch, rank_env

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
if not have_module("_torch_backend"):
    pytest.skip("the torch backend was not built (libtorch-dev missing)", allow_module_level=True)

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
PROGRAMS = ["no_sync", "fp16_hook", "powersgd", "find_unused", "zero", "join", "objects", "fsdp"]
FSDP_SKIP = None if TORCH2 else (
    f"torch {torch.__version__}: FullyShardedDataParallel before torch 2 needs CUDA (with no "
    f"device_id it places the module on torch.cuda.current_device()); it trains on CPU from "
    f"torch 2.x with device_id=cpu, where this test runs it")
if FSDP_SKIP:
    try:
        import torch.distributed.fsdp  # noqa: F401
    except Exception as e:  # noqa: BLE001  (torch 1.13 on Python 3.11: a dataclass ValueError)
        FSDP_SKIP += f"; nor does torch.distributed.fsdp import here ({type(e).__name__}: {e})"
RUNNABLE = [p for p in PROGRAMS if p != "fsdp" or FSDP_SKIP is None]
JOB_TIMEOUT = 150  # ringrun's guard per job; a hung collective times out after 30 s (the worker's)


class Programs:
    """One worker job per world size (more only when a program crashes the job): for each
    program, (ok, report)."""

    def __init__(self):
        self.done = {}

    def get(self, n):
        if n not in self.done:
            self.done[n] = self._run(n)
        return self.done[n]

    def _run(self, n):
        results, todo = {}, list(RUNNABLE)
        while todo:
            try:
                rc, lines, out = launch(n, "torch_programs.py", *todo, timeout=JOB_TIMEOUT,
                                        env={"RINGREDUCE_TIMEOUT": "30"}, expect_ok=False)
            except subprocess.TimeoutExpired as e:  # ringrun's own guard failed; it is killed
                out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
                for p in todo:
                    results[p] = (False, f"the job ({todo}) outlived its timeout {e.timeout}s:\n"
                                  f"{(out or '')[-4000:]}")
                break
            if sorted(lines) != list(range(n)) or not all(
                    any(l.startswith(f"torch {torch.__version__} world {n} backend ringreduce")
                        for l in lines[r]) for r in range(n)):
                for p in todo:
                    results[p] = (False, f"the job did not start (exit {rc}):\n{out[-4000:]}")
                break
            crashed = None
            for p in todo:
                fails = [f"rank {r}: {l}" for r in range(n) for l in lines[r]
                         if l.startswith(f"FAIL {p}:")]
                done = [next((l for l in lines[r] if l.startswith(f"DONE {p} ")), None)
                        for r in range(n)]
                if all(done):
                    results[p] = (not fails, "\n".join(fails) or f"rank 0: {done[0]}")
                    continue
                # This program did not finish: the job stopped in it. Each rank's lines from there.
                crashed = p
                tails = []
                for r in range(n):
                    begin = [i for i, l in enumerate(lines[r]) if l == f"BEGIN {p}"]
                    tail = lines[r][begin[0]:] if begin else ["(never began)"]
                    tails.append(f"--- rank {r}:\n" + "\n".join(tail[:80]))
                results[p] = (False, f"the job stopped in {p} (ringrun exit {rc}):\n"
                              + "\n".join(fails) + "\n" + "\n".join(tails)
                              + f"\n--- end of the job's output:\n{out[-1500:]}")
                break
            if crashed is None:
                if rc != 0:  # every program finished, yet the job failed (at its end?): say so
                    results["_job"] = (False, f"exit {rc}:\n{out[-3000:]}")
                break
            todo = todo[todo.index(crashed) + 1:]
        return results


@pytest.fixture(scope="module")
def programs():
    return Programs()


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("prog", PROGRAMS)
def test_program_same_on_ringreduce_and_gloo(programs, prog, n):
    if prog == "fsdp" and FSDP_SKIP:
        pytest.skip(FSDP_SKIP)
    results = programs.get(n)
    ok, report = results[prog]
    print(report)
    assert ok, f"{prog} at {n} ranks:\n{report}"
    if "_job" in results and all(results[p][0] for p in RUNNABLE):
        pytest.fail(f"every program passed but the job failed: {results['_job'][1]}")


# ---- the pipeline example ------------------------------------------------------------------------
PIPELINE = REPO / "examples" / "train_pipeline.py"
# Its default schedule: 20 epochs of 23 batches of 64 (the last partial one dropped), 4 micro-
# batches each: 460 steps, 0.963 test accuracy.
PIPE_SCHEDULE = ["--epochs", "20", "--batch", "64", "--micro", "4", "--quiet"]
PIPE_STEPS = 460
PIPE_TIMEOUT = 120
RTOL, ATOL = 1e-4, 1e-5


def _run(cmd, env, timeout):
    try:
        return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # subprocess has killed ringrun (and its ranks) by now
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        pytest.fail(f"{' '.join(cmd)} timed out after {e.timeout}s:\n{(out or '')[-4000:]}")


class PipelineRuns:
    """The example once per backend (None: one process running both stages)."""

    def __init__(self, tmp):
        self.tmp, self.done = tmp, {}

    def get(self, backend):
        if backend not in self.done:
            self.done[backend] = self._run(backend)
        return self.done[backend]

    def _run(self, backend):
        save = self.tmp / f"pipeline-{backend or 'none'}.npy"
        args = [sys.executable, str(PIPELINE), *PIPE_SCHEDULE, "--save", str(save)]
        env = rank_env()
        if backend is None:
            cmd = args
            env.pop("WORLD_SIZE", None)  # WORLD_SIZE set means "join a process group"
        else:
            if not RINGRUN.exists():
                pytest.skip(f"ringrun not built in {BUILD}")
            cmd = [str(RINGRUN), "-n", "2", "--timeout", str(PIPE_TIMEOUT), *args,
                   "--backend", backend]
        p = _run(cmd, env, PIPE_TIMEOUT + 30)
        assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-6000:]}"
        final = final_values(p.stdout, 1)
        assert final["ranks"] == ("2" if backend else "1") and final["steps"] == str(PIPE_STEPS), \
            p.stdout[-2000:]
        assert save.exists(), f"{save} was not written:\n{p.stdout[-2000:]}"
        return final, np.load(save)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return PipelineRuns(tmp_path_factory.mktemp("pipeline"))


@pytest.mark.parametrize("backend", ["ringreduce", "gloo"])
def test_pipeline_same_parameters_as_one_process(pipeline, backend):
    """Activations and gradients cross unchanged: the two stages on two ranks compute what one
    process computes."""
    ref_final, ref = pipeline.get(None)
    final, got = pipeline.get(backend)
    assert got.shape == ref.shape
    d = float(np.max(np.abs(got - ref)))
    print(f"{backend}: max |param - one process| = {d:.3g}, {final}")
    assert np.allclose(got, ref, rtol=RTOL, atol=ATOL), (
        f"{backend}: parameters differ from one process by up to {d:.3g}")
    assert abs(float(final["loss"]) - float(ref_final["loss"])) <= 1e-3, (final, ref_final)


def test_pipeline_trains_as_well_on_ringreduce_as_on_gloo(pipeline):
    accs = {b or "one process": float(pipeline.get(b)[0]["test_acc"])
            for b in (None, "gloo", "ringreduce")}
    print(accs)
    assert min(accs.values()) >= 0.95, accs
    assert max(accs.values()) - min(accs.values()) <= 0.005, accs


def test_pipeline_refuses_other_world_sizes():
    """Without its 2 ranks it says so and exits, before joining any process group (one process
    stands in for a rank of a 3-rank job: no launcher needed)."""
    env = rank_env()
    env.update(WORLD_SIZE="3", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    p = _run([sys.executable, str(PIPELINE), "--quiet"], env, 60)
    assert p.returncode != 0 and "exactly 2 ranks, not 3" in p.stdout, p.stdout[-2000:]
