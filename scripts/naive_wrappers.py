"""Records of the input-transformation defenses attacked *naively*, for the report's signs.

`advbench run` attacks JPEG and bit-depth reduction through BPDA and R&P through EOT and a vote,
as an adaptive evaluation must. To show what `advbench report` says about an evaluation that
does not, this script hands the same wrappers around the natural digits checkpoint to
`advbench.evaluate` as a plain model object: JPEG and bit-depth reduction without their
straight-through backward pass (the exact gradient: zero through the rounding, none through the
codec, which the oracle gives as zero), R&P declared deterministic (no EOT, one pass judges).
Each row is attacked by white-box BIM and score-based Square (500 queries) with the defenses
preset's settings (200 samples, ε∞ = 0.2, a coarse minimum-ε search); records go to
OUT/records, labelled `<defense>-naive`.

    python scripts/naive_wrappers.py ~/.cache/advbench/checkpoints/digits/small_cnn/natural-<key>.pt OUT
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import advbench
from advbench.cli.spec_builder import model_spec
from advbench.robustness.defenses.recipes import Recipe
from advbench.robustness.defenses.trainer import build_defended_model
from advbench.robustness.defenses.wrappers import JPEG, BitDepth, RandomResizePad
from advbench.robustness.models.checkpoint_files import load_checkpoint

SETTINGS = ["dataset.n_samples=200", "search.resolution=0.1", "search.max_probes=4", "threads=1"]
ATTACKS = {"bim": ("linf", {}), "square": ("linf_score", {"n_queries": 500})}


def natural(path: Path) -> torch.nn.Module:
    """The natural digits model of a cache entry, as its checkpoint's meta describes it."""
    config = torch.load(path, weights_only=True)["meta"]["config"]
    model = build_defended_model(model_spec(config["model"]), Recipe.from_config(config["recipe"]), 10, 1)
    load_checkpoint(path, model)
    return model.eval().requires_grad_(False)


def naive_rows(path: Path) -> dict[str, torch.nn.Module]:
    """JPEG (quality 75) and 1-bit reduction without BPDA; R&P (rate 0.9033) without EOT or a vote."""
    jpeg, bits = JPEG(natural(path), quality=75), BitDepth(natural(path), bits=1)
    for wrapper in (jpeg, bits):
        wrapper.straight_through = False  # the plain autograd gradient
    return {"jpeg-naive": jpeg, "bit_red-naive": bits, "rp-naive": RandomResizePad(natural(path), rate=0.9033)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="the natural digits model's cache entry")
    parser.add_argument("out", type=Path, help="records go to OUT/records")
    args = parser.parse_args()
    for attack, (threat, params) in ATTACKS.items():
        # fresh wrappers per attack: R&P's pass counter is part of its module digest, the cells' weights identity
        for label, model in naive_rows(args.checkpoint).items():
            advbench.evaluate(advbench.Model(model, label=label), "digits", attack=attack, threat=threat, attack_params=params,
                              out_dir=args.out, overrides=SETTINGS)
            print(f"{label} {attack}: done")


if __name__ == "__main__":
    main()
