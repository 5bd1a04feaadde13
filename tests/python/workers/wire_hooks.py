"""One rank of test_wire: how much error gradient compression adds, measured against an exact
float64 average, for torch's fp16_compress_hook (on ringreduce and, where Debian's gloo takes
float16, on gloo) and ringreduce's wire_hook (f16, bf16, fp8, each formats' bound); then a DDP
step with each wire hook, error feedback included, checked against the uncompressed step.

Every rank builds every rank's gradient from its seed (normal values, a tenth of them 1000x
larger, as gradients of a layer with a few outliers), so each can compute the exact mean.
Output (rank 0): "err METHOD=<max |error| / max |exact|>", then "OK".

    usage: wire_hooks.py   (under ringrun)
"""

import math
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import ringreduce.torch  # noqa: F401  registers the backend
from gloo_probe import gloo_takes_half
from ringreduce.torch.hooks import wire_hook

torch.set_num_threads(1)
dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
R, N = dist.get_rank(), dist.get_world_size()
GLOO = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
COUNT = 1 << 16


def gradient(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(COUNT, generator=g, dtype=torch.float64)
    big = torch.rand(COUNT, generator=g) < 0.1
    x[big] *= 1000
    return x


class Bucket:
    """What a comm hook reads of DDP's GradBucket."""

    def __init__(self, tensor):
        self.t = tensor

    def buffer(self):
        return self.t

    def get_tensor(self):  # torch 1.13's name
        return self.t

    def index(self):
        return 0

    def is_last(self):
        return True


exact = sum(gradient(r) for r in range(N)) / N
scale = exact.abs().max().item()


# Each format's unit roundoff, half its smallest subnormal step and its largest value (None: not
# scaled): the bound of docs/WIRE.md.
FORMATS = {"f16": (2 ** -11, 2 ** -25, 65504.0), "bf16": (2 ** -8, 2 ** -134, None),
           "fp8": (2 ** -4, 2 ** -10, 240.0)}


def floor_at(fmt, amax):
    """Half a subnormal step at the block exponent of a block whose largest value is amax (no
    block's exponent exceeds the one of the whole buffer's largest value)."""
    _, half, fmax = FORMATS[fmt]
    return half if fmax is None else half * 2.0 ** math.ceil(math.log2(amax / fmax))


def bound(fmt):
    """Per element: a rounding of each rank's input (averaged), one of the result, and float32's
    own rounding of the sum and the division."""
    u = FORMATS[fmt][0]
    b = torch.zeros(COUNT, dtype=torch.float64)
    mag = torch.zeros(COUNT, dtype=torch.float64)
    for r in range(N):
        x = gradient(r)
        b += u * x.abs() + floor_at(fmt, x.abs().max().item())
        mag += x.abs()
    b /= N
    b += u * (exact.abs() + b) + floor_at(fmt, exact.abs().max().item() * 1.01)
    return b + N * 2 ** -23 * mag / N


def measure(name, hook, state, fmt=None):
    buf = gradient(R).to(torch.float32)
    out = hook(state, Bucket(buf)).wait()
    diff = (out.double() - exact).abs()
    err = diff.max().item() / scale
    if R == 0:
        print(f"err {name}={err:.6g}", flush=True)
    if fmt is not None:
        over = (diff > bound(fmt)).sum().item()
        assert over == 0, f"{name}: {over} elements beyond the bound"
        if R == 0:
            print(f"bound {name} ok", flush=True)
    return err


measure("fp16_compress_hook_ringreduce", default_hooks.fp16_compress_hook, None)
if gloo_takes_half(GLOO):
    measure("fp16_compress_hook_gloo", default_hooks.fp16_compress_hook, GLOO)
for wire in ("f16", "bf16", "fp8"):
    measure(f"wire_hook_{wire}", wire_hook(wire), None, wire)

# A DDP step with each wire hook, against the uncompressed one: the same model on every rank,
# within the format's rounding of the plain step; with error feedback, the second step's gradient
# carries the first one's residual.
torch.manual_seed(5)
data = torch.randn(64, 32)
target = torch.randn(64, 4)


def step_params(hook_name):
    torch.manual_seed(7)
    net = torch.nn.Linear(32, 4)
    model = torch.nn.parallel.DistributedDataParallel(net)
    if hook_name:
        wire, _, ef = hook_name.partition("-")
        model.register_comm_hook(None, wire_hook(wire, error_feedback=bool(ef)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        part = data[R * 64 // N:(R + 1) * 64 // N]
        torch.nn.functional.mse_loss(model(part), target[R * 64 // N:(R + 1) * 64 // N]).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


plain = step_params(None)
for name, tol in (("bf16", 2e-2), ("bf16-ef", 2e-2), ("fp8", 2e-1), ("fp8-ef", 2e-1)):
    p = step_params(name)
    rel = ((p - plain).abs().max() / plain.abs().max()).item()
    everywhere = [torch.zeros_like(p) for _ in range(N)]
    dist.all_gather(everywhere, p, group=GLOO)
    same = all(torch.equal(everywhere[0], q) for q in everywhere)
    if R == 0:
        print(f"ddp {name} rel={rel:.3g} same_on_every_rank={same}", flush=True)
    assert same, f"{name}: the ranks' models differ"
    assert rel < tol, f"{name}: {rel} from the uncompressed step"
if R == 0:
    print("OK", flush=True)
dist.destroy_process_group()
