"""ImageNet classifiers from torchvision, with weights from a local file (never downloaded)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.torchfile import first_mismatch, read_torch_file
from advbench.robustness.models.architectures import ARCHITECTURES, IMAGENET_MEAN, IMAGENET_STD

# Inception-v3's and GoogLeNet's auxiliary heads only feed a training loss; the benchmark never uses them.
_DROPPED_PREFIXES = {"inception_v3": ("AuxLogits.",), "googlenet": ("aux1.", "aux2.")}
_NO_AUX = {"aux_logits": False, "init_weights": False, "transform_input": False}
# The architectures `advbench weights fetch` knows.
_FETCHABLE = ("resnet50", "resnet152", "inception_v3")


# Stacked registrations apply bottom-up: inception_v3, resnet50, resnet152 is the listed order.
@ARCHITECTURES.register("resnet152", IMAGENET_MEAN, IMAGENET_STD, "resnet152")
@ARCHITECTURES.register("resnet50", IMAGENET_MEAN, IMAGENET_STD, "resnet50")
# torchvision's Inception-v3 weights expect (x - 0.5) / 0.5 (its `transform_input`).
@ARCHITECTURES.register("inception_v3", (0.5,), (0.5,), "inception_v3")
def torchvision_net(name: str, num_classes: int, in_channels: int, weights_path: str | None = None) -> nn.Module:
    """Build torchvision's `name`; load a torchvision state dict from `weights_path` if given."""
    from torchvision import models  # here, not at import: torchvision.models pulls in torch._dynamo (~2 s)

    if in_channels != 3:
        raise AdvbenchError(f"{name} takes 3-channel images, the data set has {in_channels}")
    kwargs = _NO_AUX if name in _DROPPED_PREFIXES else {}
    net = models.get_model(name, weights=None, num_classes=num_classes, **kwargs)
    if weights_path is not None:
        _load_weights(net, name, Path(weights_path).expanduser())
    return net


def _load_weights(net: nn.Module, name: str, path: Path) -> None:
    from torchvision import models

    if not path.is_file():
        published = list(models.get_model_weights(name))
        url = f"download {published[0].url}" if published else "save its state dict"
        fetch = f"`advbench weights fetch {name}` (or {url})" if name in _FETCHABLE else url
        raise AdvbenchError(f"weights file '{path}' for {name} not found; {fetch} and set model.weights_path=<file>")
    state = read_torch_file(path, f"{name} weights file")
    if not isinstance(state, dict):
        raise AdvbenchError(f"'{path}' is not a state dict for {name}")
    dropped = _DROPPED_PREFIXES.get(name, ())
    state = {k: v for k, v in state.items() if not k.startswith(dropped)}
    mismatch = first_mismatch(state, net.state_dict())
    if mismatch:
        raise AdvbenchError(f"weights file '{path}' does not fit {name}: {mismatch}")
    net.load_state_dict(state)
