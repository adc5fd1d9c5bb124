"""The GPU fast path, exercised on the CPU: bf16 autocast, channels_last, batch_size=auto, and
how many host-device synchronisations an attack iteration costs."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import cell_spec, run_main
from advbench.core.errors import AdvbenchError
from advbench.core.runtime import (
    CPU_AUTO_BATCH,
    ONEDNN_PRIMITIVES,
    as_input,
    batch_size,
    deploy,
    fit_batch,
)
from advbench.robustness.attacks.apgd import APGD
from advbench.robustness.attacks.gradient import BIM, MIM
from advbench.robustness.attacks.oracles import ScoreOracle, WhiteBoxOracle
from advbench.robustness.evaluation.cell import cell_identity, cell_key
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

pytestmark = pytest.mark.usefixtures("one_thread")


def deployed(model: torch.nn.Module, **how) -> torch.nn.Module:
    return deploy(copy.deepcopy(model), **how)


class Spy(TorchDispatchMode):
    """Records the dtype and memory format of every convolution's input and weight, and counts
    the operations that make a CUDA host wait for the device (`nonzero`, `.item()`, `bool(t)`,
    boolean-mask gathers and scatters)."""

    SYNCS = {"aten::nonzero", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::masked_select"}

    def __init__(self) -> None:
        super().__init__()
        self.convs: list[tuple[torch.dtype, bool, bool]] = []
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        masked = name in ("aten::index", "aten::index_put_") and any(
            i is not None and i.dtype == torch.bool for i in args[1])
        self.syncs += name in self.SYNCS or masked
        if name in ("aten::convolution", "aten::conv2d"):
            x, w = args[0], args[1]
            self.convs.append((x.dtype, x.is_contiguous(memory_format=torch.channels_last),
                               w.is_contiguous(memory_format=torch.channels_last)))
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:64], y[:64]


def test_bf16_runs_the_model_in_bf16_and_hands_attacks_float32(tiny_model, batch) -> None:
    x, y = batch
    model = deployed(tiny_model, precision="bf16")
    idx = torch.arange(len(x))
    with Spy() as spy:
        logits, grad = WhiteBoxOracle(model, len(x)).loss_grad(x, y, False, idx)
        scores = ScoreOracle(model, len(x)).logits(x, idx)
    assert spy.convs and all(dtype == torch.bfloat16 for dtype, _, _ in spy.convs), "the convolutions ran in bf16"
    assert logits.dtype == scores.dtype == grad.dtype == torch.float32
    exact, exact_grad = WhiteBoxOracle(tiny_model, len(x)).loss_grad(x, y, False, idx)
    assert not torch.equal(logits, exact), "bf16 rounds differently from fp32"
    assert torch.allclose(logits, exact, atol=0.15, rtol=0.05)
    assert (logits.argmax(1) == exact.argmax(1)).float().mean() > 0.95


def test_channels_last_is_what_the_oracle_uses_and_matches_contiguous(tiny_model, batch) -> None:
    x, y = batch
    model = deployed(tiny_model, channels_last=True)
    threat = ThreatModel(norm="linf", goal="untargeted", eps=0.1)
    search = SearchSettings(max_probes=3)
    with Spy() as spy:
        fast = evaluate_batch(BIM(steps=5), model, as_input(model, x), y, None, threat, search)
    assert spy.convs and all(x_cl and w_cl for _, x_cl, w_cl in spy.convs[1::2]), \
        "every 16-channel convolution saw channels_last input and weights"
    plain = evaluate_batch(BIM(steps=5), tiny_model, x, y, None, threat, search)
    agree = (fast["success_at_budget"] == plain["success_at_budget"]).float().mean()
    assert agree >= 0.97, f"success at the budget agrees on {agree:.0%} of samples"
    both = torch.isfinite(fast["min_eps"]) & torch.isfinite(plain["min_eps"])
    assert torch.allclose(fast["min_eps"][both], plain["min_eps"][both], atol=0.1 * 0.05 * 2)


@pytest.mark.parametrize("attack", [BIM(steps=8), MIM(steps=8), APGD(n_iter=8)], ids=["bim", "mim", "apgd"])
def test_an_iteration_synchronises_once(attack, tiny_model, batch) -> None:
    """At a budget nothing breaks at, every iteration runs: syncs are one per iteration (shrinking
    the active set) plus a fixed few per call (argument checks, APGD's run bookkeeping)."""
    x, y = batch
    counts = []
    for steps in (8, 16):
        attack = type(attack)(**({"n_iter": steps} if isinstance(attack, APGD) else {"steps": steps}))
        with Spy() as spy:
            attack(WhiteBoxOracle(tiny_model, len(x)), x, y, eps=torch.full((len(x),), 1e-6), norm="linf")
        counts.append(spy.syncs)
    assert counts[1] - counts[0] == 8, f"syncs for 8 and 16 iterations: {counts}"
    assert counts[0] <= 8 + 6


def test_the_clean_gradient_memory_synchronises_once_past_the_clean_inputs(tiny_model, batch) -> None:
    """Remembered, fresh and mixed rows: a call waits for the device once where no row is at its
    clean input (every iteration past a start), at most three times where some are, and serves
    what a plain oracle computes."""
    x, y = batch
    oracle, plain = WhiteBoxOracle(tiny_model, len(x)), WhiteBoxOracle(tiny_model, len(x))
    assert oracle.remember_clean(x)
    half_moved, moved = x.clone(), x + 0.01
    half_moved[::2] += 0.01
    everyone = torch.arange(len(x))
    for rows, inputs, most in [(torch.arange(32), x[:32], 3), (everyone, x, 3), (everyone, half_moved, 3),
                               (everyone, moved, 1)]:
        with Spy() as spy:
            logits, grad = oracle.loss_grad(inputs, y[rows], False, rows)
        assert spy.syncs <= most, f"{spy.syncs} syncs"
        want_logits, want_grad = plain.loss_grad(inputs, y[rows], False, rows)
        assert torch.allclose(logits, want_logits, atol=1e-6) and torch.allclose(grad, want_grad, atol=1e-6)
    i = everyone
    assert torch.equal(oracle.grad_reuses, (i < 32).long() + (i % 2 == 1).long()), "remembered rows are served"
    assert torch.equal(oracle.grad_evals, 2 + (i % 2 == 0).long()), "each clean row is evaluated once, moved rows anew"


def test_batch_auto_on_the_cpu_is_the_documented_default(tiny_model, batch) -> None:
    x, _ = batch
    cpu = torch.device("cpu")
    assert batch_size("auto", tiny_model, x[0], 10_000, cpu) == CPU_AUTO_BATCH == 256
    assert batch_size("auto", tiny_model, x[0], 40, cpu) == 40, "never more than the samples to evaluate"
    assert batch_size(17, tiny_model, x[0], 40, cpu) == 17


def test_fit_batch_bisects_on_out_of_memory() -> None:
    tried = []

    def trial(size: int) -> None:
        tried.append(size)
        if size > 700:
            raise torch.OutOfMemoryError("CUDA out of memory")

    use, largest = fit_batch(trial, 5000, start=256, margin=0.8)
    assert tried[:3] == [256, 512, 1024], "doubles from the start"
    assert 700 - 700 // 16 <= largest <= 700 and use == int(largest * 0.8)
    assert fit_batch(lambda size: None, 300, start=256) == (300, 300), "capped by the sample count, no margin needed"
    with pytest.raises(AdvbenchError, match="not even one sample"):
        fit_batch(lambda size: trial(10_000), 5000)


@pytest.mark.parametrize("override, message", [
    ("precision=fp16", "unknown precision 'fp16'; valid: fp32, bf16"),
    ("channels_last=maybe", "channels_last must be true or false, got 'maybe'"),
    ("batch_size=0", "batch_size must be a whole number >= 1 or auto, got 0"),
    ("batch_size=big", "batch_size must be a whole number >= 1 or auto, got 'big'"),
])
def test_bad_values_are_one_line(override, message) -> None:
    with pytest.raises(AdvbenchError) as err:
        compose_config("config", [override])
    assert str(err.value) == message


def test_batch_auto_is_for_run_only() -> None:
    with pytest.raises(AdvbenchError, match="^batch_size=auto applies to advbench run only"):
        compose_config("uap_eval", ["batch_size=auto"])


def test_the_cell_key_changes_with_precision_and_memory_format(tmp_path, trained_digits_cache, monkeypatch) -> None:
    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
    keys = {}
    for how in ([], ["precision=bf16"], ["channels_last=true"], ["precision=bf16", "channels_last=true"]):
        cfg = compose_config("config", ["defense.recipe.epochs=4", *how])
        threat = ThreatModel(norm="linf", goal="untargeted", eps=0.1)
        identity = cell_identity(cell_spec(cfg), threat, BIM())
        keys[" ".join(how)] = cell_key(identity)
        assert ("precision" in identity) == bool(how), "fp32 contiguous leaves the key of older cells as it was"
    assert len(set(keys.values())) == 4, keys


def test_a_bf16_cell_runs_end_to_end_and_records_its_precision(tmp_path, trained_digits_cache, monkeypatch,
                                                                capsys) -> None:
    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
    overrides = ["attack=bim", "attack.params.steps=5", "dataset.n_samples=40", "search.max_probes=2",
                 "defense.recipe.epochs=4", "precision=bf16", "channels_last=true", "batch_size=auto",
                 f"out_dir={tmp_path}"]
    frame = pd.read_parquet(run_main(compose_config("config", overrides)))
    assert len(frame) == 40 and set(frame["precision"]) == {"bf16"} and frame["channels_last"].all()
    assert "batch_size=auto -> 40 on cpu" in capsys.readouterr().err
    assert (frame["adv_pred"] == frame["label"]).mean() < frame["clean_correct"].mean()


@pytest.mark.parametrize("user_value", [None, "64"])
def test_the_onednn_primitive_cache_is_enlarged_unless_the_user_sized_it(user_value: str | None) -> None:
    """oneDNN reads the capacity when it builds its first primitive: importing the runtime sets it
    (to hold the primitives of the hundreds of batch sizes an early-stopping attack calls the
    model at), and a user's own setting wins."""
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    if user_value is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = user_value
    probe = "import os, advbench.core.runtime; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == (user_value or str(ONEDNN_PRIMITIVES))
