"""Input-transformation defenses: the transforms themselves, their BPDA/EOT gradients at the
oracle boundary, cell keys, metadata, and a wrapped cell run end to end."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from PIL import Image

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import cell_spec, defense_spec, run_main, target_spec
from advbench.core.catalog import describe, group_options
from advbench.core.errors import AdvbenchError
from advbench.core.records import read_records
from advbench.robustness.attacks.oracles import build_oracle
from advbench.robustness.attacks.transfer import diverse_inputs
from advbench.robustness.defenses.wrappers import (
    JPEG,
    BitDepth,
    RandomResizePad,
    jpeg_roundtrip,
    row_keys,
    wrap,
    wrapper_spec,
)
from advbench.robustness.evaluation import cell
from advbench.robustness.specs import SearchSettings

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def x(digits_tensors) -> torch.Tensor:
    return digits_tensors[2][:16]


def test_jpeg_is_the_codecs_round_trip(x) -> None:
    """Each image equals PIL's libjpeg encode/decode at the same quality, and differs from the input."""
    out = jpeg_roundtrip(x, 30)
    for i in range(len(x)):
        img = Image.fromarray((x[i, 0] * 255).round().to(torch.uint8).numpy())  # uint8 2-D: grey
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=30)
        ref = torch.from_numpy(np.asarray(Image.open(io.BytesIO(buf.getvalue())), dtype=np.float32)) / 255
        assert (out[i, 0] - ref).abs().max() <= 1 / 255 + 1e-6, f"image {i} differs from PIL's codec"
    assert (out - x).abs().max() > 0.05, "JPEG at quality 30 must change digits"
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1


def test_jpeg_of_colour_images_keeps_shape_and_bounds() -> None:
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    out = jpeg_roundtrip(x, 75)
    assert out.shape == x.shape and 0 <= out.min() and out.max() <= 1 and (out != x).any()


def test_bit_depth_rounds_to_evenly_spaced_levels() -> None:
    x = torch.tensor([0.0, 0.1, 0.2, 0.49, 0.51, 0.66, 0.7, 1.0]).view(1, 1, 1, 8)
    model = BitDepth(torch.nn.Flatten(), bits=2)        # levels 0, 1/3, 2/3, 1
    assert torch.equal(model(x), torch.tensor([[0.0, 0.0, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 2 / 3, 1.0]]))
    assert torch.equal(BitDepth(torch.nn.Flatten(), bits=1)(x), (x > 0.5).float().flatten(1))


def test_random_resize_pad_draws_per_sample_not_per_batch_position(x) -> None:
    """A row's draw depends on its values and the pass, not on its companions or position."""
    a = RandomResizePad(torch.nn.Identity(), rate=0.5, seed=3)
    b = RandomResizePad(torch.nn.Identity(), rate=0.5, seed=3)
    whole = a(x)
    alone = b(x[5:6].clone())
    assert torch.equal(whole[5:6], alone)
    again = a(x)                                        # the next pass draws anew
    assert not torch.equal(whole, again)
    assert torch.equal(whole, diverse_inputs(x, prob=1.0, resize_rate=0.5, seed=3, sample_id=row_keys(x), stream=0))


def test_bpda_gradient_is_the_base_gradient_at_the_transformed_input(tiny_model, digits_tensors, x) -> None:
    y = digits_tensors[3][:16]
    wrapped = wrap(tiny_model, wrapper_spec({"type": "bit_depth", "bits": 1}), seed=0)
    oracle = build_oracle("white", wrapped, len(x))
    assert oracle.grad_mode == "bpda"
    _, grad = oracle.loss_grad(x, y, False, torch.arange(len(x)))
    t = (x > 0.5).float()
    _, base_grad = build_oracle("white", tiny_model, len(x)).loss_grad(t, y, False, torch.arange(len(x)))
    assert grad.abs().sum() > 0
    torch.testing.assert_close(grad, base_grad)
    plain = x.clone().requires_grad_(True)             # without BPDA the rounding has no gradient
    torch.nn.functional.cross_entropy(tiny_model(torch.round(plain)), y).backward()
    assert plain.grad.abs().sum() == 0


def test_eot_averages_n_passes_and_counts_each(tiny_model, digits_tensors, x) -> None:
    y = digits_tensors[3][:16]
    idx = torch.arange(len(x))
    model = wrap(tiny_model, wrapper_spec({"type": "random_resize_pad", "rate": 0.5, "eot_samples": 4}), seed=1)
    oracle = build_oracle("white", model, len(x))
    assert oracle.grad_mode == "eot"
    _, grad = oracle.loss_grad(x, y, False, idx)
    assert oracle.grad_evals.tolist() == [4] * len(x)
    replay = wrap(tiny_model, wrapper_spec({"type": "random_resize_pad", "rate": 0.5, "eot_samples": 1}), seed=1)
    single = build_oracle("white", replay, len(x))
    grads = [single.loss_grad(x, y, False, idx)[1] for _ in range(4)]
    torch.testing.assert_close(grad, torch.stack(grads).mean(0))
    assert not torch.equal(grads[0], grads[1]), "each pass is a fresh draw"


def test_a_randomized_cell_repeats_exactly_and_judges_the_deployed_model(tiny_model, digits_tensors) -> None:
    """Two runs of an R&P batch with fresh wrappers give the same records (EOT gradients, one
    random pass to judge), and the records say the gradients were EOT means."""
    from advbench.robustness.attacks.gradient import BIM
    from advbench.robustness.threat import ThreatModel

    x, y = digits_tensors[2][:24], digits_tensors[3][:24]
    threat = ThreatModel(norm="linf", goal="untargeted", knowledge="white", eps=0.2)

    def once() -> dict:
        model = wrap(tiny_model, wrapper_spec({"type": "random_resize_pad", "rate": 0.5, "eot_samples": 2}), seed=0)
        return cell.evaluate_batch(BIM(steps=3), model, x, y, None, threat, SearchSettings(enabled=False))

    a, b = once(), once()
    assert a["grad_mode"] == "eot"
    assert (a["grad_evals"] % 2 == 0).all() and a["grad_evals"].max() == 6, "two passes a gradient, 3 steps at most"
    for k in ("clean_pred", "adv_pred", "min_eps"):
        assert torch.equal(a[k], b[k]), k


def test_bad_wrapper_settings_are_one_line(tiny_model) -> None:
    with pytest.raises(AdvbenchError, match="valid: jpeg, bit_depth, random_resize_pad"):
        wrapper_spec({"type": "blur"})
    with pytest.raises(AdvbenchError, match="quality"):
        JPEG(tiny_model, quality=0)
    with pytest.raises(AdvbenchError, match="bad defense.wrapper for 'bit_depth'"):
        wrapper_spec({"type": "bit_depth", "levels": 3})


def key_of(tmp_path: Path, *extra: str) -> str:
    cfg = compose_config("config", [f"out_dir={tmp_path}", *extra])
    threat = cell.build_threat(cell_spec(cfg), dict(cfg.dataset.budgets))
    return cell.cell_key(cell.cell_identity(cell_spec(cfg), threat, instantiate(cfg.attack.params)))


def test_the_cell_key_covers_the_wrapper_but_not_the_labels(tmp_path) -> None:
    jpeg = key_of(tmp_path, "defense=jpeg")
    assert jpeg != key_of(tmp_path, "defense=jpeg", "defense.wrapper.quality=50")
    assert key_of(tmp_path, "defense=rp") != key_of(tmp_path, "defense=rp", "defense.wrapper.eot_samples=2")
    assert jpeg == key_of(tmp_path, "defense=jpeg", "defense.category=[ensemble]", "defense.threat_model=l2")


def test_every_defense_has_metadata_and_instantiates(tmp_path, tiny_model) -> None:
    for name in group_options("defense"):
        cfg = compose_config("config", [f"defense={name}", f"out_dir={tmp_path}"])
        assert cfg.defense.category and cfg.defense.threat_model, name
        assert "intended threat" in describe("defense", name)
        model = wrap(tiny_model, defense_spec(cfg.defense).wrapper, seed=0)
        assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    with pytest.raises(AdvbenchError, match="defense.category must list"):
        compose_config("config", ["defense.category=[magic]", f"out_dir={tmp_path}"])


def test_a_wrapper_trains_and_loads_its_bases_checkpoint(tmp_path) -> None:
    from advbench.robustness.defenses.checkpoint_cache import cache_entry, train_command

    natural = compose_config("config", ["defense=natural", f"cache_dir={tmp_path}"])
    for name in ("jpeg", "bit_red", "rp", "randmix"):
        cfg = compose_config("config", [f"defense={name}", f"cache_dir={tmp_path}"])
        assert cache_entry(target_spec(cfg)) == cache_entry(target_spec(natural))
        assert train_command(target_spec(cfg)).endswith("defense=natural")


def test_jpeg_cell_end_to_end_uses_bpda_and_lowers_accuracy(tmp_path, trained_digits_cache) -> None:
    out = tmp_path / "out"
    common = ["attack=bim", "dataset.n_samples=48", "defense.recipe.epochs=4", f"cache_dir={trained_digits_cache}",
              f"out_dir={out}", "search.enabled=false", "threads=1"]
    run_main(compose_config("config", ["defense=jpeg", *common]))
    frame = read_records([out / "records"])
    assert (frame["grad_mode"] == "bpda").all() and (frame["defense"] == "jpeg").all()
    assert frame["flag_zero_grad"].all() and not frame["flag_randomized"].any(), "JPEG without BPDA has no gradient"
    clean = frame["clean_correct"].mean()
    robust = (frame["adv_pred"] == frame["label"]).mean()
    assert robust < clean - 0.3, f"BIM with BPDA should break JPEG: clean {clean:.2f}, at the budget {robust:.2f}"
    assert not list((trained_digits_cache / "checkpoints").rglob("jpeg-*.pt")), "the wrapper reuses natural's checkpoint"
