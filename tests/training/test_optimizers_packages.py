"""The optimizers built from pytorch-optimizer (AdaBelief, Tiger, Aida, Yogi, ADOPT) and bitsandbytes' AdEMAMix: the
factory's optimizer steps as the package's own class, built with OneTrainer's arguments written out here (not taken
from the table), on the same parameters and gradients; and its state survives a backup's save and load exactly.
CAME_8BIT (written here, `training/came8bit.py`) steps as `came_pytorch.CAME` where it keeps 32-bit state, and
close to it where its first moment is 8-bit. Training a tiny LoRA with each is
`test_optimizers.test_every_optimizer_trains` (it runs every row of the table)."""

from __future__ import annotations

import io

import bitsandbytes as bnb
import pytest
import torch
from came_pytorch import CAME
from pytorch_optimizer.optimizer.adabelief import AdaBelief
from pytorch_optimizer.optimizer.adopt import ADOPT
from pytorch_optimizer.optimizer.aida import Aida
from pytorch_optimizer.optimizer.tiger import Tiger
from pytorch_optimizer.optimizer.yogi import Yogi

from onetrainer.config import config_from_dict
from onetrainer.config.enums import Optimizer
from onetrainer.training import optim
from tests.training import optimizer_steps
from tests.training.optimizer_steps import assert_resumes_exactly, take_steps

LR = 1e-2

# OneTrainer's `create.py` for each (its defaults; AdaBelief's `amsgrad` is pytorch-optimizer's `ams_bound`).
REFERENCE = {
    Optimizer.ADABELIEF: lambda p: AdaBelief(
        p, lr=LR, betas=(0.9, 0.999), eps=1e-16, weight_decay=0.0, ams_bound=False, weight_decouple=True,
        fixed_decay=False, rectify=True, degenerated_to_sgd=True,
    ),
    Optimizer.TIGER: lambda p: Tiger(p, lr=LR, beta=0.965, weight_decay=0.01, weight_decouple=True, fixed_decay=False),
    Optimizer.AIDA: lambda p: Aida(
        p, lr=LR, betas=(0.9, 0.999), k=2, xi=1e-20, weight_decay=0.0, weight_decouple=False, fixed_decay=False,
        rectify=False, n_sma_threshold=5, degenerated_to_sgd=True, ams_bound=False, r=0.95, adanorm=False,
        adam_debias=False, eps=1e-8,
    ),
    Optimizer.YOGI: lambda p: Yogi(
        p, lr=LR, betas=(0.9, 0.999), weight_decay=0.0, weight_decouple=True, fixed_decay=False, adam_debias=False,
        initial_accumulator=1e-6, eps=1e-3,
    ),
    Optimizer.ADOPT: lambda p: ADOPT(
        p, lr=LR, betas=(0.9, 0.9999), weight_decay=0.0, weight_decouple=False, fixed_decay=False, cautious=False,
        eps=1e-6,
    ),
    Optimizer.AdEMAMix: lambda p: bnb.optim.AdEMAMix(
        p, lr=LR, betas=(0.9, 0.999, 0.9999), weight_decay=1e-2, eps=1e-8, alpha=5, optim_bits=32,
        min_8bit_size=4096, is_paged=False,
    ),
    Optimizer.AdEMAMix_8BIT: lambda p: bnb.optim.AdEMAMix8bit(
        p, lr=LR, betas=(0.9, 0.999, 0.9999), weight_decay=1e-2, eps=1e-8, alpha=5, min_8bit_size=4096,
        is_paged=False,
    ),
}  # fmt: skip
ADDED = [*REFERENCE, Optimizer.CAME_8BIT]


def tiny_params(seed: int = 0, shapes=((4, 1280), (1280, 4), (16,))) -> list[torch.nn.Parameter]:
    """A LoRA's shapes: a down and an up projection (the 8-bit state needs 4096+ elements) and a bias."""
    return optimizer_steps.tiny_params(seed, shapes)


def ours(name: Optimizer, params, **settings):
    block = optim.table_defaults(name)
    for key, value in settings.items():
        setattr(block, key, value)
    return optim.create_optimizer(block, [{"params": params, "lr": LR, "name": "lora"}], LR)


@pytest.mark.parametrize("name", list(REFERENCE), ids=lambda o: o.value)
def test_the_first_steps_equal_the_packages_own_optimizer(name):
    mine, theirs = tiny_params(), tiny_params()
    optimizer = ours(name, mine)
    assert type(optimizer) is type(REFERENCE[name](tiny_params()))
    take_steps(optimizer, mine, range(4))
    take_steps(REFERENCE[name](theirs), theirs, range(4))
    for a, b, start in zip(mine, theirs, tiny_params()):
        assert not torch.equal(a, start)  # it stepped
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", ADDED, ids=lambda o: o.value)
def test_a_resumed_optimizer_continues_exactly(name):
    assert_resumes_exactly(lambda params: ours(name, params), tiny_params)


# A 1x1 convolution and a matrix over CAME_8BIT's `min_8bit_size` (16384): 8-bit first moments; the rest 32-bit.
LARGE = ((128, 160), (160, 128, 1, 1), (4, 1280), (16,))


def came(params):
    return CAME(params, lr=LR, eps=(1e-30, 1e-16), betas=(0.9, 0.999, 0.9999), weight_decay=1e-2)


def test_came_8bit_steps_as_came_where_its_state_is_32_bit():
    mine, theirs = tiny_params(), tiny_params()
    take_steps(ours(Optimizer.CAME_8BIT, mine), mine, range(4))
    take_steps(came(theirs), theirs, range(4))
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_came_8bit_keeps_large_first_moments_in_8_bits_and_steps_close_to_came():
    shapes = LARGE[:1] + LARGE[2:]  # came_pytorch factors a 1x1 convolution otherwise; compared alone below
    mine, theirs, start = tiny_params(shapes=shapes), tiny_params(shapes=shapes), tiny_params(shapes=shapes)
    optimizer = ours(Optimizer.CAME_8BIT, mine)
    take_steps(optimizer, mine, range(5))
    take_steps(came(theirs), theirs, range(5))
    state = optimizer.state[mine[0]]
    assert state["exp_avg_q"].dtype == torch.uint8 and "exp_avg" not in state
    assert "exp_avg" in optimizer.state[mine[1]]  # under min_8bit_size: 32-bit
    for a, b, s in zip(mine, theirs, start):
        moved, expected = a - s, b - s
        assert (moved - expected).norm() < 0.05 * expected.norm()
    conv = tiny_params(shapes=LARGE[1:2])
    take_steps(ours(Optimizer.CAME_8BIT, conv), conv, range(2))
    assert torch.isfinite(conv[0]).all()


def test_came_8bit_resumes_exactly_with_8_bit_state():
    straight = tiny_params(shapes=LARGE)
    take_steps(ours(Optimizer.CAME_8BIT, straight), straight, range(6))
    params = tiny_params(shapes=LARGE)
    first = ours(Optimizer.CAME_8BIT, params)
    take_steps(first, params, range(3))
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = ours(Optimizer.CAME_8BIT, params)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.state[params[0]]["exp_avg_q"].dtype == torch.uint8
    take_steps(resumed, params, range(3, 6))
    for a, b in zip(params, straight):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_8bit_ademamix_keeps_8bit_state():
    params = tiny_params()
    optimizer = ours(Optimizer.AdEMAMix_8BIT, params)
    take_steps(optimizer, params, range(1))
    assert optimizer.state[params[0]]["state1"].dtype == torch.uint8


@pytest.mark.parametrize("name", ADDED, ids=lambda o: o.value)
def test_a_onetrainer_config_choosing_it_loads_without_warnings(name):
    # OneTrainer's UI writes every knob of its defaults; none is "not supported" or ignored here any more.
    knobs = {k: v for k, v in optim.resolved_parameters(optim.table_defaults(name)).items()}
    config, problems = config_from_dict({"optimizer": {"optimizer": name.value, **knobs}})
    assert [p.message for p in problems if p.path.startswith("optimizer")] == []
    assert config.optimizer.optimizer is name


@pytest.mark.parametrize("name", ADDED, ids=lambda o: o.value)
def test_fused_back_pass_and_stochastic_rounding_with_them_are_named(name):
    from onetrainer.training.checks import check_fused_back_pass

    config, _ = config_from_dict({"optimizer": {"optimizer": name.value, "fused_back_pass": True}})
    assert any(p.is_error and name.value in p.message for p in check_fused_back_pass(config))
    # Stochastic rounding into BFLOAT_16 weights: a "not built" warning says what happens instead.
    from onetrainer.training.checks import not_built_settings

    config, _ = config_from_dict(
        {"training_method": "FINE_TUNE", "unet": {"train": True, "weight_dtype": "BFLOAT_16"},
         "optimizer": {"optimizer": name.value, "stochastic_rounding": True}}
    )  # fmt: skip
    assert any(p.path == "optimizer.stochastic_rounding" for p in not_built_settings(config))
