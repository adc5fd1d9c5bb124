"""How strong each backward pass through JPEG and bit depth makes an attack on a defended metric.

For each offline metric (CNNQA, niqe_fitted), defense setting and budget, I-FGSM (10 steps of
1/255) and Korhonen–You attack the defended metric with three gradients and the defended metric
judges the result:

- `naive`: the undefended metric's gradient at the input (`defense.bpda=false`);
- `identity`: BPDA with the identity, the metric's gradient at the defended image
  (`defense.backward=identity`);
- `default`: what `defense.bpda=true` does by default (the differentiable JPEG; for bit depth the
  mean of the two gradients above).

    python scripts/bpda_backwards.py                 # 8 crops, 64 px (CNNQA) / 128 px (NIQE)
    python scripts/bpda_backwards.py --images 16

Prints the mean raw gain in each metric's better direction (larger: a stronger attack); docs/iqa.md
quotes a run.
"""

from __future__ import annotations

import argparse

import torch

from advbench.cli.metrics import build_metric
from advbench.quality.attacks.iterative import IFGSM, Korhonen
from advbench.quality.images import as_batch, uap_images
from advbench.quality.metrics.defended import KINDS, DefendedMetric, MetricDefense
from advbench.quality.metrics.metric_contract import QualityMetric

SETTINGS = [("jpeg", {"quality": 50}), ("jpeg", {"quality": 75}), ("jpeg", {"quality": 90}),
            ("bit_depth", {"bits": 3}), ("bit_depth", {"bits": 5})]
SIZES = {"cnnqa": 64, "niqe_fitted": 128}   # NIQE needs 96 px at least


def gains(metric: QualityMetric, name: str, params: dict, x: torch.Tensor, attack, eps: float) -> dict[str, float]:
    """Mean gain on the defended metric, in its better direction, of `attack` led by each backward."""
    typed = KINDS[name].params(**params)
    judge = DefendedMetric(metric, MetricDefense(name, typed))
    leads = {"naive": DefendedMetric(metric, MetricDefense(name, typed, bpda=False)),
             "identity": DefendedMetric(metric, MetricDefense(name, typed, backward="identity")), "default": judge}
    sign = 1.0 if metric.higher_better else -1.0
    out = {}
    for lead, attacked in leads.items():
        x_adv = attack.run(attacked, x, torch.full((len(x),), eps)).x_adv
        with torch.no_grad():
            out[lead] = sign * float((judge(x_adv) - judge(x)).mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8, help="sample-photo test crops per metric")
    args = parser.parse_args()
    attacks = {"ifgsm": IFGSM(steps=10, alpha=1 / 255), "korhonen": Korhonen()}
    print("| metric | defense | attack | ε | naive | identity | default |\n|---|---|---|---|---|---|---|")
    for metric_name, size in SIZES.items():
        metric = build_metric(metric_name).eval()
        x = as_batch(uap_images(None, split="test", size=size, limit=args.images))
        for name, params in SETTINGS:
            for attack_name, attack in attacks.items():
                for eps in (4, 8):
                    g = gains(metric, name, params, x, attack, eps / 255)
                    setting = f"{name} {next(iter(params.values()))}"
                    print(f"| {metric_name} | {setting} | {attack_name} | {eps}/255 | {g['naive']:+.3f} | "
                          f"{g['identity']:+.3f} | {g['default']:+.3f} |", flush=True)


if __name__ == "__main__":
    main()
