"""FAB-ℓ1 beside the original AutoAttack's FAB (pyautoattack 0.2.0, norm='L1') and advbench's other
minimum-norm ℓ1 attacks, FMN-ℓ1 and EAD, on the natural digits model, in one process.

The first `--samples` test digits of `dataset=digits` (the engine's sample order) go to each attack
at its catalogue settings (conf/attack/<name>.yaml, seed 0) under threat=l1's budget ε1 = 2, as
`advbench run attack=<name> threat=l1` hands them: FAB (3 final-search steps), FAB without it (the
original's iterations alone), FMN (ℓ1), EAD; and the original's `FABAttack_PT(norm='L1')` with the
same settings (100 iterations, one start). The original keeps only examples within its `eps`, so
it gets 1e3: with one start its search does not depend on it. Per attack: the median smallest ℓ1
(a sample not broken counts as infinite), the share broken at all, the robust accuracy at ε1 = 2,
gradient evaluations a sample (ours, as the oracle counts them), the wall time and the process's CPU
time (on a shared machine the CPU time is the steadier figure), one thread.

    python scripts/bench_fab_l1.py ~/.cache/advbench/checkpoints/digits/small_cnn/natural-<key>.pt
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
from hydra.utils import instantiate
from naive_wrappers import natural
from omegaconf import OmegaConf
from pyautoattack.fab_pt import FABAttack_PT

from advbench.core.catalog import option_file
from advbench.core.norms import norm
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.data.digits import Digits

L1 = norm("l1")
EPS = 2.0
"""threat=l1's budget on digits (conf/dataset/digits.yaml)."""


def catalogue(name: str, **params):
    """The attack option at its catalogue settings, seed 0, with `params` on top."""
    cfg = OmegaConf.load(option_file("attack", name)).params
    if "seed" in cfg:
        cfg.seed = 0
    return instantiate(cfg, **params)


def ours(name: str, **params) -> Callable:
    def run(model, x, y, ids):
        oracle = WhiteBoxOracle(model, len(y))
        res = catalogue(name, **params)(oracle, x, y, eps=torch.full((len(y),), EPS), norm="l1", sample_id=ids)
        return res.x_adv, float(oracle.grad_evals.float().mean())
    return run


def original_fab(model, x, y, ids):
    fab = catalogue("fab")
    attack = FABAttack_PT(model, norm="L1", n_restarts=fab.n_restarts, n_iter=fab.n_iter, eps=1e3, alpha_max=fab.alpha_max,
                          eta=fab.eta, beta=fab.beta, seed=0, device="cpu")
    return attack.perturb(x, y), float("nan")


ATTACKS = {"fab": ours("fab"), "fab final_search=0": ours("fab", final_search=0), "original FAB L1": original_fab,
           "fmn": ours("fmn"), "ead": ours("ead")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="the natural digits model's cache entry")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--only", nargs="*", choices=sorted(ATTACKS), help="these attacks only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = natural(args.checkpoint)
    data = Digits(n_samples=args.samples).eval_set()
    x = torch.stack([data[i][0] for i in range(len(data))])
    y, ids = data.labels, data.sample_ids
    print(f"{len(y)} digits, clean accuracy {(model(x).argmax(1) == y).float().mean():.1%}, ε1 = {EPS:g}")
    print(f"{'attack':<20} {'median ℓ1':>10} {'found':>7} {'robust@2':>9} {'grads':>7} {'wall s':>7} {'cpu s':>7}")
    for name in args.only or ATTACKS:
        started, cpu = time.perf_counter(), time.process_time()
        x_adv, grads = ATTACKS[name](model, x, y, ids)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        with torch.no_grad():
            fooled = model(x_adv).argmax(1) != y
        dist = torch.where(fooled, L1.distance(x_adv, x), torch.full_like(y, torch.inf, dtype=x.dtype))
        print(f"{name:<20} {dist.median():>10.4f} {torch.isfinite(dist).float().mean():>7.1%} "
              f"{(dist > EPS).float().mean():>9.1%} {grads:>7.0f} {wall:>7.1f} {cpu:>7.1f}")


if __name__ == "__main__":
    main()
