"""What the gloo in this torch takes, for the workers that compare ringreduce with it."""

import torch
import torch.distributed as dist


def gloo_takes_half(group):
    """Whether gloo takes float16 and bfloat16 tensors. Debian's torch 2.14 (with its gloo,
    0.0~git20250912) refuses both in every call, "Invalid scalar type", raised on every rank
    before anything is sent; torch 1.13's and 2.6's take them. Collective over `group`."""
    try:
        dist.broadcast(torch.zeros(1, dtype=torch.float16), src=0, group=group)
        return True
    except RuntimeError as e:
        if "Invalid scalar type" in str(e):
            return False
        raise
