"""Cross-check of FAB and FAB-T against torchattacks 3.5.1's `FAB` on the same model and samples.

Both sides run the catalogue's settings (conf/attack/fab.yaml, fab_t.yaml: 100 iterations, one
restart, α_max = 0.1, η = 1.05, β = 0.9; FAB-T over the 9 runner-up classes, torchattacks'
`multi_targeted`). torchattacks keeps only examples within its `eps`, so it gets 1e3 (every
example), and we pass the same as the threat's ε, so FAB-T's later target classes go on the
samples with no example at all on both sides. torchattacks has no final search; ours runs the
catalogue's 3 steps, which only lower norms. A sample's minimum norm is the norm of the returned
example where the model confirms it is misclassified, inf otherwise; we require our median at most
1.05× theirs, the share found within 2 points, and our examples in the [0, 1] box.

Measured on the 200 test digits (one CPU thread, a shared 2-core machine), median / found / wall:
  FAB ℓ∞    ours 0.1002 / 100% / 5.4 s    torchattacks 0.1006 / 100% / 7.1 s
  FAB ℓ2    ours 0.5081 / 100% / 7.7 s    torchattacks 0.5120 / 100% / 7.0 s
  FAB-T ℓ∞  ours 0.1027 / 100% / 1.3 s    torchattacks 0.1031 / 100% / 1.4 s
  FAB-T ℓ2  ours 0.5317 / 100% / 1.2 s    torchattacks 0.5369 / 100% / 1.7 s
Without the final search (final_search=0) the medians are torchattacks' to 4 digits on all four
(ℓ∞ 0.1006 and 0.1031, ℓ2 0.5120 and 0.5369). Both sides forward the iterate once an iteration and
take one backward of it per class (`boundary_gradients`: K − 1, counted as K − 1 gradients; torchattacks K).
"""

from __future__ import annotations

import time

import pytest
import torch
import torchattacks
from test_crosscheck_minnorm import catalogue, min_norms

from advbench.robustness.attacks.oracles import WhiteBoxOracle

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

N = 200
EVERYTHING = 1e3
"""ε of both sides: no example is too large to keep."""


@pytest.mark.parametrize("option", ["fab", "fab_t"])
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_fab_matches_torchattacks(option: str, norm: str, tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    x, y = x[:N], y[:N]
    ours_attack = catalogue(option, seed=0)
    started = time.perf_counter()
    ours = ours_attack(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.full((N,), EVERYTHING), norm=norm)
    ours_s = time.perf_counter() - started
    multi = ours_attack.n_target_classes > 0
    theirs_attack = torchattacks.FAB(tiny_model, norm={"linf": "Linf", "l2": "L2"}[norm], eps=EVERYTHING,
                                     steps=ours_attack.n_iter, n_restarts=ours_attack.n_restarts,
                                     alpha_max=ours_attack.alpha_max, eta=ours_attack.eta, beta=ours_attack.beta,
                                     multi_targeted=multi, n_classes=ours_attack.n_target_classes + 1 if multi else 10)
    started = time.perf_counter()
    x_theirs = theirs_attack(x, y)
    theirs_s = time.perf_counter() - started

    assert ours.x_adv.min() >= 0 and ours.x_adv.max() <= 1
    d_ours, d_theirs = min_norms(tiny_model, x, y, ours.x_adv, norm), min_norms(tiny_model, x, y, x_theirs, norm)
    assert torch.equal(torch.isfinite(d_ours), ours.success), "success only where the model agrees"
    found_ours, found_theirs = torch.isfinite(d_ours).float().mean(), torch.isfinite(d_theirs).float().mean()
    summary = (f"{option} {norm}: median ours {d_ours.median():.4f} / torchattacks {d_theirs.median():.4f}, "
               f"found {found_ours:.1%} / {found_theirs:.1%}, {ours_s:.1f} s / {theirs_s:.1f} s")
    print(summary)
    assert float(d_ours.median()) <= 1.05 * float(d_theirs.median()), summary
    assert abs(float(found_ours - found_theirs)) <= 0.02, summary
