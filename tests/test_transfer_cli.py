"""Transfer evaluations as a user runs them: substitute configs, cell keys, presets, the CLI."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from advbench.cli.config import compose_config
from advbench.cli.option_targets import construct
from advbench.cli.spec_builder import cell_spec
from advbench.core.catalog import conf_dir
from advbench.core.errors import AdvbenchError
from advbench.robustness.evaluation.cell import build_threat, cell_identity

ADVBENCH = [sys.executable, "-m", "advbench"]
FAST = ["dataset.n_samples=40", "search.max_probes=3", "threads=1", "defense.recipe.epochs=2",
        "substitute.defense.recipe.epochs=2"]


def run_cli(*args: str, cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ADVBENCH_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.run([*ADVBENCH, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def identity(overrides: list[str]) -> dict:
    cfg = compose_config("config", overrides)
    threat = build_threat(cell_spec(cfg), {"linf": 0.2, "l2": 0.8})
    return cell_identity(cell_spec(cfg), threat, instantiate(cfg.attack.params))


@pytest.mark.slow
def test_transfer_run_end_to_end_via_the_cli(tmp_path: Path) -> None:
    """Target and substitute are trained on first use; records are the target's verdicts."""
    cache = tmp_path / "cache"
    proc = run_cli("run", "attack=dim", "threat=linf_transfer", "substitute=digits_seed1", *FAST, cache=cache, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    parts = list((tmp_path / "advbench-out/records").glob("*.parquet"))
    assert len(parts) == 1
    frame = pd.read_parquet(parts[0])
    assert len(frame) == 40 and set(frame["knowledge"]) == {"transfer"}
    assert (frame["strength_budget"] == 10).all(), "the seed's 10 iterations under a transfer threat"
    assert (frame["queries"] >= 1).all() and (frame["grad_evals"] - frame["search_grad_evals"] <= 10).all()
    robust = (frame["adv_pred"] == frame["label"]).mean()
    assert robust < frame["clean_correct"].mean(), "the transfer attack must lower the target's accuracy"
    assert len(list((cache / "checkpoints/digits/small_cnn").glob("natural-*.pt"))) == 2, "target and seed-1 substitute"


def test_transfer_cell_in_process_then_skipped_when_done(tmp_path: Path, trained_digits_cache: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from advbench.cli.spec_builder import run_main

    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
    overrides = ["attack=bim", "threat=l2_transfer_targeted", "substitute=digits_seed1", "dataset.n_samples=32",
                 "search.max_probes=2", "defense.recipe.epochs=4", "substitute.defense.recipe.epochs=2",
                 f"out_dir={tmp_path}"]
    out = run_main(compose_config("config", overrides))
    frame = pd.read_parquet(out)
    assert set(frame["knowledge"]) == {"transfer"} and set(frame["goal"]) == {"targeted"}
    hit = frame["success_at_budget"]
    assert (frame.loc[hit, "adv_pred"] == frame.loc[hit, "target"]).all()
    assert (frame["queries"] > 0).all()
    assert run_main(compose_config("config", overrides)) == out, "a finished cell is found again by its key"


def test_transfer_without_a_substitute_is_an_error(tmp_path: Path) -> None:
    from advbench.cli.spec_builder import run_main

    with pytest.raises(AdvbenchError, match="needs a substitute model; set substitute=.*digits_seed1"):
        run_main(compose_config("config", ["threat=linf_transfer", f"out_dir={tmp_path}"]))


def test_missing_substitute_checkpoint_is_an_error_about_the_substitute(tmp_path: Path) -> None:
    from advbench.cli.spec_builder import run_main

    cfg = compose_config("config", ["threat=linf_transfer", "substitute=digits_seed1",
                                    f"substitute.checkpoint={tmp_path}/nope.pt", f"out_dir={tmp_path}"])
    with pytest.raises(AdvbenchError, match="^substitute: checkpoint .*nope.pt' not found"):
        run_main(cfg)


def test_a_sweep_skips_cells_the_attack_does_not_support(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    from advbench.cli import spec_builder

    cfg = compose_config("config", ["attack=cw", "threat=linf", f"out_dir={tmp_path}"])
    with pytest.raises(AdvbenchError, match="supports norms l2"):
        spec_builder.run_main(cfg)
    monkeypatch.setattr(spec_builder, "in_sweep", lambda: True)
    assert spec_builder.run_main(cfg) is None
    assert "skip digits/natural/cw linf" in capsys.readouterr().err
    assert not (tmp_path / "records").exists()


def test_substitute_is_part_of_the_cell_key_of_transfer_cells_only(tmp_path: Path) -> None:
    base = ["attack=bim", f"cache_dir={tmp_path}"]
    seed1 = identity([*base, "threat=linf_transfer", "substitute=digits_seed1"])
    wide = identity([*base, "threat=linf_transfer", "substitute=digits_wide"])
    assert seed1["substitute"] != wide["substitute"] and seed1 != wide
    assert seed1["substitute"]["weights"] != identity([*base, "threat=linf_transfer", "substitute=digits_seed1",
                                                        "substitute.seed=2"])["substitute"]["weights"]
    ckpt = tmp_path / "sub.pt"
    ckpt.write_bytes(b"one")
    first = identity([*base, "threat=linf_transfer", "substitute=digits_seed1", f"substitute.checkpoint={ckpt}"])
    ckpt.write_bytes(b"two")
    second = identity([*base, "threat=linf_transfer", "substitute=digits_seed1", f"substitute.checkpoint={ckpt}"])
    assert first["substitute"]["weights"] != second["substitute"]["weights"], "the checkpoint's bytes are in the key"
    assert identity([*base, "substitute=digits_seed1"]) == identity(base), "white-box cells ignore the substitute"


def test_a_substitute_that_is_the_target_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AdvbenchError, match="is the target itself"):
        identity(["threat=linf_transfer", "substitute=digits_seed1", "substitute.seed=0", f"cache_dir={tmp_path}"])
    ckpt = tmp_path / "same.pt"
    ckpt.write_bytes(b"weights")
    with pytest.raises(AdvbenchError, match="is the target itself"):
        identity(["threat=linf_transfer", "substitute=digits_seed1", f"checkpoint={ckpt}",
                  f"substitute.checkpoint={ckpt}", f"cache_dir={tmp_path}"])


def test_the_seed_cifar10_pairing() -> None:
    common = ["experiment=seed_cifar10", "model=wrn34_10"]
    assert cell_spec(compose_config("config", [*common, "defense=pgd_at"])).substitute.defense.name == "trades"
    assert cell_spec(compose_config("config", [*common, "defense=natural"])).substitute.defense.name == "trades"
    assert cell_spec(compose_config("config", [*common, "defense=trades"])).substitute.defense.name == "pgd_at"
    imagenet = cell_spec(compose_config("config", ["experiment=seed_imagenet"])).substitute
    assert imagenet.model.name == "resnet152" and imagenet.defense.name == "natural"


SEED_CELLS = {
    *((k, a, n, g) for k in ("white", "transfer") for a in ("fgsm", "bim", "mim") for n in ("linf", "l2")
      for g in ("untargeted", "targeted")),
    *(("white", "deepfool", n, "untargeted") for n in ("linf", "l2")),
    *(("white", "cw", "l2", g) for g in ("untargeted", "targeted")),
    *(("transfer", "dim", n, g) for n in ("linf", "l2") for g in ("untargeted", "targeted")),
}


@pytest.mark.parametrize("preset", ["seed_cifar10", "seed_imagenet"])
def test_seed_presets_sweep_the_seed_attack_list(preset: str) -> None:
    """Every supported cell of the preset's sweep: the seed's Table 2 rows, plus white-box extras only."""
    sweep = OmegaConf.load(conf_dir() / "experiment" / f"{preset}.yaml").hydra.sweeper.params
    cells = set()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for row in str(sweep["+experiment/seed_row"]).split(","):
            cfg = compose("config", overrides=[f"experiment={preset}", f"+experiment/seed_row={row}"])
            attack = construct(OmegaConf.to_container(cfg.attack.params, resolve=True))
            knowledge = cfg.threat.knowledge
            assert knowledge == "white" or cfg.attack.params.get("steps", 10) == 10, "the seed's 10 transfer iterations"
            for norm, goal in itertools.product(str(sweep["threat.norm"]).split(","), str(sweep["threat.goal"]).split(",")):
                if attack.unsupported(norm, knowledge, goal) is None:
                    cells.add((knowledge, cfg.attack.name, norm, goal))
    assert SEED_CELLS <= cells
    assert all(c[0] == "white" and c[1] != "dim" for c in cells - SEED_CELLS), cells - SEED_CELLS


def test_unknown_substitute_lists_the_options() -> None:
    with pytest.raises(AdvbenchError, match="unknown substitute 'nope'.*digits_seed1"):
        compose_config("config", ["substitute=nope"])


def test_transfer_oracle_needs_bounds_like_the_target() -> None:
    from advbench.robustness.attacks.oracles import TransferOracle

    target, sub = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    sub.bounds = (-1.0, 1.0)
    with pytest.raises(AdvbenchError, match="bounds"):
        TransferOracle(target, 3, substitute=sub)
