"""A module object the caller hands in, handed back as it came.

The Python API uses the caller's network in place (copying a large one would cost its
memory), and an evaluation changes it: each module's `training` flag (put in eval mode),
its parameters' `requires_grad` (frozen while only the input's gradient is wanted), the
device its tensors live on, and torch's global random state, which a stochastic model draws
from. A notebook that goes on training the module after a benchmark must find it as it left
it, so all of that is restored when the call ends, normally or by an exception.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def caller_state_kept(model: nn.Module, device: str) -> Iterator[None]:
    """Within: anything goes; on leaving, every module of `model` has its `training` flag, every
    parameter its `requires_grad` and its tensor, every buffer its tensor (so its device) back,
    and torch's global generators their state."""
    modes = [(module, module.training) for module in model.modules()]
    grads = [(parameter, parameter.requires_grad) for parameter in model.parameters()]
    tensors = [(module, dict(module._parameters), {k: p.data for k, p in module._parameters.items() if p is not None},
                dict(module._buffers)) for module in model.modules()]
    cuda = torch.cuda.is_available() and str(device) != "cpu"
    try:
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []):
            yield
    finally:
        for module, training in modes:
            module.training = training
        for module, parameters, data, buffers in tensors:
            module._parameters.update(parameters)
            for name, tensor in data.items():
                parameters[name].data = tensor
            module._buffers.update(buffers)
        for parameter, requires_grad in grads:
            parameter.requires_grad_(requires_grad)
