"""`advbench uap table2`: the seed's Table 2 from its published data layout."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from advbench.cli.main import main

PUBLISHED = Path(__file__).parent / "data" / "seed_stability"


def test_table2_reproduces_the_published_scores(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["uap", "table2", str(PUBLISHED), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "table2.csv")
    stored = table[table["source"] == "stored areas"].set_index("metric")["stability"]
    published = {"paq2piq": -5.31, "linearity": -4.18, "vsfa": -3.80, "mdtvsfa": -4.83,
                 "koncept": -0.31, "spaq": 2.55, "nima": -0.12}
    for metric, score in published.items():
        assert abs(stored[metric] - score) <= 0.01, (metric, stored[metric])
    recomputed = table[table["source"] == "recomputed"].sort_values("stability")["metric"].tolist()
    assert recomputed == sorted(published, key=published.get)
    assert (tmp_path / "gain_vs_loss_stored_areas.png").stat().st_size > 0


def test_table2_on_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["uap", "table2", str(tmp_path / "nowhere"), "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1 and "nowhere" in result.output
