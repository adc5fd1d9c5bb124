"""Record file names end in the cell key: these cells keep theirs, so finished records stay found.

The names were computed before the config became specs at the command line's boundary; a
change that moves one of them re-runs every finished cell of its kind (or, worse, reuses
records under a key that no longer says what they hold). Each case builds the identity only:
nothing is trained or attacked. A Python model's key holds its target as typed and its
file's sha256, so the file is written with fixed bytes, found by a relative path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import cell_spec
from advbench.robustness.evaluation.cell import build_threat, cell_identity, part_path

NET = """from torch import nn


def Net(num_classes=10, in_channels=1):
    return nn.Sequential(nn.Flatten(), nn.Linear(64 * in_channels, num_classes))
"""

CELLS = [
    (["experiment=smoke"],
     "digits_natural_bim_linf_untargeted_s0_b5a00a37b9d6.parquet"),
    (["attack=pgd", "threat=l2_targeted"],
     "digits_natural_pgd_l2_targeted_s0_6bb189394731.parquet"),
    (["threat=linf_transfer", "substitute=digits_seed1"],
     "digits_natural_bim_linf_untargeted_s0_437afd12d076.parquet"),
    (["threat=l2_transfer", "substitute=digits_wide", "attack=mim"],
     "digits_natural_mim_l2_untargeted_s0_432ef9d43896.parquet"),
    (["attack=square", "threat=linf_score"],
     "digits_natural_square_linf_untargeted_s0_f8dd335ce7a6.parquet"),
    (["attack=nes", "threat=l2_score_targeted"],
     "digits_natural_nes_l2_targeted_s0_86bea06e8c0b.parquet"),
    (["attack=hsj", "threat=l2_decision"],
     "digits_natural_hsj_l2_untargeted_s0_42ad5af4b2d9.parquet"),
    (["defense=jpeg"],
     "digits_jpeg_bim_linf_untargeted_s0_7aa8712a2b2a.parquet"),
    (["defense=bit_red", "attack=fgsm"],
     "digits_bit_red_fgsm_linf_untargeted_s0_c472e54a4c64.parquet"),
    (["defense=rp"],
     "digits_rp_bim_linf_untargeted_s0_698ff9bdd7a0.parquet"),
    (["defense=rse"],
     "digits_rse_bim_linf_untargeted_s0_f079397919a7.parquet"),
    (["defense=pgd_at", "attack=apgd_ce"],
     "digits_pgd_at_apgd_ce_linf_untargeted_s0_06a74e99f25b.parquet"),
    (["defense=ens_at"],
     "digits_ens_at_bim_linf_untargeted_s0_324890c64fb9.parquet"),
    (["checkpoint=ck.pt"],
     "digits_natural_bim_linf_untargeted_s0_3cd5b1c4e4a9.parquet"),
    (["model=python", "model.target=net.py:Net"],
     "digits_natural_bim_linf_untargeted_s0_04d41859b0b9.parquet"),
    (["model=python", "model.target=net.py:Net", "defense=jpeg"],
     "digits_jpeg_bim_linf_untargeted_s0_a8cf59bde8a1.parquet"),
    (["attack=apgd_ensemble"],
     "digits_natural_apgd_ensemble_linf_untargeted_s0_b2456cc360dc.parquet"),
    (["attack=deepfool", "threat=l2"],
     "digits_natural_deepfool_l2_untargeted_s0_d9c26cbf1648.parquet"),
    (["defense=rse", "attack=autoattack", "attack.version=rand"],
     "digits_rse_autoattack_linf_untargeted_s0_779442dc72b6.parquet"),
    (["defense=rse", "attack=autoattack", "attack.version=rand", "attack.judge=original"],
     "digits_rse_autoattack_linf_untargeted_s0_bf0c322eb05b.parquet"),
    (["attack=autoattack", "attack.version=custom", "attack.members=[apgd_dlr,fab]"],
     "digits_natural_autoattack_linf_untargeted_s0_a1f89c08958b.parquet"),
    (["shard.index=1", "shard.count=3", "search.enabled=false"],
     "digits_natural_bim_linf_untargeted_s0_shard1of3_9f6a82fe1ac0.parquet"),
]


@pytest.mark.parametrize(("overrides", "name"), CELLS, ids=[" ".join(o) for o, _ in CELLS])
def test_a_cell_keeps_its_record_file_name(overrides: list[str], name: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(NET)
    (tmp_path / "ck.pt").write_bytes(b"fixed weights")
    cfg = compose_config("config", [*overrides, f"cache_dir={tmp_path / 'cache'}"])
    spec = cell_spec(cfg)
    threat = build_threat(spec, dict(instantiate(cfg.dataset).budgets))
    identity = cell_identity(spec, threat, spec.attack.attack)
    assert part_path(Path("records"), identity).name == name
