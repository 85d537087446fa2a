"""The LoRA file operations' maths on made-up modules (a linear and a conv layer, both layouts): resizing keeps the
best approximation and the strength, merging is the weighted sum, the EMA weights are what their definitions say.
`scripts/lora_tool.py` on a trained tiny SD 1.5 LoRA, reloaded with diffusers, is in tests/cli/test_lora_tool.py."""

from __future__ import annotations

import pytest
import torch

from onetrainer.tools import lora_files as lf


def _module(rank: int, out: int, inputs: int, alpha: float | None, conv: bool = False, seed: int = 0) -> lf.LoraModule:
    generator = torch.Generator().manual_seed(seed)
    down = torch.randn(rank, inputs, *((3, 3) if conv else ()), generator=generator)
    up = torch.randn(out, rank, *((1, 1) if conv else ()), generator=generator)
    return lf.LoraModule(down, up, alpha)


def _lora(layout: str, seed: int = 0, rank: int = 6) -> lf.LoraFile:
    alpha = None if layout == lf.DIFFUSERS else 3.0
    modules = {
        "lora_unet_proj": _module(rank, 16, 12, alpha, seed=seed),
        "lora_unet_conv": _module(rank, 8, 4, alpha, conv=True, seed=seed + 1),
    }
    return lf.LoraFile(layout, modules, {"bundle_emb.x.clip_l": torch.ones(2, 4)}, torch.float32)


def _best(delta: torch.Tensor, rank: int) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    return u[:, :rank] @ torch.diag(s[:rank]) @ vh[:rank]


@pytest.mark.parametrize("layout", [lf.KOHYA, lf.DIFFUSERS])
def test_a_file_reads_back_as_it_was_written(layout):
    lora = _lora(layout)
    again = lf.read_lora(lf.write_lora(lora))
    assert again.layout == layout and again.modules.keys() == lora.modules.keys()
    assert torch.equal(again.other["bundle_emb.x.clip_l"], lora.other["bundle_emb.x.clip_l"])
    for name, module in lora.modules.items():
        assert torch.allclose(again.modules[name].delta(), module.delta())


@pytest.mark.parametrize("layout", [lf.KOHYA, lf.DIFFUSERS])
def test_resize_keeps_the_best_approximation_and_the_strength(layout):
    lora = _lora(layout)
    resized, reports = lf.resize(lora, rank=2)
    for name, module in lora.modules.items():
        new = resized.modules[name]
        assert new.rank == 2 and new.down.shape[1:] == module.down.shape[1:] and new.up.shape[2:] == module.up.shape[2:]
        assert torch.allclose(new.delta(), _best(module.delta(), 2), atol=1e-4)
        if layout == lf.KOHYA:
            assert new.alpha / new.rank == pytest.approx(module.alpha / module.rank)  # the consumer's scale stays
        else:
            assert new.alpha is None
    s = torch.linalg.svdvals(lora.modules["lora_unet_proj"].delta())
    report = next(r for r in reports if r.module == "lora_unet_proj")
    assert report.kept_energy == pytest.approx(float((s[:2] ** 2).sum() / (s**2).sum()), rel=1e-5)
    unchanged, _ = lf.resize(lora, rank=10)  # never above a module's own rank: the same change
    assert all(unchanged.modules[n].rank == 6 for n in lora.modules)
    assert torch.allclose(
        unchanged.modules["lora_unet_proj"].delta(), lora.modules["lora_unet_proj"].delta(), atol=1e-4
    )


def test_an_energy_share_picks_each_layers_smallest_rank():
    delta = torch.diag(torch.tensor([10.0, 1.0, 0.1, 0.01]))  # energies 100, 1, 0.01, 0.0001
    module = lf.LoraModule(delta.clone(), torch.eye(4), 4.0)
    lora = lf.LoraFile(lf.KOHYA, {"m": module}, {}, torch.float32)
    assert lf.resize(lora, energy=0.98)[0].modules["m"].rank == 1
    assert lf.resize(lora, energy=0.99995)[0].modules["m"].rank == 3
    with pytest.raises(lf.LoraFileError, match="not both"):
        lf.resize(lora, rank=2, energy=0.9)


@pytest.mark.parametrize("layout", [lf.KOHYA, lf.DIFFUSERS])
def test_merging_gives_the_weighted_sum_exactly_or_at_a_rank(layout):
    first, second = _lora(layout, seed=0), _lora(layout, seed=5, rank=3)
    del second.modules["lora_unet_conv"]  # a module only one file has: its own change
    merged, reports = lf.merge_loras([first, second], [0.7, -0.4])
    assert reports == []  # exact: every module keeps all of its change
    expected = 0.7 * first.modules["lora_unet_proj"].delta() - 0.4 * second.modules["lora_unet_proj"].delta()
    assert merged.modules["lora_unet_proj"].rank == 9
    assert torch.allclose(merged.modules["lora_unet_proj"].delta(), expected, atol=1e-4)
    expected_conv = 0.7 * first.modules["lora_unet_conv"].delta()
    assert torch.allclose(merged.modules["lora_unet_conv"].delta(), expected_conv, atol=1e-5)
    at_rank, reports = lf.merge_loras([first, second], [0.7, -0.4], rank=4)
    assert torch.allclose(at_rank.modules["lora_unet_proj"].delta(), _best(expected, 4), atol=1e-4)
    report = {r.module: r for r in reports}
    assert set(report) == {"lora_unet_proj", "lora_unet_conv"}
    energy = torch.linalg.svdvals(expected) ** 2
    assert (report["lora_unet_proj"].rank_before, report["lora_unet_proj"].rank_after) == (9, 4)
    assert report["lora_unet_proj"].kept_energy == pytest.approx(float(energy[:4].sum() / energy.sum()), abs=1e-5)


def test_merging_refuses_what_it_cannot_add():
    with pytest.raises(lf.LoraFileError, match="different layouts"):
        lf.merge_loras([_lora(lf.KOHYA), _lora(lf.DIFFUSERS)], [1.0, 1.0])
    other = _lora(lf.KOHYA)
    other.modules["lora_unet_proj"] = _module(6, 16, 20, 3.0)
    with pytest.raises(lf.LoraFileError, match="lora_unet_proj has different shapes"):
        lf.merge_loras([_lora(lf.KOHYA), other], [1.0, 1.0])
    loha = {"lora_unet_x.hada_w1_a": torch.ones(2, 2), "lora_unet_x.alpha": torch.tensor(1.0)}
    with pytest.raises(lf.LoraFileError, match="lora_unet_x is a LoHa, LoKr, DoRA or OFT module"):
        lf.read_lora(loha, "loha.safetensors")


def test_the_ema_weights_follow_their_definitions():
    weights = lf.decay_weights(4, 0.5)
    assert weights == pytest.approx([0.125, 0.125, 0.25, 0.5]) and sum(weights) == pytest.approx(1.0)
    narrow = lf.power_ema_weights([1, 2, 3, 4], 0.05)
    wide = lf.power_ema_weights([1, 2, 3, 4], 0.25)
    assert sum(narrow) == pytest.approx(1.0) and sum(wide) == pytest.approx(1.0)
    assert narrow[-1] > wide[-1] and narrow[0] < wide[0]  # a narrower profile leans on the latest checkpoints
    assert lf.power_ema_weights([1, 2], 0.4) == pytest.approx([0.5, 0.5])  # γ = 0: uniform over training time
    checkpoints = [lf.write_lora(_lora(lf.KOHYA, seed=s)) for s in (0, 1, 2)]
    average = lf.average_checkpoints(checkpoints, [0.2, 0.3, 0.5])
    key = "lora_unet_proj.lora_down.weight"
    assert torch.allclose(average[key], sum(w * c[key] for c, w in zip(checkpoints, [0.2, 0.3, 0.5])))
    assert torch.equal(average["lora_unet_proj.alpha"], checkpoints[0]["lora_unet_proj.alpha"])
    with pytest.raises(lf.LoraFileError, match="is \\(4, 12\\), \\(6, 12\\) in a"):
        lf.average_checkpoints([checkpoints[0], lf.write_lora(_lora(lf.KOHYA, rank=4))], [0.5, 0.5], ["a", "b"])
    halved = {k: (v / 2 if k.endswith(".alpha") else v) for k, v in checkpoints[1].items()}
    with pytest.raises(lf.LoraFileError, match="another alpha"):
        lf.average_checkpoints([checkpoints[0], halved], [0.5, 0.5])


def test_any_adapter_kind_averages_tensor_by_tensor():
    """LoHa's factors (hada_w1_a …) average as a LoRA's do: an EMA averages the parameters, whatever they are."""
    generator = torch.Generator().manual_seed(3)
    names = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")
    runs = [{f"lora_unet_x.{n}": torch.randn(4, 4, generator=generator).half() for n in names} for _ in range(2)]
    for run in runs:
        run["lora_unet_x.alpha"] = torch.tensor(2.0)
    average = lf.average_checkpoints(runs, [0.25, 0.75])
    for n in names:
        key = f"lora_unet_x.{n}"
        assert average[key].dtype == torch.float16
        assert torch.allclose(
            average[key].float(), 0.25 * runs[0][key].float() + 0.75 * runs[1][key].float(), atol=1e-3
        )
