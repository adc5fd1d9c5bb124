"""Cross-check of FMN against Foolbox 3.3.4's `LInfFMNAttack` / `L2FMNAttack` on the same model and samples.

Both sides run the catalogue's settings (conf/attack/fmn.yaml: 100 steps, step size 1 → 0.01,
γ 0.05 → 0.001). A sample's minimum norm is the norm of the returned example where the model
confirms it meets the goal, inf otherwise; we require our median at most 5% above Foolbox's,
the same share of samples found within 2 points, every example in the box, and success only
where the model agrees; per sample, ours at most 5% above Foolbox's on 95% of them.

Under ℓ∞ it is the same algorithm but for the radius rule before a first adversarial (see
`fmn.next_radius`), so most per-sample norms agree up to float rounding. Under ℓ2 they cannot:
Foolbox's ℓ2 projection scales δ by ‖x‖/‖x‖ = 1, so its radius never binds and its iterates are
plain normalised-gradient steps; we project, as the paper does, and end far smaller.
Measured on the 200 test digits (medians ours / Foolbox, found 100% by both, one thread, a
busy 2-core CPU): ℓ∞ untargeted 0.1026 / 0.1026 (97.5% of samples agree), targeted 0.1750 /
0.1750 (93.5%); ℓ2 untargeted 0.530 / 0.907, targeted 0.905 / 1.530; ours at most 5% above
Foolbox's on every sample in all four. Wall time a run, over two runs: ours 1.0–2.2 s, Foolbox
1.3–3.5 s. Ours costs at most 100 gradient evaluations a sample (Foolbox: 100).

Under ℓ1 (`L1FMNAttack`) ours finds every digit and Foolbox 81.5% untargeted, 83% targeted; where both
find one the medians agree (untargeted 1.375 / 1.375, targeted 2.852 / 2.852) and 93% and 82% of the
per-sample norms within 0.1%; about 0.5 s a run on either side. The difference is traced in
`test_fmn_l1_finds_every_digit_and_matches_foolbox_where_both_find`.

Under ℓ0 (`L0FMNAttack`; the digits have one channel, so Foolbox's coordinates are our pixels) both
find every digit; medians 2 / 2 pixels untargeted, 4 / 4 targeted, means 2.24 / 2.44 and 4.07 / 4.10;
equal on 72% and 80% of digits, ours at most Foolbox's on 95.5% and 91%, and never more than a pixel
above. Both take the same radius rule; Foolbox's projection keeps the k + 1 largest |δ_i| and clips
after it, ours the k whose clipped change saves the most. About 4 s a run for both sides together.
"""

from __future__ import annotations

import foolbox as fb
import pytest
import torch
from test_crosscheck_minnorm import catalogue

from advbench.core.steps import lp_norm
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.data.target_classes import target_classes

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

N = 200
FOOLBOX = {"linf": fb.attacks.LInfFMNAttack, "l2": fb.attacks.L2FMNAttack, "l1": fb.attacks.L1FMNAttack,
           "l0": fb.attacks.L0FMNAttack}


def min_norms(model, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None, x_adv: torch.Tensor,
              norm: str) -> torch.Tensor:
    with torch.inference_mode():
        pred = model(x_adv).argmax(dim=1)
    met = (pred == target) if target is not None else (pred != y)
    return torch.where(met, lp_norm(x_adv - x, norm), torch.full((len(y),), float("inf")))


def run_both(norm: str, targeted: bool, model, digits_tensors):
    """Ours and Foolbox's at the catalogue's settings on the first N test digits: each side's per-sample
    minimum norms (`min_norms`), our result and our oracle."""
    _, _, x, y = digits_tensors
    x, y = x[:N], y[:N]
    target = target_classes(torch.arange(N), y, 10, seed=0) if targeted else None
    ours_attack = catalogue("fmn")
    oracle = WhiteBoxOracle(model, N)
    ours = ours_attack(oracle, x, y, eps=torch.full((N,), 0.1), norm=norm, target=target)
    fb_attack = FOOLBOX[norm](steps=ours_attack.steps, max_stepsize=ours_attack.max_stepsize, gamma=ours_attack.gamma)
    criterion = y if target is None else fb.criteria.TargetedMisclassification(target)
    _, x_fb, _ = fb_attack(fb.PyTorchModel(model, bounds=(0.0, 1.0)), x, criterion, epsilons=None)
    assert ours.x_adv.min() >= 0.0 and ours.x_adv.max() <= 1.0
    assert (oracle.grad_evals <= ours_attack.steps).all()
    d_ours = min_norms(model, x, y, target, ours.x_adv, norm)
    assert torch.equal(ours.success, torch.isfinite(d_ours)), "success where the model disagrees"
    return d_ours, min_norms(model, x, y, target, x_fb, norm)


@pytest.mark.parametrize("targeted", [False, True])
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_fmn_matches_foolbox(norm: str, targeted: bool, tiny_model, digits_tensors) -> None:
    d_ours, d_theirs = run_both(norm, targeted, tiny_model, digits_tensors)
    found_ours, found_theirs = torch.isfinite(d_ours).float().mean(), torch.isfinite(d_theirs).float().mean()
    same = torch.isclose(d_ours, d_theirs, rtol=1e-3) | (torch.isinf(d_ours) & torch.isinf(d_theirs))
    not_weaker = (d_ours <= 1.05 * d_theirs).float().mean()
    seen = (f"median min {norm} ours {d_ours.median():.4f} vs Foolbox {d_theirs.median():.4f}; per-sample "
            f"norms agree on {same.float().mean():.1%}, ours at most 5% above on {not_weaker:.1%}")
    assert float(d_ours.median()) <= 1.05 * float(d_theirs.median()), seen
    assert abs(float(found_ours - found_theirs)) <= 0.02, f"found ours {found_ours:.1%} vs Foolbox {found_theirs:.1%}"
    assert not_weaker >= 0.95, seen
    if norm == "linf":
        assert same.float().mean() >= 0.9, seen


@pytest.mark.parametrize("targeted", [False, True])
def test_fmn_l1_finds_every_digit_and_matches_foolbox_where_both_find(targeted: bool, tiny_model,
                                                                       digits_tensors) -> None:
    """Ours finds every sample, Foolbox's `L1FMNAttack` 81.5% (untargeted) and 83% (targeted); where both
    find one, the norms are Foolbox's. Foolbox clips after its ℓ1 projection, which cuts the step
    on the digits' saturated pixels, so iterates fall short of the linearised boundary's distance
    and its radius, set to that distance alone before a first adversarial, never passes the
    boundary; ours projects onto ball ∩ box exactly (`Norm.project`), and would find every sample
    with either of the two fixes alone (its radius rule, `fmn.next_radius`, or the exact projection)."""
    d_ours, d_theirs = run_both("l1", targeted, tiny_model, digits_tensors)
    both = torch.isfinite(d_ours) & torch.isfinite(d_theirs)
    same = torch.isclose(d_ours[both], d_theirs[both], rtol=1e-3).float().mean()
    seen = (f"found ours {torch.isfinite(d_ours).float().mean():.1%}, Foolbox {torch.isfinite(d_theirs).float().mean():.1%}; where both "
            f"found, median ours {d_ours[both].median():.4f} vs {d_theirs[both].median():.4f}, equal on {same:.1%}")
    assert torch.isfinite(d_ours).all() and 0.7 <= torch.isfinite(d_theirs).float().mean() < 0.95, seen
    assert float(d_ours[both].median()) <= 1.01 * float(d_theirs[both].median()), seen
    assert same >= 0.75, seen
    assert (d_ours <= 1.05 * d_theirs).float().mean() >= 0.95, seen


@pytest.mark.parametrize("targeted", [False, True])
def test_fmn_l0_matches_foolbox(targeted: bool, tiny_model, digits_tensors) -> None:
    """Every digit found by both; our median pixel count at most Foolbox's, ours never more than a pixel above
    on any digit, at most Foolbox's on 85% of them, equal on 60% (measured: 95.5% / 91% and 72% / 80%)."""
    d_ours, d_theirs = run_both("l0", targeted, tiny_model, digits_tensors)
    seen = (f"found ours {torch.isfinite(d_ours).float().mean():.1%}, Foolbox {torch.isfinite(d_theirs).float().mean():.1%}; "
            f"median pixels ours {d_ours.median():.0f} vs {d_theirs.median():.0f}, mean {d_ours.mean():.3f} vs "
            f"{d_theirs.mean():.3f}; equal on {(d_ours == d_theirs).float().mean():.1%}, ours at most Foolbox's on "
            f"{(d_ours <= d_theirs).float().mean():.1%}")
    print(seen)
    assert torch.isfinite(d_ours).all() and torch.isfinite(d_theirs).float().mean() >= 0.98, seen
    assert torch.equal(d_ours, d_ours.round()), "pixel counts are whole"
    assert float(d_ours.median()) <= float(d_theirs.median()), seen
    assert (d_ours <= d_theirs + 1).all(), seen
    assert (d_ours <= d_theirs).float().mean() >= 0.85 and (d_ours == d_theirs).float().mean() >= 0.6, seen
