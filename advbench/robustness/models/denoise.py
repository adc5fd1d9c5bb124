"""Feature-denoising blocks (Xie et al. 2019, "Feature Denoising for Improving Adversarial Robustness").

A block filters a feature map with non-local means, y_i = Σ_j f(x_i, x_j) g(x_j) / C(x), then
adds a 1×1 conv of y (followed by batch norm) to its input. The batch norm's scale starts at
zero, so a freshly inserted block is the identity and a backbone keeps its function until
training moves it. The authors' default is the embedded-Gaussian form (softmax over positions
of θ(x_i)·φ(x_j)/√d, θ and φ 1×1 convs to half the channels, g the identity); the dot-product
form divides by the number of positions instead. Blocks go after the residual stages of a
backbone (ResNet-152: after res2..res5), chosen by `stages`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.robustness.models.preact_resnet import PreActResNet
from advbench.robustness.models.resnet_cifar import CifarResNet
from advbench.robustness.models.wide_resnet import WideResNet

KINDS = ("gaussian", "dot_product")


class DenoisingBlock(nn.Module):
    """Non-local means over all H·W positions, 1×1 conv, batch norm, residual; batched (bmm)."""

    def __init__(self, channels: int, kind: str = "gaussian", embed: bool = True) -> None:
        super().__init__()
        if kind not in KINDS:
            raise AdvbenchError(f"unknown denoising kind '{kind}'; valid: {', '.join(KINDS)}")
        self.kind = kind
        inner = max(channels // 2, 1)
        self.theta = nn.Conv2d(channels, inner, 1, bias=False) if embed else None
        self.phi = nn.Conv2d(channels, inner, 1, bias=False) if embed else None
        self.conv = nn.Conv2d(channels, channels, 1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        for embedding in (self.theta, self.phi):
            if embedding is not None:
                nn.init.normal_(embedding.weight, std=0.01)
        nn.init.kaiming_normal_(self.conv.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(self.bn.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bn(self.conv(self.non_local_means(x)))

    def non_local_means(self, x: torch.Tensor) -> torch.Tensor:
        """The filtered map y, shape of x."""
        n, c, h, w = x.shape
        theta = (x if self.theta is None else self.theta(x)).flatten(2)  # (n, d, hw)
        phi = (x if self.phi is None else self.phi(x)).flatten(2)
        g = x.flatten(2)  # (n, c, hw)
        if self.kind == "gaussian":
            affinity = torch.softmax(theta.transpose(1, 2) @ phi / math.sqrt(theta.shape[1]), dim=2)  # (n, hw, hw)
            y = g @ affinity.transpose(1, 2)
        else:
            # Without the softmax the product is associative: (g·φᵀ)·θ costs c·d·hw, never (hw)².
            y = (g @ phi.transpose(1, 2)) @ theta / (h * w)
        return y.view(n, c, h, w)


@dataclass(frozen=True)
class DenoiseSpec:
    """The `denoise:` option of a model config."""

    kind: str = "gaussian"
    embed: bool = True
    stages: Optional[tuple[int, ...]] = None  # indices of the stages followed by a block; None: all

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> DenoiseSpec:
        unknown = sorted(set(options) - {"kind", "embed", "stages"})
        if unknown:
            raise AdvbenchError(f"unknown model.denoise key '{unknown[0]}'; valid: embed, kind, stages")
        stages = options.get("stages")
        return cls(str(options.get("kind", "gaussian")), bool(options.get("embed", True)),
                   None if stages is None else tuple(int(s) for s in stages))


def add_denoising(net: nn.Module, arch: str, options: Mapping[str, Any]) -> nn.Module:
    """`net` with a denoising block after each chosen stage (inserted into the stage's Sequential).

    Keys of the existing layers keep their names where a stage is its own Sequential
    (torchvision `layer1.3` is the block after res2); in flat Sequentials (small_cnn,
    the CIFAR ResNets) later layers shift by one index per inserted block.
    """
    spec = DenoiseSpec.parse(options)
    stages = _stages(net, arch)
    chosen = range(len(stages)) if spec.stages is None else spec.stages
    bad = [s for s in chosen if not 0 <= s < len(stages)]
    if bad:
        raise AdvbenchError(f"model.denoise.stages has {bad[0]}; {arch} has stages 0..{len(stages) - 1}")
    for index in sorted(set(chosen), reverse=True):  # back to front: earlier insertions keep later indices valid
        seq, position = stages[index]
        seq.insert(position + 1, DenoisingBlock(_channels(seq[: position + 1]), spec.kind, spec.embed))
    return net


def _stages(net: nn.Module, arch: str) -> list[tuple[nn.Sequential, int]]:
    """(Sequential, index of the stage's last module) for each residual stage of `net`, in order."""
    from torchvision.models import ResNet  # here, not at import: torchvision.models pulls in torch._dynamo (~2 s)

    if isinstance(net, (ResNet, PreActResNet)):
        return [(seq, len(seq) - 1) for seq in (net.layer1, net.layer2, net.layer3, net.layer4)]
    if isinstance(net, WideResNet):
        return [(group.layer, len(group.layer) - 1) for group in (net.block1, net.block2, net.block3)]
    if isinstance(net, CifarResNet):
        return [(net.blocks, end - 1) for end in net.stage_ends]
    if isinstance(net, nn.Sequential):
        # A plain conv stack (small_cnn): each conv + ReLU is a stage.
        return [(net, i) for i in range(1, len(net)) if isinstance(net[i], nn.ReLU) and isinstance(net[i - 1], nn.Conv2d)]
    raise AdvbenchError(f"model '{arch}' takes no denoising blocks; they fit small_cnn, the CIFAR ResNets, "
                        "WideResNets, PreActResNet-18 and torchvision ResNets")


def _channels(layers: nn.Module) -> int:
    """Output channels of a stage: those of its last convolution."""
    convs = [m for m in layers.modules() if isinstance(m, nn.Conv2d)]
    return convs[-1].out_channels
