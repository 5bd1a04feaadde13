"""What gpu-check's Python workers (cuda_tensors.py, cuda_backend.py) share: results checked
against the same call on CPU tensors, one "FAIL ..." line per wrong one, and "OK <n> checks" (or
"FAILED") last, exiting 1 on a failure."""

import sys

import torch


class Checks:
    def __init__(self, rank):
        self.rank, self.count, self.failures = rank, 0, []

    def check(self, what, got, want):
        """got (on any device) must equal want, element for element."""
        self.count += 1
        if not torch.equal(got.cpu(), want.cpu()):
            self.failures.append(f"FAIL rank {self.rank}: {what}: "
                                 f"{got.cpu().flatten()[:8].tolist()} != "
                                 f"{want.cpu().flatten()[:8].tolist()}")

    def fail(self, what, why):
        """A check that failed in a way of its own (an error, or none where one was due)."""
        self.failures.append(f"FAIL rank {self.rank}: {what}: {why}")

    def finish(self, note=""):
        for line in self.failures[:20]:
            print(line, flush=True)
        print(f"{'OK' if not self.failures else 'FAILED'} {self.count} checks{note}", flush=True)
        sys.exit(1 if self.failures else 0)
