#!/usr/bin/python3
"""Peer benchmark: torch.distributed all_reduce (backend "gloo") on float32 CPU tensors over TCP
loopback. Launches N worker processes itself (subprocess; env:// rendezvous on 127.0.0.1 with
MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, GLOO_SOCKET_IFNAME=lo) and prints nccl-tests style rows
on rank 0:

    size(B) count type redop time(us) algbw(GB/s) busbw(GB/s) #wrong   # iters

Needs the Debian python3-torch, so run it with /usr/bin/python3:
    /usr/bin/python3 bench/peers/torch_gloo.py -N 4 -b 4 -e 256M -f 4
Same flags and iteration policy as gloo_allreduce / mpi_allreduce (see perf_common.h).
"""
import argparse
import math
import os
import signal
import socket
import subprocess
import sys
import time


def parse_size(s):
    mul = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip()
    if s and s[-1].lower() in mul:
        return int(float(s[:-1]) * mul[s[-1].lower()])
    return int(float(s))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-N", "--nranks", type=int, default=2, help="processes to launch")
    p.add_argument("-b", dest="min_bytes", type=parse_size, default=4)
    p.add_argument("-e", dest="max_bytes", type=parse_size, default=32 << 20)
    p.add_argument("-f", dest="factor", type=int, default=2)
    p.add_argument("-n", dest="iters", type=int, default=0, help="timed iterations; 0 = adaptive")
    p.add_argument("-w", dest="warmup", type=int, default=5, help="at most this many warmup runs")
    p.add_argument("-T", dest="target_s", type=float, default=0.3, help="adaptive: seconds per size")
    p.add_argument("-m", dest="min_iters", type=int, default=3)
    p.add_argument("-M", dest="max_iters", type=int, default=10000)
    p.add_argument("-c", dest="check", type=int, default=1)
    p.add_argument("-P", dest="prime", type=int, default=1, help="one untimed run at MAX first")
    p.add_argument("-d", dest="dtype", default="float", choices=["float"])
    p.add_argument("-o", dest="op", default="sum", choices=["sum"])
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--timeout", type=float, default=600, help="process group timeout (s)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.factor = max(2, a.factor)
    a.min_bytes = max(4, a.min_bytes)
    a.min_iters = max(1, a.min_iters)
    a.max_iters = max(a.min_iters, a.max_iters)
    a.warmup = max(1, a.warmup)
    return a


def sizes(a):
    s = a.min_bytes
    while s <= a.max_bytes:
        yield s
        s *= a.factor


def extra_warmup(a, first_s):
    if a.iters > 0:
        return a.warmup - 1
    by_time = int((a.target_s / 3.0) / first_s) if first_s > 0 else a.warmup
    return max(0, min(a.warmup - 1, by_time))


def timed_iters(a, est_s):
    if a.iters > 0:
        return a.iters
    want = math.ceil(a.target_s / est_s) if est_s > 0 else a.max_iters
    return int(min(max(want, a.min_iters), a.max_iters))


def time_runs(a, first_s, run, agree_max):
    """Warmup and timed runs of one size; same policy as time_runs() in perf_common.h: timed runs
    go in batches (adaptive mode) and stop early, once min_iters ran, when the ranks agree that
    4 T has been spent. Returns (mean time per run, max over ranks; timed runs)."""
    extra = extra_warmup(a, agree_max(first_s))
    t0 = time.perf_counter()
    for _ in range(extra):
        run()
    est = (time.perf_counter() - t0) / extra if extra > 0 else first_s
    iters = timed_iters(a, agree_max(est))
    adaptive = a.iters <= 0
    batch = max(1, (iters + 7) // 8) if adaptive else iters
    budget = 4 * a.target_s
    done, total = 0, 0.0
    agree_max(0.0)  # barrier
    while done < iters:
        k = min(batch, iters - done)
        t0 = time.perf_counter()
        for _ in range(k):
            run()
        total += time.perf_counter() - t0
        done += k
        if adaptive and done < iters and done >= a.min_iters and agree_max(total) > budget:
            break
    return agree_max(total / done), done


def worker(a):
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    if os.environ.get("PEER_BIND") == "core":
        # Same placement as ringrun and mpirun: rank r on the r-th usable core.
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ["RANK"]) % len(cores)]})
    rank = int(os.environ["RANK"])
    n = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=a.timeout))

    def agree(v, op):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return float(t.item())

    all_sizes = list(sizes(a))
    buf = torch.zeros(a.max_bytes // 4, dtype=torch.float32)
    if a.prime and all_sizes:
        dist.all_reduce(buf[: all_sizes[-1] // 4])  # one untimed run at the largest size

    if rank == 0:
        print(f"# torch {torch.__version__} torch.distributed all_reduce, backend gloo "
              f"(intra-op threads {a.threads})")
        print(f"# float32 sum allreduce, {n} ranks, TCP loopback")
        if a.iters > 0:
            print(f"# iterations: {a.iters} timed after {a.warmup} warmup")
        else:
            print(f"# iterations: adaptive, ~{a.target_s:.2f} s per size (cut at {4 * a.target_s:.2f} s), "
                  f"{a.min_iters}..{a.max_iters} timed, <={a.warmup} warmup")
        print(f"# {'primed with one run at the largest size' if a.prime else 'not primed'}; "
              "time = mean per-iteration time, max over ranks; busbw = algbw * 2(N-1)/N")
        print("#")
        print("# %10s %12s %6s %6s %10s %8s %8s %7s %7s" %
              ("size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "iters"))
        print("# %10s %12s %6s %6s %10s %8s %8s %7s %7s" %
              ("(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "", ""))
        sys.stdout.flush()

    for nbytes in all_sizes:
        count = nbytes // 4
        t = buf[:count]
        # Inputs: small non-negative integers, so sums are exact in float32 (same as perf_common.h).
        base = torch.arange(count, dtype=torch.int32) * 7 % 61
        t.copy_((base + rank * 13) % 61)
        want = None
        if a.check:
            want = torch.zeros(count, dtype=torch.float32)
            for r in range(n):
                want += (base + r * 13) % 61

        agree(0.0, dist.ReduceOp.MAX)  # barrier
        t0 = time.perf_counter()
        dist.all_reduce(t)  # in-place; the check run is also the first warmup run
        first = time.perf_counter() - t0
        wrong = int((t != want).sum().item()) if a.check else 0
        del want, base

        per_iter, iters = time_runs(a, first, lambda: dist.all_reduce(t),
                                    lambda x: agree(x, dist.ReduceOp.MAX))
        total_wrong = int(agree(float(wrong), dist.ReduceOp.SUM))
        if rank == 0:
            algbw = nbytes / per_iter / 1e9
            busbw = algbw * 2 * (n - 1) / n
            print("  %10d %12d %6s %6s %10.2f %8.3f %8.3f %7d  # %d" %
                  (nbytes, count, "float", "sum", per_iter * 1e6, algbw, busbw, total_wrong, iters))
            sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a, argv):
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(a.nranks),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS=str(a.threads))
    procs = []

    def stop(*_):
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()

    def on_signal(signum, _frame):
        stop()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for r in range(a.nranks):
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"] + argv,
                                          env=dict(env, RANK=str(r), LOCAL_RANK=str(r))))
        rc = 0
        pending = list(procs)
        while pending:
            for p in list(pending):
                code = p.poll()
                if code is None:
                    continue
                pending.remove(p)
                if code != 0 and rc == 0:
                    rc = code if code > 0 else 1
                    print(f"torch_gloo: a rank exited with {code}; stopping the others", file=sys.stderr)
                    stop()
            time.sleep(0.05)
        return rc
    finally:
        stop()


def main():
    argv = sys.argv[1:]
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    return launch(a, [x for x in argv if x != "--worker"])


if __name__ == "__main__":
    sys.exit(main())
