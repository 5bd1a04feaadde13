"""One rank of test_errors. argv[1] picks the case; the rank prints "RAISED <class> <message>" for
the error it got (or "NO ERROR"), and the test checks every rank's line.

  mismatch        rank 1 allreduces one element more than the others
  bad_root        broadcast from a root that is not a rank (caught before anything is sent)
  dead_peer       rank 1 exits without joining the allreduce; the others wait
  torch_mismatch  the same as mismatch through torch.distributed with backend "ringreduce"
  torch_p2p_size  rank 0 sends rank 1 100 floats where rank 1 receives 200 (then all barrier)
  sigint          rank 0 gets SIGINT while its allreduce waits for rank 1, which comes 2 s late:
                  rank 0 prints "INTERRUPTED <seconds from the signal>", the others their error
  torch_sigint    the same through torch.distributed (argv[2]: elements; 65536 waits in a Work's
                  wait(), 16 runs inline in the call)
"""

import os
import sys

import numpy as np

import ringreduce

case = sys.argv[1]


def report(fn):
    try:
        fn()
        print("NO ERROR", flush=True)
    except Exception as e:  # noqa: BLE001  the test wants to see whatever was raised
        peer = getattr(e, "peer", None)
        print(f"RAISED {type(e).__module__}.{type(e).__name__} peer={peer} {e}", flush=True)


if case.startswith("torch"):
    import torch
    import torch.distributed as dist

    import ringreduce.torch  # noqa: F401

    dist.init_process_group("ringreduce")
    R = dist.get_rank()
    # Every rank past init_process_group's store barrier before rank 0 (the store's host) can
    # fail and exit.
    dist.barrier()
    if case == "torch_sigint":
        import signal
        import threading
        import time

        n = int(sys.argv[2])
        if R == 0:
            sent = []

            def interrupt():
                time.sleep(0.5)
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)

            threading.Thread(target=interrupt, daemon=True).start()
            try:
                dist.all_reduce(torch.zeros(n))
                print("NO ERROR", flush=True)
            except KeyboardInterrupt:
                print(f"INTERRUPTED {time.monotonic() - sent[0]:.3f}", flush=True)
        else:
            time.sleep(2)
            # A small allreduce may complete: rank 0 had contributed when it was interrupted
            # (the flat algorithm reads its part in place). The barrier after it cannot.
            report(lambda: dist.all_reduce(torch.zeros(n)))
            report(lambda: dist.barrier())
    elif case == "torch_mismatch":
        report(lambda: dist.all_reduce(torch.zeros(100 + (R == 1))))
    elif case == "torch_p2p_size":

        def exchange():
            if R == 0:
                dist.send(torch.zeros(100), 1, tag=3)
            elif R == 1:
                dist.recv(torch.zeros(200), 0, tag=3)
            dist.barrier()  # how the ranks that took no part learn of it

        report(exchange)
    sys.stdout.flush()
    os._exit(0)  # the group is failed; skip its teardown

comm = ringreduce.init()
R, N = comm.rank, comm.size
if case == "mismatch":
    report(lambda: comm.allreduce(np.zeros(100 + (R == 1), dtype=np.float32)))
elif case == "bad_root":
    report(lambda: comm.broadcast(np.zeros(4), root=N))
    # the communicator is still usable afterwards: nothing was sent
    a = np.ones(3)
    comm.allreduce(a)
    print("AFTER", a.tolist(), flush=True)
elif case == "sigint":
    import signal
    import threading
    import time

    comm.barrier()
    if R == 0:
        sent = []

        def interrupt():
            time.sleep(0.5)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        try:
            comm.allreduce(np.zeros(1 << 16, dtype=np.float32), timeout=60)
            print("NO ERROR", flush=True)
        except KeyboardInterrupt:
            print(f"INTERRUPTED {time.monotonic() - sent[0]:.3f}", flush=True)
    else:
        time.sleep(2)
        report(lambda: comm.allreduce(np.zeros(1 << 16, dtype=np.float32), timeout=60))
elif case == "dead_peer":
    comm.barrier()
    if R == 1:
        os._exit(0)
    report(lambda: comm.allreduce(np.zeros(1 << 20, dtype=np.float32)))
sys.stdout.flush()
os._exit(0)
