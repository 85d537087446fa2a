"""Parts in different dtypes meet safely: each casts what it is given to the dtype it computes in."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from onetrainer.util.part_dtypes import cast_floats, compute_weight, parts_meet_safely


class Autoencoder(nn.Module):
    """A VAE's shape: pipelines call `decode` directly, not `forward`."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 3, 1)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.conv(latents)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.decode(latents)


class Denoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self.seen: list[torch.dtype] = []

    def forward(self, latents: torch.Tensor, extra: dict) -> torch.Tensor:
        self.seen.append(extra["time_ids"].dtype)
        return self.conv(latents) + extra["time_ids"].mean()


def test_a_half_precision_denoiser_hands_its_latents_to_a_float32_vae():
    denoiser, vae = Denoiser().to(torch.bfloat16), Autoencoder()
    latents = torch.randn(1, 4, 8, 8)
    extra = {"time_ids": torch.ones(1, 6)}  # float32, nested in a mapping as SDXL's added_cond_kwargs
    with pytest.raises(RuntimeError):
        vae.decode(denoiser(latents.bfloat16(), {"time_ids": extra["time_ids"].bfloat16()}))
    with parts_meet_safely([denoiser, vae]):
        image = vae.decode(denoiser(latents, extra))
        assert image.dtype == torch.float32 and denoiser.seen[-1] == torch.bfloat16
        assert vae(denoiser(latents, extra)).dtype == torch.float32
    # Undone on leaving: the instance has no wrappers left.
    assert "forward" not in vars(denoiser) and "decode" not in vars(vae)
    with pytest.raises(RuntimeError):
        vae.decode(denoiser(latents.bfloat16(), {"time_ids": extra["time_ids"].bfloat16()}))


def test_the_dtype_is_read_at_each_call_and_nesting_changes_nothing():
    vae = Autoencoder().half()
    with parts_meet_safely([vae]), parts_meet_safely([vae]):
        vae.float()  # SDXL's pipeline upcasts an fp16 VAE for its decode
        assert vae.decode(torch.randn(1, 4, 2, 2, dtype=torch.float16)).dtype == torch.float32
    assert "decode" not in vars(vae)


def test_a_half_part_computes_in_its_own_type_under_another_half_types_autocast():
    part = nn.Linear(8, 8).to(torch.bfloat16)
    seen = []
    part.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    x = torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.float16), parts_meet_safely([part]):
        part(x)
    assert seen == [torch.bfloat16]
    float32_part = nn.Linear(8, 8)
    float32_part.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16), parts_meet_safely([float32_part]):
        float32_part(x)  # a float32 part follows the training dtype's autocast, as mixed precision does
    assert seen[-1] == torch.bfloat16


def test_the_compute_weight_skips_float8_and_integer_weights():
    module = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    module[0].weight.data = module[0].weight.data.to(torch.float8_e4m3fn)
    module[0].bias = nn.Parameter(module[0].bias.data.to(torch.int8), requires_grad=False)
    assert compute_weight(module) is module[1].weight


def test_cast_floats_keeps_integers_and_structure():
    ids, mask = torch.tensor([1, 2]), torch.ones(2, dtype=torch.bool)
    cast = cast_floats({"ids": ids, "x": [torch.zeros(1), (torch.zeros(1),)], "mask": mask, "n": 3}, torch.float16)
    assert cast["ids"] is ids and cast["mask"] is mask and cast["n"] == 3
    assert cast["x"][0].dtype == torch.float16 and cast["x"][1][0].dtype == torch.float16


def test_the_compute_weight_follows_the_module_as_it_changes():
    module = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    assert compute_weight(module) is module[0].weight
    module.to(torch.float16)
    assert compute_weight(module) is module[0].weight and compute_weight(module).dtype == torch.float16
    module[0].weight.data = module[0].weight.data.to(torch.float8_e4m3fn)  # now stored in float8
    assert compute_weight(module) is module[0].bias
    module[0] = nn.Linear(2, 2, dtype=torch.bfloat16)  # the layer replaced
    assert compute_weight(module) is module[0].weight and compute_weight(module).dtype == torch.bfloat16
    module[0].weight = nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))  # the weight replaced
    assert compute_weight(module) is module[0].weight


def test_cast_floats_returns_what_has_nothing_to_cast_as_it_is():
    shapes = [[(1, 4, 4)], [(1, 4, 4)]]
    assert cast_floats(shapes, torch.float16) is shapes
    cast = cast_floats([(1, 2), torch.zeros(1)], torch.float16)
    assert cast[0] == (1, 2) and cast[1].dtype == torch.float16


def test_a_module_asked_for_its_compute_weight_is_still_freed():
    import gc
    import weakref

    for make in (lambda: nn.Linear(2, 2), lambda: nn.Sequential(nn.Linear(2, 2))):  # its own weight first, a child's
        module = make()
        assert compute_weight(module) is next(module.parameters())
        gone = weakref.ref(module)
        del module
        gc.collect()
        assert gone() is None
