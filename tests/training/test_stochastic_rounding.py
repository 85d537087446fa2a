"""Stochastic rounding of updates into BFLOAT_16 weights: unbiased rounding, the optimizer stepping each BFLOAT_16
weight on its own in float32 (others as usual), the state's dtypes, with the fused back pass, and through a run."""

from __future__ import annotations

import pytest
import torch

from onetrainer.training import stochastic_rounding
from onetrainer.training.fused_back_pass import FusedBackPass
from onetrainer.training.stochastic_rounding import round_stochastically


def test_rounding_picks_a_neighbour_with_the_probability_of_its_distance():
    torch.manual_seed(0)
    gap = 2.0**-7  # bfloat16's spacing in [1, 2)
    values = torch.full((200_000,), 1.0 + 0.3 * gap)
    rounded = round_stochastically(values)
    assert rounded.dtype == torch.bfloat16
    assert set(rounded.float().unique().tolist()) == {1.0, 1.0 + gap}
    assert float((rounded.float() == 1.0 + gap).float().mean()) == pytest.approx(0.3, abs=0.01)
    assert float(rounded.float().mean()) == pytest.approx(1.0 + 0.3 * gap, abs=1e-4)
    negative = round_stochastically(-values).float()  # the magnitude rounds the same way
    assert set(negative.unique().tolist()) == {-1.0, -1.0 - gap}
    exact = torch.tensor([0.0, 1.0, -2.5, 3.0e38, float("inf"), -float("inf")]).bfloat16().float()
    assert torch.equal(round_stochastically(exact).float(), exact)  # values bfloat16 holds stay as they are
    assert round_stochastically(torch.tensor([float("nan")])).isnan().all()


def _weights(dtype: torch.dtype) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.ones(50_000, dtype=dtype))


def test_small_updates_add_up_in_bfloat16_weights():
    # An SGD step of -1e-3 on weights at 1.0 (bfloat16's spacing below 1.0 is 0.0039): rounded to nearest it is lost.
    torch.manual_seed(0)
    nearest, rounded = _weights(torch.bfloat16), _weights(torch.bfloat16)
    plain = torch.optim.SGD([nearest], lr=1e-3)
    stochastic = torch.optim.SGD([rounded], lr=1e-3)
    stochastic_rounding.install(stochastic)
    for _ in range(4):
        for weights, optimizer in ((nearest, plain), (rounded, stochastic)):
            weights.grad = torch.ones_like(weights)
            optimizer.step()
    assert torch.equal(nearest, torch.ones_like(nearest))  # every update lost
    assert rounded.dtype == torch.bfloat16 and rounded.grad.dtype == torch.bfloat16
    assert float(rounded.detach().float().mean()) == pytest.approx(1.0 - 4e-3, abs=2e-4)  # kept on average


def test_only_bfloat16_weights_step_apart_and_the_state_keeps_its_dtypes():
    torch.manual_seed(0)
    half, full = torch.nn.Parameter(torch.randn(64, 32).bfloat16()), torch.nn.Parameter(torch.randn(16))
    reference = torch.nn.Parameter(full.detach().clone())
    optimizer = torch.optim.AdamW([{"params": [half, full], "lr": 1e-2}])
    twin = torch.optim.AdamW([{"params": [reference], "lr": 1e-2}])
    stochastic_rounding.install(optimizer)
    for _ in range(3):
        grad = torch.randn(16)
        half.grad, full.grad, reference.grad = torch.randn(64, 32).bfloat16(), grad, grad.clone()
        before = half.detach().clone()
        optimizer.step()
        twin.step()
        assert not torch.equal(half, before) and half.dtype == torch.bfloat16
    assert torch.equal(full, reference)  # float32 weights step as they always did, together
    state = optimizer.state[half]
    assert state["exp_avg"].dtype == torch.bfloat16 and state["exp_avg_sq"].dtype == torch.bfloat16
    assert optimizer.param_groups[0]["params"] == [half, full]  # the groups are the optimizer's own again


def _count_weights_per_step(optimizer: torch.optim.Optimizer) -> list[int]:
    """How many weights each call of the optimizer's own step is shown (appended to the list returned)."""
    calls: list[int] = []
    plain = optimizer.step

    def counted(*args):
        calls.append(len(optimizer.param_groups[0]["params"]))
        return plain(*args)

    optimizer.step = counted
    return calls


def test_small_weights_step_together_and_a_large_one_alone(monkeypatch):
    # Few optimizer calls for many small weights, a bounded float32 copy: the same result as one at a time.
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(n).bfloat16()) for n in (30, 30, 30, 100, 30)]
    grads = [torch.randn(w.shape).bfloat16() for w in weights]
    results = []
    for chunk in (64, 1):
        monkeypatch.setattr(stochastic_rounding, "CHUNK_ELEMENTS", chunk)
        params = [torch.nn.Parameter(w.detach().clone()) for w in weights]
        optimizer = torch.optim.AdamW(params, lr=1e-2)
        calls = _count_weights_per_step(optimizer)
        stochastic_rounding.install(optimizer)
        for param, grad in zip(params, grads):
            param.grad = grad.clone()
        torch.manual_seed(1)
        optimizer.step()
        results.append((calls, [p.detach().clone() for p in params]))
    (together, packed), (alone, single) = results
    assert together == [2, 1, 1, 1] and alone == [1, 1, 1, 1, 1]  # 30+30, 30 (+100 > 64), 100, 30
    assert all(torch.equal(a, b) for a, b in zip(packed, single))


def test_the_fused_back_pass_rounds_each_weight_as_it_steps_it():
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 256).bfloat16()
    with torch.no_grad():
        layer.weight.fill_(1.0)  # bfloat16's spacing just below 1.0: 0.0039
    start = layer.weight.detach().clone()
    optimizer = torch.optim.SGD(layer.parameters(), lr=1e-4)
    stochastic_rounding.install(optimizer)
    fused = FusedBackPass(optimizer)
    fused.stepping = True
    layer(torch.ones(4, 256, dtype=torch.bfloat16)).sum().backward()
    assert fused.updates == 2 and layer.weight.grad is None
    # each update (-1e-4 · 4) is 10 % of the weights' bfloat16 spacing: rounded to nearest nothing would move
    weight = layer.weight.detach().float()
    assert 0.08 < float((weight != start.float()).float().mean()) < 0.13
    assert float(weight.mean()) == pytest.approx(1.0 - 4e-4, abs=1e-4)


def test_a_bfloat16_fine_tune_with_stochastic_rounding_trains_and_is_not_named_by_the_checks(tmp_path):
    from safetensors.torch import load_file

    from onetrainer.config import config_from_dict
    from onetrainer.training.checks import not_built_settings
    from tests.helpers import image_folder, run_config, tiny_config

    image_folder(tmp_path)
    data = tiny_config(
        tmp_path, method="FINE_TUNE", epochs=1, train_dtype="BFLOAT_16", learning_rate=1e-5,
        unet={"weight_dtype": "BFLOAT_16", "train": True}, text_encoder={"train": False},
        optimizer={"optimizer": "ADAMW", "stochastic_rounding": True},
    )  # fmt: skip
    config, _ = config_from_dict(data)
    assert not [p for p in not_built_settings(config) if p.path == "optimizer.stochastic_rounding"]
    prodigy, _ = config_from_dict({**data, "optimizer": {"optimizer": "PRODIGY", "stochastic_rounding": True}})
    named = [p for p in not_built_settings(prodigy) if p.path == "optimizer.stochastic_rounding"]
    assert named and "an optimizer that steps all weights together" in named[0].message

    run_config(data)
    rounded = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert rounded and all(torch.isfinite(v.float()).all() for v in rounded.values())
    # the same run rounding to nearest saves other weights: the rounding is in the run's optimizer step
    run_config({**data, "optimizer": {"optimizer": "ADAMW", "stochastic_rounding": False}})
    nearest = load_file(str(tmp_path / "out" / "model.safetensors"))
    unet = [k for k in rounded if k.startswith("model.diffusion_model.")]
    assert unet and any(not torch.equal(rounded[k], nearest[k]) for k in unet)


@pytest.mark.parametrize("kind", ["adamw", "adafactor"])
def test_offloaded_trained_blocks_round_as_the_blocks_on_the_device_do(kind):
    # The fused back pass over BFLOAT_16 weights with half the blocks offloaded with their state: the same rounding
    # draws in the same order, so the same weights as without offloading.
    from onetrainer.memory.layer_offload import LayerOffload
    from tests.memory.test_offloaded_fine_tune import CPU, WIDTH, optimizer_of, trained_weights, twin

    nets = [net.bfloat16() for net in twin(checkpointing=True)]
    results = []
    for net, offloaded in zip(nets, (False, True)):
        offload = LayerOffload(net, ["blocks"], 0.5, trained=True) if offloaded else None
        if offload is not None:
            offload.attach(CPU)
        optimizer = optimizer_of(net, kind)
        stochastic_rounding.install(optimizer)
        if offload is not None:
            offload.carry_optimizer_state(optimizer)
        fused = FusedBackPass(optimizer)
        torch.manual_seed(5)  # the rounding's draws
        generator = torch.Generator().manual_seed(3)
        for _ in range(3):
            fused.stepping = True
            net(torch.randn(4, WIDTH, generator=generator).bfloat16()).float().pow(2).mean().backward()
        results.append(trained_weights(net, offload))
    plain, offloaded = results
    assert all(v.dtype == torch.bfloat16 for v in plain.values())
    assert all(torch.equal(offloaded[k], v) for k, v in plain.items())
