"""adv-optm's *_ADV optimizers (AdamW, ADOPT, Prodigy, SignSGD, Lion) and Prodigy + schedule-free, as OneTrainer
builds them: the factory calls the package's class with exactly OneTrainer's arguments (written out here from its
`create.py` and default table; adv-optm 2.2.3, as OneTrainer pins it), steps as that class does on the same
parameters and gradients (the AdEMAMix variants too), resumes exactly from a backup's state dict, steps the same with
the fused back pass (the class's own per-weight step) and rounds BFLOAT_16 updates itself. Training a tiny LoRA with
each is `test_optimizers.test_every_optimizer_trains` (it runs every row of the table)."""

from __future__ import annotations

import adv_optm
import pytest
import torch
from prodigyplus import prodigy_plus_schedulefree

from onetrainer.config import config_from_dict
from onetrainer.config.enums import Optimizer
from onetrainer.training import optim
from onetrainer.training.fused_back_pass import FusedBackPass
from onetrainer.training.optimization import Optimization
from tests.training.optimizer_steps import assert_resumes_exactly, take_steps, tiny_params

LR = 1e-2
WARMUP = 7  # the LR warmup's length, which OneTrainer gives adv-optm's Kourkoutas-beta warmup

_ADV = dict(weight_decay=0.0, nnmf_factor=False, cautious_wd=False, stochastic_rounding=True,
            orthogonal_gradient=False, compiled_optimizer=False)  # fmt: skip
_ADEMAMIX = dict(use_AdEMAMix=False, beta3_ema=0.9999, alpha=5.0)
_SIMPLIFIED = dict(Simplified_AdEMAMix=False, alpha_grad=100.0)
# OneTrainer's arguments for each (its default table's values; ADAMW_ADV and ADOPT_ADV take beta3 as beta3_ema).
EXPECTED = {
    Optimizer.ADAMW_ADV: (adv_optm, "AdamW_adv", dict(
        lr=LR, betas=(0.9, 0.99), eps=1e-8, **_ADV, use_atan2=False, kourkoutas_beta=False, k_warmup_steps=WARMUP,
        **_ADEMAMIX,
    )),
    Optimizer.ADOPT_ADV: (adv_optm, "Adopt_adv", dict(
        lr=LR, betas=(0.9, 0.9999), eps=1e-6, **_ADV, use_atan2=True, kourkoutas_beta=False, k_warmup_steps=WARMUP,
        **_ADEMAMIX, **_SIMPLIFIED,
    )),
    Optimizer.PRODIGY_ADV: (adv_optm, "Prodigy_adv", dict(
        lr=LR, betas=(0.9, 0.99), beta3=None, eps=1e-8, **_ADV, d0=1e-6, d_coef=1.0, growth_rate=float("inf"),
        slice_p=11, prodigy_steps=0, d_limiter=False, use_atan2=False, kourkoutas_beta=False, k_warmup_steps=WARMUP,
        **_ADEMAMIX, **_SIMPLIFIED,
    )),
    Optimizer.SIGNSGD_ADV: (adv_optm, "SignSGD_adv", dict(lr=LR, momentum=0.95, **_ADV, **_SIMPLIFIED)),
    Optimizer.LION_ADV: (adv_optm, "Lion_adv", dict(
        lr=LR, betas=(0.9, 0.99), **_ADV, clip_threshold=0.0, auto_kappa_p=True,
    )),
    Optimizer.PRODIGY_PLUS_SCHEDULE_FREE: (prodigy_plus_schedulefree, "ProdigyPlusScheduleFree", dict(
        lr=LR, betas=(0.9, 0.99), beta3=None, weight_decay=0.0, weight_decay_by_lr=True, use_bias_correction=False,
        d0=1e-6, d_coef=1.0, prodigy_steps=0, use_speed=False, eps=1e-8, split_groups=True, split_groups_mean=False,
        factored=True, factored_fp32=True, fused_back_pass=False, use_stableadamw=True, use_cautious=False,
        use_grams=False, use_adopt=False, stochastic_rounding=True, d_limiter=True, use_schedulefree=True,
        schedulefree_c=0.0, use_orthograd=False,
    )),
}  # fmt: skip
NAMES = list(EXPECTED)
ids = {"ids": lambda o: o.value}


def package_class(name: Optimizer):
    module, class_name, _ = EXPECTED[name]
    return getattr(module, class_name)


def groups(params) -> list[dict]:
    # Two named groups, as a LoRA of two parts (Prodigy + schedule-free then estimates a step size for each).
    return [{"params": params[:2], "lr": LR, "name": "unet"}, {"params": params[2:], "lr": LR, "name": "te"}]


def ours(name: Optimizer, params, **settings):
    block = optim.table_defaults(name)
    for key, value in settings.items():
        setattr(block, key, value)
    return optim.create_optimizer(block, groups(params), LR, WARMUP)


def theirs(name: Optimizer, params):
    _, _, kwargs = EXPECTED[name]
    return package_class(name)(groups(params), **kwargs)


@pytest.mark.parametrize("name", NAMES, **ids)
def test_the_package_class_gets_exactly_onetrainers_arguments(name, monkeypatch):
    module, class_name, expected = EXPECTED[name]
    seen = {}

    def record(params, **kwargs):
        seen.update(kwargs)
        return real(params, **kwargs)

    real = getattr(module, class_name)
    monkeypatch.setattr(module, class_name, record)
    built = ours(name, tiny_params())
    assert type(built) is real
    assert seen == expected


@pytest.mark.parametrize("name", NAMES, **ids)
def test_the_first_steps_equal_the_packages_own_optimizer(name):
    mine, reference = tiny_params(), tiny_params()
    take_steps(ours(name, mine), mine, range(4))
    take_steps(theirs(name, reference), reference, range(4))
    for a, b, start in zip(mine, reference, tiny_params()):
        assert not torch.equal(a, start)  # it stepped
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES, **ids)
def test_a_resumed_optimizer_continues_exactly(name):
    assert_resumes_exactly(lambda params: ours(name, params), tiny_params)


def _model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _loss(model, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step % 2)  # two batches: steps that agree, so Prodigy's D soon grows
    return (model(torch.randn(5, 8, generator=g)) - torch.randn(5, 4, generator=g)).pow(2).mean()


def _model_groups(model, lr: float) -> list[dict]:
    return [{"params": list(model[0].parameters()), "lr": lr, "name": "a"},
            {"params": list(model[2].parameters()), "lr": lr, "name": "b"}]  # fmt: skip


@pytest.mark.parametrize("name", NAMES, **ids)
def test_the_fused_back_pass_steps_as_the_optimizer_step(name):
    # Each weight stepped by the class's own per-weight step as its gradient arrives, the step finished after the
    # backward pass (Prodigy's new step size): the same weights as backward, then step().
    plain_model, fused_model = _model(), _model()
    block = optim.table_defaults(name)
    adaptive = optim.OPTIMIZERS[name].adaptive
    lr = 1.0 if adaptive else LR
    if adaptive:
        block.d0 = 1e-4
    plain = optim.create_optimizer(block, _model_groups(plain_model, lr), lr, WARMUP)
    block.fused_back_pass = True  # Prodigy + schedule-free is told (its step() then only finishes the step)
    stepped = optim.create_optimizer(block, _model_groups(fused_model, lr), lr, WARMUP)
    fused = FusedBackPass(stepped, steps_each_weight=optim.OPTIMIZERS[name].steps_each_weight)
    for step in range(8):  # Prodigy's D grows from the sixth step on
        _loss(plain_model, step).backward()
        plain.step()
        plain.zero_grad()
        fused.stepping = True
        _loss(fused_model, step).backward()
        fused.finish()
        stepped.zero_grad()
    assert fused.updates == 8 * 4
    # Prodigy sums its statistics for D over the weights in the order they step (the backward pass's, here): equal
    # up to float32 rounding.
    exact = {"rtol": 1e-5, "atol": 1e-7} if adaptive else {"rtol": 0, "atol": 0}
    for a, b, start in zip(plain_model.parameters(), fused_model.parameters(), _model().parameters()):
        assert not torch.equal(a, start)
        torch.testing.assert_close(a, b, **exact)
    if adaptive:  # D adapted, as without fusing
        d = plain.param_groups[0]["d"]
        assert d > 1e-4 and stepped.param_groups[0]["d"] == pytest.approx(d, rel=1e-5)


@pytest.mark.parametrize("name", NAMES, **ids)
def test_they_round_bfloat16_updates_themselves(name):
    # Updates far below bfloat16's spacing (0.0039 below 1.0): rounded to nearest every one is lost; the class's own
    # stochastic rounding (OneTrainer's default) keeps them on average. This trainer's rounding is not installed.
    from onetrainer.training.stochastic_rounding import applies, rounds

    assert not applies(optim.table_defaults(name)) and rounds(optim.table_defaults(name))
    moved = {}
    for rounding in (True, False):
        weights = torch.nn.Parameter(torch.ones(20_000, dtype=torch.bfloat16))
        block = optim.table_defaults(name)
        block.stochastic_rounding = rounding
        lr = 1e-4
        if optim.OPTIMIZERS[name].adaptive:  # Prodigy's step: lr x D, D starting at d0
            lr, block.d0 = 1.0, 1e-4
        optimizer = optim.create_optimizer(block, [{"params": [weights], "lr": lr, "name": "w"}], lr)
        for _ in range(3):
            weights.grad = torch.ones_like(weights)
            optimizer.step()
        moved[rounding] = float((weights.detach().float() != 1.0).float().mean())
    assert moved[False] == 0.0 and moved[True] > 0.0


def test_prodigy_plus_schedule_free_samples_and_saves_at_its_evaluation_point():
    # The trainer samples and saves inside `inference_weights`: the schedule-free optimizer's averaged weights (eval),
    # and training goes on from its own point afterwards (train).
    params = tiny_params()
    optimizer = ours(Optimizer.PRODIGY_PLUS_SCHEDULE_FREE, params, d0=1e-2)  # steps large enough to see
    assert optim.OPTIMIZERS[Optimizer.PRODIGY_PLUS_SCHEDULE_FREE].schedule_free
    optimization = Optimization(optimizer, None, True, None, None, None, params)
    optimizer.train()
    take_steps(optimizer, params, range(5))
    training_point = [p.detach().clone() for p in params]
    with optimization.inference_weights():
        assert all(not g["train_mode"] for g in optimizer.param_groups)
        evaluated = [p.detach().clone() for p in params]
    assert all(g["train_mode"] for g in optimizer.param_groups)
    assert any(not torch.allclose(a, b) for a, b in zip(evaluated, training_point))
    for a, b in zip(params, training_point):
        torch.testing.assert_close(a.detach(), b, rtol=1e-5, atol=1e-6)  # back at its training point
    # The evaluation point is the package's own: its eval() on an identical run.
    reference = tiny_params()
    _, _, kwargs = EXPECTED[Optimizer.PRODIGY_PLUS_SCHEDULE_FREE]
    other = prodigy_plus_schedulefree.ProdigyPlusScheduleFree(groups(reference), **{**kwargs, "d0": 1e-2})
    other.train()
    take_steps(other, reference, range(5))
    other.eval()
    for a, b in zip(evaluated, reference):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)


def test_it_is_schedule_free_and_adaptive_without_a_warmup_of_its_own():
    row = optim.OPTIMIZERS[Optimizer.PRODIGY_PLUS_SCHEDULE_FREE]
    assert row.schedule_free and row.adaptive and row.warmup is None  # OneTrainer gives it no warmup
    _, problems = config_from_dict(
        {"optimizer": {"optimizer": "PRODIGY_PLUS_SCHEDULE_FREE"}, "learning_rate_scheduler": "COSINE"}
    )
    assert any(p.path == "learning_rate_scheduler" and "CONSTANT" in p.message for p in problems)
    assert optim.OPTIMIZERS[Optimizer.PRODIGY_ADV].adaptive


def test_the_reported_rate_is_prodigy_plus_schedule_frees_effective_rate_times_d():
    params = tiny_params()
    optimizer = ours(Optimizer.PRODIGY_PLUS_SCHEDULE_FREE, params)
    take_steps(optimizer, params, range(3))
    group = optimizer.param_groups[0]
    assert group["effective_lr"] != group["lr"]
    assert optim.effective_learning_rates(optimizer)["unet"] == pytest.approx(group["effective_lr"] * group["d"])


@pytest.mark.parametrize("name", NAMES, **ids)
def test_a_onetrainer_config_choosing_it_loads_without_warnings(name):
    # OneTrainer's UI writes every knob of its defaults (beta3_ema and alpha too, for the AdEMAMix variants).
    knobs = dict(optim.resolved_parameters(optim.table_defaults(name)))
    knobs.update({"beta3_ema": 0.9999, "alpha": 5, "alpha_grad": 100.0, "use_AdEMAMix": False})
    config, problems = config_from_dict({"optimizer": {"optimizer": name.value, **knobs}})
    assert [p.message for p in problems if p.path.startswith("optimizer")] == []
    assert config.optimizer.optimizer is name


@pytest.mark.parametrize("name", NAMES, **ids)
def test_the_checks_accept_the_fused_back_pass_and_their_rounding(name):
    from onetrainer.training.checks import check_fused_back_pass, check_stochastic_rounding, not_built_settings

    config, _ = config_from_dict({"optimizer": {"optimizer": name.value, "fused_back_pass": True}})
    assert not [p for p in check_fused_back_pass(config) if name.value in p.message]
    config, _ = config_from_dict(
        {"training_method": "FINE_TUNE", "unet": {"train": True, "weight_dtype": "BFLOAT_16"},
         "optimizer": {"optimizer": name.value, "stochastic_rounding": True},
         "optimizer_defaults": {name.value: {"optimizer": name.value, "stochastic_rounding": True}}}
    )  # fmt: skip
    assert not [p for p in not_built_settings(config) if "stochastic_rounding" in p.path]
    assert check_stochastic_rounding(config) == []
    # Off in the block while OneTrainer's remembered settings turn it on: named, as for the other optimizers.
    config.optimizer.stochastic_rounding = False
    named = [p.path for p in check_stochastic_rounding(config)]
    assert named == [f"optimizer_defaults.{name.value}.stochastic_rounding"]


# The AdEMAMix variants OneTrainer passes (adv-optm 2.2.3): which optimizers take each, OneTrainer's knobs set off
# their defaults, and the package's own arguments for them. ADAMW_ADV and ADOPT_ADV get beta3 as beta3_ema.
ADEMAMIX = {
    Optimizer.ADAMW_ADV: (dict(use_AdEMAMix=True, beta3=0.995, alpha=3.0),
                          dict(use_AdEMAMix=True, beta3_ema=0.995, alpha=3.0)),
    Optimizer.ADOPT_ADV: (dict(use_AdEMAMix=True, beta3=0.995, alpha=3.0),
                          dict(use_AdEMAMix=True, beta3_ema=0.995, alpha=3.0)),
    Optimizer.PRODIGY_ADV: (dict(use_AdEMAMix=True, beta3_ema=0.995, alpha=3.0),
                            dict(use_AdEMAMix=True, beta3_ema=0.995, alpha=3.0)),
}  # fmt: skip
SIMPLIFIED = {
    name: (
        dict(Simplified_AdEMAMix=True, alpha_grad=20.0, **({"beta1": 0.99} if name.value != "SIGNSGD_ADV" else {})),
        dict(Simplified_AdEMAMix=True, alpha_grad=20.0),
    )
    for name in (Optimizer.ADOPT_ADV, Optimizer.PRODIGY_ADV, Optimizer.SIGNSGD_ADV)
}


def _variant_cases():
    for table in (ADEMAMIX, SIMPLIFIED):
        for name, (settings, arguments) in table.items():
            yield pytest.param(name, settings, arguments, id=f"{name.value}-{next(iter(settings))}")


@pytest.mark.parametrize(("name", "settings", "arguments"), list(_variant_cases()))
def test_the_ademamix_variants_step_as_the_packages_own_optimizer(name, settings, arguments):
    # A LoRA's weights with the variant on: the same steps as the package's class given OneTrainer's arguments with
    # the variant's, on the same gradients, and different steps from the variant off (the knobs reach it).
    _, _, expected = EXPECTED[name]
    reference_kwargs = {**expected, **arguments}
    if "beta1" in settings:
        reference_kwargs["betas"] = (settings["beta1"], reference_kwargs["betas"][1])
    start = {}
    if optim.OPTIMIZERS[name].adaptive:  # Prodigy: steps of lr x D large enough to tell the variant from plain steps
        start = {"d0": 1e-3}
        reference_kwargs.update(start)
    mine, reference, plain = tiny_params(), tiny_params(), tiny_params()
    take_steps(ours(name, mine, **settings, **start), mine, range(5))
    take_steps(package_class(name)(groups(reference), **reference_kwargs), reference, range(5))
    take_steps(ours(name, plain, **start), plain, range(5))
    for a, b in zip(mine, reference):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert any(not torch.allclose(a, off) for a, off in zip(mine, plain))


@pytest.mark.parametrize(("name", "settings", "arguments"), list(_variant_cases()))
def test_a_onetrainer_config_with_a_variant_loads_and_runs_without_being_named(name, settings, arguments):
    from onetrainer.training.checks import not_built_settings

    config, problems = config_from_dict({"optimizer": {"optimizer": name.value, **settings}})
    assert [p.message for p in problems if p.path.startswith("optimizer")] == []
    assert not [p for p in not_built_settings(config) if p.path.startswith("optimizer.")]
    for key, value in settings.items():
        assert getattr(config.optimizer, key) == value


def test_lion_adv_clips_as_onetrainer_asks():
    from onetrainer.training.checks import not_built_settings

    config, _ = config_from_dict({"optimizer": {"optimizer": "LION_ADV", "clip_threshold": 1.0}})
    assert not [p for p in not_built_settings(config) if p.path == "optimizer.clip_threshold"]
    mine, reference = tiny_params(), tiny_params()
    take_steps(ours(Optimizer.LION_ADV, mine, clip_threshold=0.05), mine, range(3))
    _, _, expected = EXPECTED[Optimizer.LION_ADV]
    take_steps(adv_optm.Lion_adv(groups(reference), **{**expected, "clip_threshold": 0.05}), reference, range(3))
    for a, b in zip(mine, reference):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_dialog_shows_their_knobs_and_the_fused_back_pass_once():
    for name in NAMES:
        rows = [r.name for r in optim.dialog_parameters(name)]
        assert rows.count("fused_back_pass") == 1 and rows.count("stochastic_rounding") == 1
    prodigy = {r.name: r for r in optim.dialog_parameters(Optimizer.PRODIGY_ADV)}
    assert prodigy["slice_p"].default == 11 and prodigy["d_limiter"].default is False
    assert {r.name: r.default for r in optim.dialog_parameters(Optimizer.ADOPT_ADV)}["use_atan2"] is True


def test_the_estimate_counts_their_optimizer_state():
    from onetrainer.config.optimizer_memory import optimizer_state_bytes

    assert optimizer_state_bytes(Optimizer.ADAMW_ADV) == optimizer_state_bytes(Optimizer.ADAMW) == 8.0
    assert optimizer_state_bytes(Optimizer.LION_ADV) == optimizer_state_bytes(Optimizer.SIGNSGD_ADV) == 4.0
    assert 8.0 < optimizer_state_bytes(Optimizer.PRODIGY_ADV) < 9.0
    assert 4.0 < optimizer_state_bytes(Optimizer.PRODIGY_PLUS_SCHEDULE_FREE) < 5.0


@pytest.mark.parametrize("name", NAMES, **ids)
def test_a_tiny_lora_overfits_with_it(name):
    # A rank-2 adapter on a frozen layer fitting one fixed batch (the up projection starts at zero, as a LoRA's):
    # the loss falls well below where it starts. Training the tiny SD LoRA with each is in test_optimizers.py.
    torch.manual_seed(0)
    frozen = torch.randn(16, 16) / 4
    down = torch.nn.Parameter(torch.randn(2, 16) / 4)
    up = torch.nn.Parameter(torch.zeros(16, 2))
    inputs, targets = torch.randn(32, 16), torch.randn(32, 16) / 2
    lr = 1.0 if optim.OPTIMIZERS[name].adaptive else 1e-2
    optimizer = optim.create_optimizer(
        optim.table_defaults(name), [{"params": [down, up], "lr": lr, "name": "lora"}], lr, WARMUP
    )
    if optim.OPTIMIZERS[name].schedule_free:
        optimizer.train()
    losses = []
    for _ in range(60):
        loss = (inputs @ (frozen + up @ down).T - targets).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.9 * losses[0], losses


def test_a_run_samples_and_saves_prodigy_plus_schedule_free_at_its_evaluation_point(tmp_path, monkeypatch):
    # Through the trainer: it trains in train mode, and each sample and the saved model are taken in eval mode (the
    # averaged weights), training going on in train mode after each sample.
    from onetrainer.methods.lora import LoraMethod
    from onetrainer.training.outputs import Outputs
    from tests.helpers import image_folder, run_config, tiny_config

    seen: list[str] = []
    mode = {"train": None}
    original = prodigy_plus_schedulefree.ProdigyPlusScheduleFree.set_train_mode

    def set_train_mode(self, train):
        original(self, train)
        mode["train"] = all(g["train_mode"] for g in self.param_groups)
        seen.append("train" if train else "eval")

    render, save, step = (
        Outputs._render_samples,
        LoraMethod.save_output,
        prodigy_plus_schedulefree.ProdigyPlusScheduleFree.step,
    )
    monkeypatch.setattr(prodigy_plus_schedulefree.ProdigyPlusScheduleFree, "set_train_mode", set_train_mode)
    monkeypatch.setattr(Outputs, "_render_samples", lambda *a: (seen.append(f"sample in {mode['train']}"), render(*a)))
    monkeypatch.setattr(LoraMethod, "save_output", lambda *a: (seen.append(f"save in {mode['train']}"), save(*a))[1])
    monkeypatch.setattr(
        prodigy_plus_schedulefree.ProdigyPlusScheduleFree, "step",
        lambda self, *a: (seen.append(f"step in {mode['train']}"), step(self, *a))[1],
    )  # fmt: skip
    image_folder(tmp_path)
    run_config(tiny_config(
        tmp_path, epochs=1, learning_rate=1.0, sample_after=1, sample_after_unit="STEP",
        samples=[{"prompt": "a circle", "width": 64, "height": 64, "diffusion_steps": 2}],
        optimizer={"optimizer": "PRODIGY_PLUS_SCHEDULE_FREE"},
    ))  # fmt: skip
    steps = [i for i, s in enumerate(seen) if s.startswith("step")]
    assert len(steps) == 2 and all(seen[i] == "step in True" for i in steps)
    assert seen.count("sample in False") == 2 and "sample in True" not in seen
    assert seen[-3:] == ["eval", "save in False", "train"]


def test_a_bfloat16_fine_tune_with_the_fused_back_pass_trains_with_prodigy_adv(tmp_path, monkeypatch):
    # Through the trainer: each weight stepped by Prodigy_adv's own per-weight step, rounding itself into the
    # BFLOAT_16 weights, and each step finished after the backward pass (its new D); nothing named by the checks.
    from safetensors.torch import load_file

    from onetrainer.training.checks import run_checks
    from onetrainer.training.events import Metrics
    from tests.helpers import image_folder, run_config, tiny_config

    finished, per_weight = [], []
    calculate_d, step_parameter = adv_optm.Prodigy_adv.calculate_d, adv_optm.Prodigy_adv.step_parameter
    monkeypatch.setattr(adv_optm.Prodigy_adv, "calculate_d", lambda self: (finished.append(1), calculate_d(self)))
    monkeypatch.setattr(
        adv_optm.Prodigy_adv, "step_parameter",
        lambda self, p, *a: (per_weight.append(p.grad is not None and p.dtype), step_parameter(self, p, *a)),
    )  # fmt: skip
    image_folder(tmp_path)
    data = tiny_config(
        tmp_path, method="FINE_TUNE", epochs=2, train_dtype="BFLOAT_16", learning_rate=1.0, clip_grad_norm=None,
        unet={"weight_dtype": "BFLOAT_16", "train": True}, text_encoder={"train": False},
        optimizer={"optimizer": "PRODIGY_ADV", "fused_back_pass": True, "d0": 1e-4},
    )  # fmt: skip
    config, _ = config_from_dict(data)
    assert not [p for p in run_checks(config) if p.path.startswith("optimizer")]
    events = run_config(data)
    assert len([m for m in events if isinstance(m, Metrics)]) == 4
    assert len(finished) == 4  # one finished step per optimizer step
    stepped = [dtype for dtype in per_weight if dtype]  # weights stepped with a gradient: by the hooks
    assert stepped and set(stepped) == {torch.bfloat16} and len(stepped) % 4 == 0
    saved = load_file(str(tmp_path / "out" / "model.safetensors"))
    unet = {k: v for k, v in saved.items() if k.startswith("model.diffusion_model.")}
    assert unet and all(torch.isfinite(v.float()).all() for v in unet.values())
