"""What bench/drivers/torch_allreduce.py and bench/drivers/torch_p2p.py share: their arguments, finding the
ringreduce backend (installed, or in the build tree), and joining the process group."""

import argparse
import os
import sys

try:
    import torch
except ImportError:  # pyenv's python3 first on PATH: Debian's torch is the system interpreter's
    if os.path.exists("/usr/bin/python3") and sys.executable != "/usr/bin/python3":
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise
import torch.distributed as dist


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def start(default_max):
    """Parses the common arguments, joins the group (one torch thread per rank, as the other
    benchmarks run) and returns (args, rank, world size)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="ringreduce")
    ap.add_argument("-b", "--minbytes", default="4")
    ap.add_argument("-e", "--maxbytes", default=default_max)
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3, help="timed batches per size; the best is kept")
    ap.add_argument("--budget", type=float, default=0.15, help="seconds per timed batch (about)")
    args = ap.parse_args()
    if args.backend == "ringreduce":
        try:
            import ringreduce.torch  # noqa: F401
        except ImportError:
            here = os.path.dirname(os.path.abspath(__file__))
            build = os.environ.get("RINGREDUCE_BUILD", os.path.join(here, "..", "..", "build"))
            sys.path.insert(0, os.path.join(build, "python"))
            import ringreduce.torch  # noqa: F401
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    return args, dist.get_rank(), dist.get_world_size()
