"""Benchmark records built by hand, in the engine's schema, for the report's tests."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

INF = np.inf


def cell(attack: str, min_eps: list[float], *, knowledge: str = "white", budget: float = 0.2, strength: int = 20,
         clean: list[bool] | None = None, source: str = "search", defense: str = "natural",
         grad_mode: str = "exact", judge_draws: int = 1, goal: str = "untargeted", **flags: bool) -> pd.DataFrame:
    """One cell's records in the engine's schema: success at the budget is min_eps <= budget (untargeted, a
    clean-misclassified sample too, at min_eps 0; targeted, reaching target 1 whatever the clean answer)."""
    eps = np.asarray(min_eps, dtype=np.float64)
    n = eps.size
    correct = np.ones(n, bool) if clean is None else np.asarray(clean, bool)
    untargeted = goal == "untargeted"
    key = hashlib.sha256(f"{attack}{knowledge}{budget}{strength}{defense}{goal}".encode()).hexdigest()[:12]
    frame = pd.DataFrame({
        "sample_id": np.arange(n) + 100, "label": 0, "target": -1 if untargeted else 1, "clean_correct": correct,
        "success_at_budget": (eps <= budget) | (~correct & untargeted),
        "min_eps": np.where(correct | ~untargeted, eps, 0.0),
        "min_eps_lo": np.nan, "min_eps_source": source, "eps_budget": budget, "strength_budget": strength,
        "first_success_strength": -1, "adv_norm": np.nan, "adv_pred": 1, "grad_evals": strength, "queries": 1,
        "seconds": 0.01, "dataset": "digits", "model": "small_cnn", "defense": defense, "model_label": defense,
        "weights": '{"cache_key": "abc"}', "attack": attack, "attack_params": '{"steps": %d}' % strength,
        "norm": "linf", "goal": goal, "knowledge": knowledge, "seed": 0, "cell_key": key, "shard_group": key,
        "grad_mode": grad_mode if knowledge == "white" else "none", "judge_draws": judge_draws,
        "advbench_version": "0.1.0", "torch_version": "2.x", "device": "cpu", "model_sha256": "f" * 64,
        "created_at": pd.Timestamp("2026-01-01", tz="UTC")})
    for flag in ("flag_zero_grad", "flag_randomized", "flag_probabilities", "flag_dynamic"):
        frame[flag] = bool(flags.get(flag, False))
    return frame


def records(*cells: pd.DataFrame) -> pd.DataFrame:
    return pd.concat(cells, ignore_index=True)
