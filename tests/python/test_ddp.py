"""examples/train_ddp.py: DistributedDataParallel over ringreduce (and gloo, as a control)
trains an MLP on the digits, and synchronous data-parallel SGD gives the same parameters as
one process doing SGD on the whole batch, at 1 (a 1-rank group), 2 and 4 ranks.

Every configuration is run once (module-scoped cache) with the same short schedule and
shared by the equivalence and the accuracy tests, to keep this file fast: each rank is a
Python process importing torch, which takes a couple of seconds on a small machine.
"""

import subprocess
import sys

import pytest

from conftest import BUILD, PYDIR, REPO, RINGRUN, final_values, have_module, rank_env

np = pytest.importorskip("numpy")
pytest.importorskip("torch")
pytest.importorskip("sklearn.datasets")

EXAMPLE = REPO / "examples" / "train_ddp.py"
# 3 epochs of 23 global batches of 64, cut at 60 optimizer steps (so --steps is exercised).
SCHEDULE = ["--epochs", "3", "--steps", "60", "--batch", "64", "--quiet"]
STEPS = 60
TIMEOUT = 120  # ringrun's own guard; subprocess's (which kills ringrun) is a little later
RTOL, ATOL = 1e-4, 1e-5


class Runs:
    """Runs each configuration of the example once: key (backend, n); backend None is one
    plain process without ringrun or a process group (the reference)."""

    def __init__(self, tmp):
        self.tmp, self.done = tmp, {}

    def get(self, backend, n):
        key = (backend, n)
        if key not in self.done:
            self.done[key] = self._run(backend, n)
        return self.done[key]

    def _run(self, backend, n):
        save = self.tmp / f"params-{backend or 'none'}-{n}.npy"
        args = [sys.executable, str(EXAMPLE), *SCHEDULE, "--save", str(save)]
        if backend is None:
            cmd = args
        else:
            if not RINGRUN.exists():
                pytest.skip(f"ringrun not built in {BUILD}")
            if backend == "ringreduce" and not (have_module("_ringreduce")
                                                and have_module("_torch_backend")):
                pytest.skip(f"the ringreduce torch backend is not built in {PYDIR}")
            cmd = [str(RINGRUN), "-n", str(n), "--timeout", str(TIMEOUT), *args,
                   "--backend", backend]
        env = rank_env()
        if backend is None:
            env.pop("WORLD_SIZE", None)  # WORLD_SIZE set means "join a process group"
        try:
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=TIMEOUT + 30)
        except subprocess.TimeoutExpired as e:  # subprocess has killed ringrun by now
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
            pytest.fail(f"{' '.join(cmd)} timed out after {e.timeout}s:\n{(out or '')[-4000:]}")
        assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-6000:]}"
        final = final_values(p.stdout, 0)
        assert final["ranks"] == str(n) and final["steps"] == str(STEPS), p.stdout[-2000:]
        assert save.exists(), f"{save} was not written:\n{p.stdout[-2000:]}"
        return final, np.load(save)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("ddp"))


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("backend", ["ringreduce", "gloo"])
def test_data_parallel_sgd_equals_one_process(runs, backend, n):
    _, ref = runs.get(None, 1)
    _, got = runs.get(backend, n)
    assert got.shape == ref.shape
    diff = float(np.max(np.abs(got - ref)))
    print(f"{backend} n={n}: max |param - one process| = {diff:.3g}")
    assert np.allclose(got, ref, rtol=RTOL, atol=ATOL), (
        f"{backend} at {n} ranks: parameters differ from one process by up to {diff:.3g} "
        f"(rtol={RTOL}, atol={ATOL})")


def test_ringreduce_trains_as_well_as_gloo_and_one_process(runs):
    accs = {"one process": float(runs.get(None, 1)[0]["test_accuracy"]),
            "gloo n=4": float(runs.get("gloo", 4)[0]["test_accuracy"]),
            "ringreduce n=4": float(runs.get("ringreduce", 4)[0]["test_accuracy"])}
    print(accs)
    assert min(accs.values()) >= 0.9, accs
    assert max(accs.values()) - min(accs.values()) <= 0.02, accs
