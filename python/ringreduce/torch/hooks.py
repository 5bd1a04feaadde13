"""DDP communication hooks that send gradients in a narrow wire format, summed in float32.

    from ringreduce.torch.hooks import wire_hook
    model = torch.nn.parallel.DistributedDataParallel(model)       # on a "ringreduce" group
    model.register_comm_hook(None, wire_hook("bf16"))              # or "fp8", error_feedback=True

Unlike torch's fp16_compress_hook, which casts the gradient to float16 and leaves the backend to
add float16 values at every hop of its ring (so the error grows with the number of ranks), the
float32 gradient goes to ringreduce as it is: each rank's share is rounded once on its way to the
rank that owns its block, summed there in float32, averaged, and rounded once for the way back
(docs/WIRE.md). With error_feedback, each bucket keeps what rounding took from this rank's input
and adds it to the next step's gradient (as 1-bit Adam and PowerSGD do), so that nothing is lost
for good, only late.

The process group is the hook's state when it is one (as torch's allreduce_hook takes it), else
`group` (default: the world). Works on torch 1.13, 2.6 and 2.14 (a ringreduce group).
"""

import torch
import torch.distributed as dist

from . import _torch_backend

_NAMES = {"fp8": "fp8e4m3"}


def _backend_of(group):
    if _torch_backend.TORCH_MAJOR >= 2:
        return group._get_backend(torch.device("cpu"))
    return group


def _blocks(n, size):
    # The coded allreduce's blocks: rank j owns split(n, size, j), the first n % size one longer.
    base, extra = divmod(n, size)
    at = 0
    for j in range(size):
        count = base + (1 if j < extra else 0)
        yield j, at, count
        at += count


class WireHookState:
    """What a wire_hook keeps: the format, and with error feedback each bucket's residual."""

    def __init__(self, wire, error_feedback, group):
        self.wire = _NAMES.get(wire, wire)
        self.error_feedback = error_feedback
        self.group = group
        self.residuals = {}

    def lost(self, buffer, rank, size):
        """What the coded allreduce's rounding takes from this rank's input: its share of every
        other rank's block is rounded on the way (block by block, as the links code it); its own
        block stays exact."""
        rounded = buffer.clone()
        for j, at, count in _blocks(buffer.numel(), size):
            if j != rank and count > 0:
                _torch_backend.wire_round(rounded[at:at + count], self.wire)
        lost = buffer - rounded
        for j, at, count in _blocks(buffer.numel(), size):
            if j == rank:
                lost[at:at + count] = 0
        return lost


def wire_hook(wire="bf16", error_feedback=False, group=None):
    """A DDP comm hook (model.register_comm_hook(None, wire_hook(...))): gradient buckets
    averaged over the group with wire format `wire` ("bf16", "f16", "fp8" = "fp8e4m3",
    "fp8e5m2", "auto"); error_feedback keeps each bucket's rounding residual for its next step."""
    state = WireHookState(wire, error_feedback, group)
    if error_feedback and state.wire in ("auto", "none"):
        raise ValueError(f"wire_hook: error feedback needs a format that always codes (bf16, f16, "
                         f"fp8, fp8e5m2), not {wire!r}")

    def hook(process_group, bucket):
        pg = process_group if isinstance(process_group, dist.ProcessGroup) else (
            state.group if state.group is not None else dist.group.WORLD)
        buffer = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
        if buffer.dtype != torch.float32:
            raise TypeError(f"wire_hook: gradients of {buffer.dtype}; the wire formats code "
                            "float32 gradients (keep the model in float32)")
        if state.error_feedback:
            key = bucket.index()
            residual = state.residuals.get(key)
            if residual is not None and residual.shape == buffer.shape:
                buffer.add_(residual)
            state.residuals[key] = state.lost(buffer, pg.rank(), pg.size())
        work = _torch_backend.allreduce_wire(_backend_of(pg), buffer, state.wire, True)
        return work.get_future().then(lambda fut: fut.value()[0])

    hook.state = state
    return hook
