"""APGD: the paper's checkpoints and step-size rule, the DLR losses, targeted DLR, cost counting,
determinism and independence from the batch. The catalogue contract (bounds, budget, success
claimed only where the model agrees) runs on its YAMLs in test_attacks.py."""

from __future__ import annotations

import pytest
import torch
from contract import assert_budgeted_contract

import advbench.robustness.attacks.apgd as apgd
from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.apgd import APGD, checkpoints, dlr_loss, halve_step
from advbench.robustness.attacks.oracles import WhiteBoxOracle, build_oracle
from advbench.robustness.data.target_classes import target_classes

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:120], y[:120]


def attack(oracle_model, x, y, eps, norm="linf", target=None, sample_id=None, **kw):
    oracle = WhiteBoxOracle(oracle_model, len(y))
    res = APGD(**kw)(oracle, x, y, eps=torch.full((len(y),), eps), norm=norm, target=target, sample_id=sample_id)
    return res, oracle


def test_checkpoints_follow_the_papers_formula() -> None:
    # p = 0, .22, .41, .57, .70, .80, .87, .93, .99 from p_{j+1} = p_j + max(p_j - p_{j-1} - .03, .06)
    assert checkpoints(100) == [0, 22, 41, 57, 70, 80, 87, 93, 99]
    assert checkpoints(20) == [0, 5, 9, 12, 14, 16, 18, 19, 20]   # w_j = ceil(p_j N)
    assert checkpoints(1000) == [0, 220, 410, 570, 700, 800, 870, 930, 990]


def test_halving_conditions() -> None:
    """Condition 1: fewer than rho*interval loss increases; condition 2: neither eta nor the best
    loss changed since the last checkpoint."""
    increases = torch.tensor([12, 11, 16, 16, 16])
    best = torch.tensor([1.0, 1.0, 1.0, 1.0, 2.0])
    best_last = torch.tensor([0.5, 0.5, 1.0, 1.0, 1.0])
    halved_last = torch.tensor([False, False, False, True, False])
    out = halve_step(increases, 16, 0.75, best, best_last, halved_last)
    assert out.tolist() == [False, True, True, False, False]


def test_step_size_halves_only_at_checkpoints(tiny_model, batch, monkeypatch) -> None:
    """Spy on the loop: the rule is consulted exactly at the checkpoints with the paper's
    intervals, and eta (the step of the gradient move) starts at 2*eps and is halved exactly
    for the samples the rule selects, right after the checkpoint."""
    x, y = batch
    calls: list[tuple[int, torch.Tensor]] = []
    etas: list[torch.Tensor] = []
    real_halve, real_ascend = apgd.halve_step, apgd.ascend

    def spy_halve(increases, interval, *args):
        out = real_halve(increases, interval, *args)
        calls.append((interval, out.clone()))
        return out

    def spy_ascend(cur, x0, direction, alpha, *args):
        if not bool((alpha == 1).all()):   # the momentum move steps by 1; the gradient move by eta
            etas.append(alpha.clone())
        return real_ascend(cur, x0, direction, alpha, *args)

    monkeypatch.setattr(apgd, "halve_step", spy_halve)
    monkeypatch.setattr(apgd, "ascend", spy_ascend)
    eps = 0.004                     # nobody breaks: every sample runs all iterations
    res, _ = attack(tiny_model, x, y, eps, n_iter=50)
    assert not res.success[tiny_model(x).argmax(1) == y].any()
    marks = checkpoints(50)
    assert [c[0] for c in calls] == [b - a for a, b in zip(marks, marks[1:]) if b < 50]
    assert len(etas) == 50
    robust = tiny_model(x).argmax(1) == y
    expected = torch.full((int(robust.sum()),), 2 * eps)
    halvings = dict(zip([w for w in marks[1:] if w < 50], (c[1] for c in calls)))
    for k, eta in enumerate(etas):
        if k in halvings:
            expected = torch.where(halvings[k], expected / 2, expected)
        assert torch.allclose(eta, expected), f"eta at iteration {k}"
    assert (expected < 2 * eps).any(), "some sample should have halved its step by the end"


def test_dlr_is_invariant_to_shift_and_scale() -> None:
    z = torch.tensor([[3.0, 1.0, 0.5, -1.0], [0.0, 2.0, 1.0, 0.5]])
    y = torch.tensor([0, 0])
    t = torch.tensor([1, 2])
    for target in (None, t):
        base = dlr_loss(z, y, target)
        assert torch.allclose(dlr_loss(3 * z + 7, y, target), base, atol=1e-6)
    # sample 0: -(3 - 1) / (3 - 0.5); sample 1 (y not on top): -(0 - 2) / (2 - 0.5)
    assert torch.allclose(dlr_loss(z, y, None), torch.tensor([-2 / 2.5, 2 / 1.5]))
    # targeted: -(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2)
    assert torch.allclose(dlr_loss(z, y, t), torch.tensor([-2 / (3 + 0.25), 1 / (2 - 0.25)]))


@pytest.mark.parametrize("norm,eps", [("linf", 0.3), ("l2", 2.5)])
def test_targeted_dlr_reaches_the_target(norm: str, eps: float, tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(len(y)), y, 10, seed=0)
    res, _ = attack(tiny_model, x, y, eps, norm=norm, target=target, loss="dlr", n_iter=30)
    pred = tiny_model(res.x_adv).argmax(1)
    assert torch.equal(res.success, pred == target)
    assert res.success.float().mean() >= 0.9


def test_cost_is_counted_per_sample_by_the_oracle(tiny_model, batch) -> None:
    """One gradient per iterate until a sample breaks (iterate t costs t + 1 gradients); a robust
    sample takes n_iter gradients and one forward pass at the last iterate, besides the clean one."""
    x, y = batch
    res, oracle = attack(tiny_model, x, y, 0.1, n_iter=20)
    clean_wrong = tiny_model(x).argmax(1) != y
    broke_in_run = res.success & ~clean_wrong
    assert torch.equal(oracle.grad_evals[clean_wrong], torch.zeros(int(clean_wrong.sum()), dtype=torch.long))
    assert torch.equal(oracle.grad_evals[broke_in_run], torch.clamp(res.first_success[broke_in_run] + 1, max=20))
    assert (oracle.grad_evals[~res.success] == 20).all()
    assert torch.equal(oracle.queries, 1 + (oracle.grad_evals == 20).long())


def test_restarts_and_target_classes_count_iterations_across_runs(tiny_model, batch) -> None:
    x, y = batch
    single, _ = attack(tiny_model, x, y, 0.1, n_iter=10, loss="dlr")
    apgd_t, oracle = attack(tiny_model, x, y, 0.1, n_iter=10, loss="dlr", n_target_classes=3, n_restarts=2)
    assert APGD(n_iter=10, n_target_classes=3, n_restarts=2).steps == 60
    assert (apgd_t.first_success <= 60).all() and (oracle.grad_evals <= 60).all()
    assert (apgd_t.first_success > 10).any(), "later runs break samples the first run left robust"
    assert apgd_t.success.sum() >= single.success.sum()


@pytest.mark.parametrize(("norm", "knowledge"), [("linf", "white"), ("l2", "white"), ("l1", "transfer")])
@pytest.mark.parametrize("targeted", [False, True])
def test_apgd_t_keeps_the_catalogue_contract_on_a_short_schedule(norm: str, knowledge: str, targeted: bool, tiny_model,
                                                                 substitute, batch) -> None:
    """test_attacks.py runs `apgd_t` (9 x 100 iterations) only with the slow tests; the same
    contract on 9 x 8 iterations, plus batch independence; under ℓ1 crafted on the substitute and
    judged on the target by counted queries (`l1_transfer`)."""
    x, y = batch
    n = len(y)
    target = target_classes(torch.arange(n), y, 10, seed=0) if targeted else None
    eps = torch.linspace(0.2, 1.0, n) * {"linf": 0.1, "l2": 0.8, "l1": 1.5}[norm] * (3 if targeted else 1)
    apgd_t = APGD(loss="dlr", n_iter=8, n_target_classes=9)
    oracle = build_oracle(knowledge, tiny_model, n, substitute)
    res = apgd_t(oracle, x, y, eps=eps, norm=norm, target=target)
    assert_budgeted_contract(apgd_t, res, oracle, tiny_model, x, y, eps, norm, target)
    assert (oracle.queries > 0).all()
    assert res.success.float().mean() > 0.1
    ids = torch.arange(n)
    halves = [apgd_t(oracle.subset(i), x[i], y[i], eps=eps[i], norm=norm, target=None if target is None else target[i],
                     sample_id=i) for i in (ids[:60], ids[60:])]
    assert torch.allclose(res.x_adv, torch.cat([h.x_adv for h in halves]), atol=1e-5)
    assert torch.equal(res.first_success, torch.cat([h.first_success for h in halves]))


def test_deterministic_under_a_seed(tiny_model, batch) -> None:
    x, y = batch
    a, _ = attack(tiny_model, x, y, 0.08, n_iter=20, seed=3)
    b, _ = attack(tiny_model, x, y, 0.08, n_iter=20, seed=3)
    c, _ = attack(tiny_model, x, y, 0.08, n_iter=20, seed=4)
    assert torch.equal(a.x_adv, b.x_adv) and torch.equal(a.first_success, b.first_success)
    assert not torch.equal(a.x_adv, c.x_adv)


@pytest.mark.parametrize("norm,eps", [("linf", 0.08), ("l2", 0.5)])
def test_batch_order_and_size_do_not_matter(norm: str, eps: float, tiny_model, batch) -> None:
    """A sample's result follows its id: reversed batch order and single-sample batches agree.

    The model's own logits differ by ~1e-6 between batch sizes (other conv kernels), which
    30 iterations grow to ~1e-4, hence the looser tolerance for single-sample batches."""
    x, y = batch
    x, y = x[:40], y[:40]
    ids = torch.arange(100, 140)
    whole, _ = attack(tiny_model, x, y, eps, norm=norm, sample_id=ids, n_iter=30, loss="dlr")
    rev, _ = attack(tiny_model, x.flip(0), y.flip(0), eps, norm=norm, sample_id=ids.flip(0), n_iter=30, loss="dlr")
    assert torch.allclose(whole.x_adv, rev.x_adv.flip(0), atol=1e-5)
    assert torch.equal(whole.first_success, rev.first_success.flip(0))
    for i in (0, 7, 23):
        one, _ = attack(tiny_model, x[i:i + 1], y[i:i + 1], eps, norm=norm, sample_id=ids[i:i + 1], n_iter=30, loss="dlr")
        assert torch.allclose(one.x_adv[0], whole.x_adv[i], atol=1e-3)
        assert int(one.first_success[0]) == int(whole.first_success[i])


def test_more_restarts_break_more(tiny_model, batch) -> None:
    x, y = batch
    one, _ = attack(tiny_model, x, y, 0.07, n_iter=10)
    three, _ = attack(tiny_model, x, y, 0.07, n_iter=10, n_restarts=3)
    assert bool((three.success >= one.success).all())
    assert torch.equal(three.first_success[one.success], one.first_success[one.success])


def test_bad_settings_are_user_errors(tiny_model, batch) -> None:
    x, y = batch
    for kw in ({"n_iter": 0}, {"loss": "hinge"}, {"n_restarts": 0}, {"rho": 1.5}):
        with pytest.raises(AdvbenchError):
            APGD(**kw)
    with pytest.raises(AdvbenchError, match="n_target_classes"):
        attack(tiny_model, x, y, 0.1, n_target_classes=10)
