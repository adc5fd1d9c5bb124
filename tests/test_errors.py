"""Every bad value, path or file a user can hand advbench ends in one `Error: ...` line.

One table: each row sets up what a user would have (a folder of records, a broken file, a
read-only or full disk) and gives the command line; the command must exit non-zero with
exactly one non-empty output line holding the expected fragments, and no traceback.
Rows that name paths also check that nothing was written outside the output folder.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from advbench.cli.main import main
from advbench.core.errors import AdvbenchError

SMOKE = ["run", "experiment=smoke", "attack=fgsm", "defense.recipe.epochs=1"]  # the model `cache` holds


@dataclass
class Env:
    """What a row may use: its scratch folder, a real benchmark part, monkeypatch."""

    tmp: Path
    part: Path
    monkeypatch: pytest.MonkeyPatch

    @property
    def out(self) -> str:
        return f"out_dir={self.tmp / 'out'}"


@dataclass(frozen=True)
class Row:
    id: str
    argv: Callable[[Env], list[str]]
    expected: tuple[str, ...]
    absent: tuple[str, ...] = ()
    outside: tuple[str, ...] = field(default=())  # globs under tmp that must stay empty


# ---- fixtures ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache with a trained digits model, so run rows never train (and print) first."""
    from advbench.cli.config import compose_config
    from advbench.cli.spec_builder import train_main

    root = tmp_path_factory.mktemp("errors-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADVBENCH_CACHE", str(root))
        train_main(compose_config("train", ["defense=natural", "defense.recipe.epochs=1", "threads=1"]))
    yield root


@pytest.fixture(scope="module")
def real_part(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A benchmark part exactly as `advbench run` writes it today."""
    out = tmp_path_factory.mktemp("errors-real")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADVBENCH_CACHE", str(cache))
        result = CliRunner().invoke(main, [*SMOKE, "dataset.n_samples=16", "search.enabled=false", f"out_dir={out}"])
    assert result.exit_code == 0, result.output
    (part,) = (out / "records").glob("*.parquet")
    return part


@pytest.fixture
def env(tmp_path: Path, real_part: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    monkeypatch.setenv("ADVBENCH_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    return Env(tmp_path, real_part, monkeypatch)


# ---- what rows set up ----------------------------------------------------------------------

def records_folder(env: Env, *extra: tuple[str, pd.DataFrame]) -> Path:
    """A records folder with the real part plus `extra` (name, frame) parts."""
    folder = env.tmp / "records"
    folder.mkdir(exist_ok=True)
    shutil.copy(env.part, folder / env.part.name)
    for name, frame in extra:
        frame.to_parquet(folder / name)
    return folder


def real_frame(env: Env) -> pd.DataFrame:
    return pd.read_parquet(env.part)


def rd_frame() -> pd.DataFrame:
    return pd.DataFrame({"metric": "niqe", "video": "v", "amplitude": [0.0, 0.1], "target_bitrate_kbps": 200.0,
                         "real_bitrate_kbps": 210.0, "metric_score": [5.0, 4.0], "psnr": [40.0, 30.0]})


def uap_frames() -> dict[str, pd.DataFrame]:
    train = pd.DataFrame({"metric": "niqe", "seed": 0, "n_train": 8, "epochs": 1, "amplitude": [0.1, 0.1],
                          "image": [0, 1], "score_clean": 5.0, "score_attacked": 4.0, "gain": [1.0, 1.2]})
    table1 = pd.DataFrame({"metric": "niqe", "uap": "u.pt", "attack": "UAP", "amplitude": [0.1], "image": [0],
                           "score_clean": 5.0, "score_attacked": 4.0, "gain": [1.0], "attack_seconds": 0.1})
    return {"photos-seed0-n8-ep1.parquet": train, "table1_u.parquet": table1}


def string_budget(env: Env) -> list[str]:
    frame = real_frame(env).assign(eps_budget=lambda f: f["eps_budget"].astype(str))
    path = env.tmp / "text_budget.parquet"
    frame.to_parquet(path)
    return ["plot", str(path), "--out", str(env.tmp / "figs")]


def foreign_beside_real(env: Env) -> list[str]:
    folder = records_folder(env, ("foreign.parquet", pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})))
    return ["plot", str(folder), "--out", str(env.tmp / "figs")]


def older_schema(env: Env) -> list[str]:
    old = real_frame(env).drop(columns=["knowledge", "strength_budget"]).assign(attack="bim")
    folder = records_folder(env, ("old.parquet", old))
    return ["plot", str(folder), "--out", str(env.tmp / "figs")]


def before_min_eps_fix(env: Env) -> list[str]:
    """A part written before min_eps became the smallest verified probe (no adv_norm, min_eps_source)."""
    old = real_frame(env).drop(columns=["adv_norm", "min_eps_source"]).assign(attack="bim")
    folder = records_folder(env, ("prefix.parquet", old))
    return ["plot", str(folder), "--out", str(env.tmp / "figs")]


def whole_output_folder(env: Env) -> list[str]:
    """`advbench-out` as the tools leave it: benchmark records, RD records, UAP records."""
    root = env.tmp / "advbench-out"
    (root / "records").mkdir(parents=True)
    shutil.copy(env.part, root / "records" / env.part.name)
    (root / "stability" / "niqe").mkdir(parents=True)
    rd_frame().to_parquet(root / "stability" / "niqe" / "rd.parquet")
    uap_folder(env, root)
    return ["plot", str(root), "--out", str(env.tmp / "figs")]


def uap_folder(env: Env, root: Path | None = None) -> Path:
    folder = (root or env.tmp / "advbench-out") / "uap" / "niqe"
    folder.mkdir(parents=True, exist_ok=True)
    for name, frame in uap_frames().items():
        frame.to_parquet(folder / name)
    return folder.parent


def plot_uap(env: Env) -> list[str]:
    return ["plot", str(uap_folder(env)), "--out", str(env.tmp / "figs")]


def pickled_model(env: Env) -> list[str]:
    path = env.tmp / "whole_model.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    return [*SMOKE, f"checkpoint={path}", env.out]


def pickled_metric_weights(env: Env) -> list[str]:
    path = env.tmp / "nima_model.pth"
    torch.save({"state_dict": {}, "hook": torch.nn.Identity()}, path)
    uap_file = env.tmp / "uap.pt"
    torch.save({"uap": torch.full((3, 8, 8), 0.05), "meta": "{}"}, uap_file)
    return ["uap", "eval", "metric=nima", f"metric.weights={path}", f"perturbation={uap_file}", "methods=[uap]",
            env.out, "device=cpu"]


def empty_uap(env: Env) -> list[str]:
    path = env.tmp / "empty_uap.pt"
    torch.save({"uap": torch.zeros(3, 0, 0), "meta": "{}"}, path)
    return ["uap", "stability", "metric=niqe_fitted", f"perturbation={path}", env.out, "progress=false"]


def stability(*overrides: str) -> Callable[[Env], list[str]]:
    def argv(env: Env) -> list[str]:
        path = env.tmp / "uap.pt"
        torch.save({"uap": torch.full((3, 8, 8), 0.05), "meta": "{}"}, path)
        return ["uap", "stability", "metric=niqe_fitted", f"perturbation={path}", env.out, "progress=false",
                "synthetic.n=1", "synthetic.size=[32,32]", "synthetic.frames=2", "bitrates_kbps=[500]",
                "device=cpu", *overrides]
    return argv


def read_only_out(env: Env) -> list[str]:
    """out_dir is a folder nobody may write to (root ignores mode bits, so refuse as the kernel would)."""
    folder = env.tmp / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:
        refuse_writes_under(folder, env.monkeypatch)
    return [*SMOKE, f"out_dir={folder}"]


def refuse_writes_under(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open, real_mkdir = os.open, os.mkdir
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def inside(path: object) -> bool:
        return Path(os.path.abspath(os.fsdecode(path))).is_relative_to(folder)  # type: ignore[arg-type]

    def denied(path: object) -> PermissionError:
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))  # type: ignore[arg-type]

    def open_(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if flags & writes and inside(path):
            raise denied(path)
        return real_open(path, flags, *args, **kwargs)

    def mkdir(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if inside(path) and not os.path.exists(path):
            raise denied(path)
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)


def full_disk(env: Env) -> list[str]:
    """Parquet writes fail as pyarrow fails on a full disk (OSError with the kernel's ENOSPC)."""
    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    env.monkeypatch.setattr(pq, "write_table", no_space)
    return [*SMOKE, env.out]


def searchpath_config(env: Env) -> list[str]:
    folder = env.tmp / "my-conf" / "attack"
    folder.mkdir(parents=True)
    (folder / "evil.yaml").write_text("name: ../../../x\nparams:\n  _target_: advbench.robustness.attacks.gradient.FGSM\n")
    return ["run", "experiment=smoke", f"hydra.searchpath=[file://{folder.parent}]", "attack=evil",
            f"out_dir={env.tmp / 'a' / 'b'}"]


def extra_group(env: Env, choice: str) -> list[str]:
    """A config group of the user's own (`hydra.searchpath`) that no defaults list names."""
    folder = env.tmp / "my-groups" / "extra"
    folder.mkdir(parents=True)
    (folder / "opt.yaml").write_text("value: 1\n")
    return [f"hydra.searchpath=[file://{folder.parent}]", choice]


def run(*overrides: str) -> Callable[[Env], list[str]]:
    return lambda env: [*SMOKE, env.out, *overrides]


ROWS = [
    # section 4: bad values
    Row("eps-text", run("threat.eps=abc"), ("threat.eps", "'abc'")),
    Row("eps-huge", run("threat.eps=1e308"), ("threat.eps", "1e+308")),
    Row("batch-0", run("batch_size=0"), ("batch_size", "got 0")),
    Row("chunk-0", run("chunk_size=0"), ("chunk_size", "got 0")),
    Row("chunk-neg", run("chunk_size=-5"), ("chunk_size", "got -5")),
    Row("shards-0", run("shard.count=0"), ("shard.count", "got 0")),
    Row("shard-past-count", run("shard.index=5", "shard.count=2"), ("shard.index", "below shard.count")),
    Row("seed-text", run("seed=abc"), ("seed", "'abc'")),
    Row("n-samples-text", run("dataset.n_samples=abc"), ("dataset.n_samples", "'abc'")),
    Row("steps-neg", run("attack=bim", "attack.params.steps=-1"), ("attack.params", "steps must be a whole number >= 1", "-1")),
    Row("max-factor-nan", run("search.max_factor=nan"), ("search.max_factor", "nan")),
    Row("fraction-text", run("dataset.test_fraction=abc"), ("dataset.test_fraction must be a number", "'abc'")),
    Row("steps-text", run("attack=bim", "attack.params.steps=abc"), ("attack.params.steps must be a whole number",)),
    Row("norm-unknown", run("threat.norm=l3"), ("unknown threat.norm 'l3'", "linf, l2")),
    Row("group-not-in-defaults", lambda env: [*run()(env), *extra_group(env, "extra=opt")], ("add it with +extra=opt",)),
    Row("amplitudes-empty", stability("amplitudes=[]"), ("amplitudes", "non-empty")),
    Row("amplitudes-text", stability("amplitudes=[abc]"), ("amplitudes", "'abc'")),
    Row("uap-empty-shape", empty_uap, ("empty_uap.pt", "(3, 0, 0)")),
    Row("read-only-out", read_only_out, ("read-only", "Permission denied")),
    Row("full-disk", full_disk, ("No space left on device",)),
    Row("plot-text-budget", string_budget, ("eps_budget", "text_budget.parquet", "expected numbers")),
    Row("plot-foreign-part", foreign_beside_real, ("foreign.parquet", "not an advbench record file")),
    Row("plot-older-schema", older_schema, ("old.parquet", "knowledge", "strength_budget")),
    Row("plot-before-min-eps-fix", before_min_eps_fix, ("prefix.parquet", "adv_norm", "min_eps_source")),
    Row("checkpoint-pickled", pickled_model, ("whole_model.pt", "pickled"), absent=("weights_only",)),
    Row("metric-weights-pickled", pickled_metric_weights, ("nima_model.pth", "pickled", "torch.nn"),
        absent=("weights_only", "can still be loaded")),
    # section 3: paths stay inside the output folder
    Row("attack-name-escapes", run("attack.name=/../../tmp/x"), ("attack.name", "file name"),
        outside=("out/tmp", "out/records/*/**")),
    Row("dataset-name-absolute", lambda env: [*SMOKE, env.out, f"dataset.name={env.tmp / 'x'}"],
        ("dataset.name", "file name"), outside=("x*",)),
    Row("train-dataset-name-up", lambda env: ["train", "defense=natural", "defense.recipe.epochs=1",
                                              f"cache_dir={env.tmp / 'c'}", "dataset.name=../../x"],
        ("dataset.name", "file name"), outside=("x*",)),
    Row("searchpath-name-up", searchpath_config, ("attack.name", "../../../x"), outside=("x*",)),
    Row("substitute-name-up", run("threat=linf_transfer", "substitute=digits_seed1", "substitute.defense.name=../../x"),
        ("substitute.defense.name", "file name"), outside=("x*",)),
    # section 6: misleading errors
    Row("plot-mixed-kinds", whole_output_folder, ("mixes record kinds", "advbench uap ablation"), absent=("NaN",)),
    Row("plot-uap-folder", plot_uap, ("expected benchmark records", "advbench uap ablation"),
        absent=("eps grid", "mixes")),
    Row("typo-key", run("atack=bim"), ("unknown key 'atack'; did you mean attack?",)),
    Row("typo-nested-key", run("attack.paramz.steps=3"), ("unknown key 'attack.paramz'; did you mean attack.params?",)),
    Row("channels", run("model=resnet56"), ("3-channel input", "1 channel")),
    Row("sweep-and-cfg", run("-m", "attack=fgsm,bim", "--cfg", "job"), ("-m and --cfg cannot be combined",)),
    # the trust issue's tracebacks (item 15)
    Row("device-tpu", run("device=tpu"), ("device must be cpu, cuda, cuda:N or auto", "'tpu'")),
    Row("seed-overflow", run("seed=99999999999999999999999"), ("seed must be a whole number in [0, 9223372036854775807]",)),
    Row("train-lr-nan", lambda env: ["train", "defense=natural", "defense.recipe.lr=nan", f"cache_dir={env.tmp / 'c'}"],
        ("defense.recipe.lr must be a number in (0, inf]", "nan")),
    Row("plot-out-onto-a-file", lambda env: (env.tmp / "afile").touch() or ["plot", str(records_folder(env)), "--out",
                                                                             str(env.tmp / "afile")],
        ("--out", "afile", "is a file, not a folder")),
    Row("plot-out-under-proc", lambda env: ["plot", str(records_folder(env)), "--out", "/proc/advbench-figures"],
        ("--out '/proc/advbench-figures' is not a folder advbench can write",)),
    Row("slurm-off-cluster", run("-m", "hydra/launcher=submitit_slurm"), ("submitit_slurm", "no srun here")),
    Row("sweep-with-a-space", run("-m", "attack=fgsm,", "bim"), ("write attack=fgsm,bim (one argument)",)),
    Row("config-name-missing", lambda env: ["run", "-cn", "nonexistent"], ("no primary config 'nonexistent'",
                                                                          "valid: config, train")),
    Row("flag-without-value", run("--cfg"), ("--cfg needs a value (e.g. --cfg job)",)),
    Row("weights-mirror-not-a-url", lambda env: ["weights", "fetch", "nima", "--mirror", "not a url"],
        ("--mirror must be an http:// or https:// URL with a host",)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_one_line_error(row: Row, env: Env) -> None:
    argv = row.argv(env)
    result = CliRunner().invoke(main, argv)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert isinstance(result.exception, SystemExit) and result.exit_code != 0, (result.exception, result.output)
    assert "Traceback" not in result.output
    assert len(lines) == 1, "expected one line, got:\n" + result.output
    assert lines[0].startswith("Error: ")
    for fragment in row.expected:
        assert fragment in lines[0], lines[0]
    for fragment in row.absent:
        assert fragment not in lines[0], lines[0]
    for pattern in row.outside:
        assert not list(env.tmp.glob(pattern)), f"wrote {list(env.tmp.glob(pattern))} outside the output folder"


@pytest.mark.parametrize("name", ["digits", "pgd_at", "resnet-56", "a.b", "cifar10+x", "v=2"])
def test_safe_names_pass(name: str) -> None:
    from advbench.core.names import safe_name

    assert safe_name(name, "dataset.name") == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "/tmp/x", "a/b", "a\\b", ".hidden", "-x", "a b", "x" * 129])
def test_unsafe_names_fail(name: str) -> None:
    from advbench.core.names import safe_name

    with pytest.raises(AdvbenchError, match="dataset.name"):
        safe_name(name, "dataset.name")


def test_valid_folders_still_plot(env: Env) -> None:
    """The checks refuse what is wrong, not what is right: a real part plots, UAP folders ablate."""
    result = CliRunner().invoke(main, ["plot", str(records_folder(env)), "--out", str(env.tmp / "figs")])
    assert result.exit_code == 0, result.output
    assert list((env.tmp / "figs").glob("table3_*.md"))
    result = CliRunner().invoke(main, ["uap", "ablation", str(uap_folder(env)), "--out", str(env.tmp / "a.png")])
    assert result.exit_code == 0, result.output
