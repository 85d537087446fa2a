"""Muon (MUON: torch's Muon with torch's AdamW; MUON_ADV and ADAMUON_ADV: adv_optm): which weights Muon trains and
which the auxiliary Adam (on the tiny SD 1.5's LoRA and fine-tune names, with the family's patterns and a custom
regex), the first steps against torch's and adv_optm's own classes on the same weights and gradients, a resumed
optimizer, the fused back pass, the config checks and the "..." dialog's values. Training a tiny LoRA with each is
`test_optimizers.test_every_optimizer_trains` (every row of the table)."""

from __future__ import annotations

import pytest
import torch
from adv_optm import AdaMuon_adv, Muon_adv

from onetrainer.config import config_from_dict
from onetrainer.config.enums import Optimizer
from onetrainer.training import optim
from onetrainer.training.fused_back_pass import FusedBackPass
from onetrainer.training.muon import MuonLayout, layout_of, split_groups
from tests.helpers import image_folder, local_config, tiny_config
from tests.training.optimizer_steps import assert_resumes_exactly

MUONS = [Optimizer.MUON, Optimizer.MUON_ADV, Optimizer.ADAMUON_ADV]
LR, AUX_LR = 2e-2, 3e-3


# -- the split on a real model's names --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sd15_groups(tmp_path_factory):
    """The tiny SD 1.5's parameter groups as the LoRA and the fine-tune method build them (names and parts)."""
    from onetrainer.families.sd import StableDiffusionFamily
    from onetrainer.methods import create_method

    root = tmp_path_factory.mktemp("muon-split")
    image_folder(root)
    out = {}
    for method in ("LORA", "FINE_TUNE"):
        config, problems = config_from_dict(tiny_config(root, method=method, optimizer={"optimizer": "MUON"}))
        assert [p for p in problems if p.is_error] == []
        family = StableDiffusionFamily()
        model = family.load(local_config(config))
        out[method] = (config, create_method(config, family, model, torch.device("cpu")))
    return out


def named_split(spec_name: Optimizer, config, method) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """{name: shape} of the weights Muon trains and of those the aux Adam trains."""
    groups = method.param_groups()
    names = {id(p): n for g in groups for n, p in zip(g.get("param_names", ()), g["params"])}
    split = split_groups(optim.optimizer_spec(spec_name), groups, layout_of(config))
    muon = {names[id(p)]: tuple(p.shape) for g in split if g["use_muon"] for p in g["params"]}
    adam = {names.get(id(p), "?"): tuple(p.shape) for g in split if not g["use_muon"] for p in g["params"]}
    return muon, adam


def test_a_lora_splits_by_the_family_patterns(sd15_groups):
    config, method = sd15_groups["LORA"]
    muon, adam = named_split(Optimizer.MUON, config, method)
    # The UNet's blocks and CLIP's encoder layers: Muon; the first and last layers and the time embedding: Adam.
    assert "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.default.weight" in muon
    assert "text_encoder.encoder.layers.0.self_attn.q_proj.lora_B.default.weight" in muon
    assert {"unet.time_embedding.linear_1.lora_A.default.weight", "unet.conv_in.lora_A.default.weight"} <= set(adam)
    assert all(("block" in n or "encoder.layers" in n) and len(s) == 2 for n, s in muon.items())
    # A LoRA on a block's convolution is 4-D: torch's Muon cannot take it, adv_optm's can.
    conv = "unet.down_blocks.0.resnets.0.conv1.lora_A.default.weight"
    assert conv in adam and len(adam[conv]) == 4
    adv_muon, _ = named_split(Optimizer.MUON_ADV, config, method)
    assert conv in adv_muon and set(muon) < set(adv_muon)
    # A group's Adam part is a group of its own ("/adam"), at the part's rate while muon_adam_lr is empty; the text
    # encoder's LoRA is all in its encoder layers: one Muon group.
    split = split_groups(optim.optimizer_spec(Optimizer.MUON), method.param_groups(), layout_of(config))
    assert [(g["name"], g["use_muon"]) for g in split] == [
        ("unet_lora", True), ("unet_lora/adam", False), ("text_encoder_lora", True)
    ]  # fmt: skip
    assert {g["lr"] for g in split} == {config.learning_rate}


def test_a_fine_tune_splits_by_the_family_patterns(sd15_groups):
    config, method = sd15_groups["FINE_TUNE"]
    muon, adam = named_split(Optimizer.MUON, config, method)
    assert "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight" in muon
    assert "text_encoder.encoder.layers.0.mlp.fc1.weight" in muon
    # Embeddings, norms, biases, the first and last layers and the time embedding: Adam.
    for name in ("text_encoder.embeddings.token_embedding.weight", "unet.conv_in.weight", "unet.conv_out.weight",
                 "unet.time_embedding.linear_1.weight", "unet.down_blocks.0.attentions.0.norm.weight",
                 "text_encoder.encoder.layers.0.self_attn.q_proj.bias"):  # fmt: skip
        assert name in adam, name
    assert all(len(s) == 2 and min(s) > 1 for s in muon.values())
    total = sum(len(g["params"]) for g in method.param_groups())
    assert len(muon) + len(adam) == total  # every trained weight steps, once


def test_a_custom_regex_and_aux_adam_off(sd15_groups):
    config, method = sd15_groups["LORA"]
    config.optimizer.muon_hidden_layers = r"attn1\.to_[qk]\., mlp.fc2"
    config.optimizer.muon_adam_regex = True
    try:
        muon, adam = named_split(Optimizer.MUON, config, method)
        assert muon and all(("attn1.to_q." in n or "attn1.to_k." in n or "mlp.fc2" in n) for n in muon)
        assert "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_v.lora_A.default.weight" in adam
        config.optimizer.muon_adam_regex = False  # the same text as substrings: the escaped dots match nothing
        assert named_split(Optimizer.MUON, config, method)[0].keys() == {n for n in muon if "mlp.fc2" in n}
        config.optimizer.MuonWithAuxAdam = False  # every matrix Muon can take; vectors and 4-D kernels still Adam
        muon, adam = named_split(Optimizer.MUON, config, method)
        assert "unet.time_embedding.linear_1.lora_A.default.weight" in muon
        assert all(len(s) != 2 for s in adam.values())
    finally:
        config.optimizer.muon_hidden_layers = config.optimizer.muon_adam_regex = None
        config.optimizer.MuonWithAuxAdam = None


def test_the_aux_adam_rates_per_part():
    config, _ = config_from_dict(
        {"model_type": "STABLE_DIFFUSION_XL_10_BASE",
         "optimizer": {"optimizer": "MUON", "muon_adam_lr": 1e-4, "muon_te2_adam_lr": 2e-5}}
    )  # fmt: skip
    layout = layout_of(config, lr_scale=2.0)  # the learning-rate scaler applies to them too
    assert layout.aux_rates == {"unet": 2e-4, "text_encoder": None, "text_encoder_2": 4e-5, "vae": 2e-4}
    vector = torch.nn.Parameter(torch.zeros(3))
    groups = [{"name": "text_encoder_lora", "params": [vector], "lr": 5e-5, "param_names": ["x"],
               "part": "text_encoder"}]  # fmt: skip
    assert split_groups(optim.optimizer_spec(Optimizer.MUON), groups, layout)[0]["lr"] == 5e-5  # its own rate


# -- steps against the packages' own classes --------------------------------------------------------------------------

SHAPES = {"blocks.0.q": (24, 16), "blocks.0.k": (16, 24), "blocks.0.bias": (24,), "conv_in": (8, 4, 3, 3),
          "blocks.1.conv": (8, 8, 3, 3), "proj_out": (16, 8)}  # fmt: skip
LAYOUT = MuonLayout(["blocks."], aux_rates={"unet": AUX_LR})


def tiny(seed: int = 0) -> dict[str, torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.nn.Parameter(torch.randn(s, generator=g) * 0.1) for n, s in SHAPES.items()}


def groups_of(params: dict, lr: float = LR) -> list[dict]:
    return [{"name": "unet", "params": list(params.values()), "lr": lr, "param_names": [f"unet.{n}" for n in params],
             "part": "unet"}]  # fmt: skip


def ours(name: Optimizer, params: dict, **settings):
    block = optim.table_defaults(name)
    for key, value in settings.items():
        setattr(block, key, value)
    return optim.create_optimizer(block, groups_of(params), LR, 0, LAYOUT)


def take_steps(optimizer, params: list, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(100 + step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
        optimizer.zero_grad()


def reference(name: Optimizer, params: dict) -> list:
    """The packages' own optimizers with OneTrainer's arguments written out (`create.py` and its aux Adam defaults),
    on the weights each should get: Muon the blocks' 2-D weights (adv_optm also the 4-D kernel), Adam the rest."""
    hidden = [p for n, p in params.items() if n.startswith("blocks.") and p.ndim >= 2]
    if name is Optimizer.MUON:
        hidden = [p for p in hidden if p.ndim == 2]
        rest = [p for p in params.values() if all(p is not h for h in hidden)]
        return [torch.optim.Muon(hidden, lr=LR, momentum=0.95, weight_decay=0.0, nesterov=True, ns_steps=5),
                torch.optim.AdamW(rest, lr=AUX_LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)]  # fmt: skip
    rest = [p for p in params.values() if all(p is not h for h in hidden)]
    groups = [{"params": hidden, "optim_type": "muon"}, {"params": rest, "optim_type": "adam", "lr": AUX_LR}]
    common = dict(lr=LR, weight_decay=0.0, cautious_wd=False, accelerated_ns=False, ns_steps=5, low_rank_ortho=False,
                  ortho_rank=128, rms_rescaling=True, nnmf_factor=False, stochastic_rounding=True,
                  orthogonal_gradient=False, approx_mars=False, normuon_variant=True, compiled_optimizer=False,
                  Simplified_AdEMAMix=False, alpha_grad=100.0,
                  adam_betas=(0.9, 0.99), adam_eps=1e-8, adam_weight_decay=0.0)  # fmt: skip
    if name is Optimizer.MUON_ADV:
        return [Muon_adv(groups, beta1=0.9, nesterov=True, beta2_normuon=0.95, **common)]
    return [AdaMuon_adv(groups, betas=(0.95, 0.95), eps=1e-8, nesterov=False, use_atan2=False, **common)]


class Both:
    def __init__(self, optimizers) -> None:
        self.optimizers = optimizers

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()


@pytest.mark.parametrize("name", MUONS, ids=lambda o: o.value)
def test_the_first_steps_equal_the_packages_own_optimizers(name):
    mine, theirs, start = tiny(), tiny(), tiny()
    take_steps(ours(name, mine), list(mine.values()), range(4))
    take_steps(Both(reference(name, theirs)), list(theirs.values()), range(4))
    for key in SHAPES:
        assert not torch.equal(mine[key], start[key]), key  # it stepped
        torch.testing.assert_close(mine[key], theirs[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("name", MUONS, ids=lambda o: o.value)
def test_a_resumed_optimizer_continues_exactly(name):
    # The named weights in a fixed order: `ours` takes them by name, the harness steps the list.
    def make(params: list):
        return ours(name, dict(zip(SHAPES, params, strict=True)))

    assert_resumes_exactly(make, lambda: list(tiny().values()))


@pytest.mark.parametrize("name", MUONS, ids=lambda o: o.value)
def test_the_fused_back_pass_steps_each_weight_as_the_whole_step_does(name):
    plain, fused = tiny(), tiny()
    take_steps(ours(name, plain), list(plain.values()), range(3))
    optimizer = ours(name, fused)
    hooks = FusedBackPass(optimizer)
    hooks.stepping = True
    for step in range(3):
        g = torch.Generator().manual_seed(100 + step)
        for p in fused.values():
            grad = torch.randn(p.shape, generator=g)
            (p * grad).sum().backward()  # the hook steps the weight as its gradient arrives
    assert hooks.updates == 3 * len(SHAPES)
    for key in SHAPES:
        torch.testing.assert_close(fused[key], plain[key], rtol=0, atol=0, msg=key)


def test_muon_overfits_a_tiny_regression():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 1))  # fmt: skip
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    named = list(model.named_parameters())
    groups = [{"name": "unet", "params": [p for _, p in named], "lr": 2e-2, "param_names": [n for n, _ in named],
               "part": "unet"}]  # fmt: skip
    optimizer = optim.create_optimizer(optim.table_defaults(Optimizer.MUON), groups, 2e-2, 0, MuonLayout(["2."]))
    assert [g["use_muon"] for g in optimizer.param_groups] == [True, False]
    losses = []
    for _ in range(150):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


# -- the config ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MUONS, ids=lambda o: o.value)
def test_a_onetrainer_config_choosing_it_loads_without_warnings(name):
    # OneTrainer's UI writes every knob of its defaults, and its whole aux Adam block into muon_adam_config.
    knobs = dict(optim.resolved_parameters(optim.table_defaults(name)))
    knobs["muon_adam_config"] = {"optimizer": "ADAMW_ADV", "beta1": 0.9, "beta2": 0.99, "eps": None,
                                 "weight_decay": 0.0, "stochastic_rounding": True}  # fmt: skip
    config, problems = config_from_dict({"optimizer": {"optimizer": name.value, **knobs}})
    assert [p.message for p in problems if p.path.startswith("optimizer")] == []
    assert config.optimizer.optimizer is name


def test_a_bad_regex_and_bad_aux_adam_settings_are_named():
    _, problems = config_from_dict(
        {"optimizer": {"optimizer": "MUON_ADV", "muon_hidden_layers": "blocks, attn(", "muon_adam_regex": True,
                       "muon_adam_config": {"betaa1": 0.9, "eps": "small"}}}
    )  # fmt: skip
    errors = {p.path: p.message for p in problems if p.is_error}
    assert "'attn(' is not a regular expression" in errors["optimizer.muon_hidden_layers"]
    messages = [p.message for p in problems if p.path == "optimizer.muon_adam_config"]
    assert any("'betaa1'" in m for m in messages) and any("eps must be a number" in m for m in messages)
    _, problems = config_from_dict({"optimizer": {"optimizer": "MUON", "muon_hidden_layers": "attn(("}})
    assert not [p for p in problems if p.path.startswith("optimizer")]  # substrings: any text will do


def test_the_aux_adam_settings_reach_the_optimizer():
    params = tiny()
    optimizer = ours(Optimizer.MUON, params, muon_adam_config={"beta1": 0.8, "weight_decay": 0.1})
    adam = next(g for g in optimizer.param_groups if not g["use_muon"])
    assert (adam["betas"], adam["weight_decay"], adam["eps"], adam["lr"]) == ((0.8, 0.999), 0.1, 1e-8, AUX_LR)
    adv = ours(Optimizer.MUON_ADV, tiny(), muon_adam_config={"beta2": 0.9, "orthogonal_gradient": True})
    assert adv.param_groups[0]["adam_betas"] == (0.9, 0.9)
    assert adv.param_groups[0]["adam_orthogonal_gradient"] is True


def test_the_estimate_counts_one_momentum_for_muon():
    from onetrainer.config.optimizer_memory import optimizer_state_bytes

    adamw = optimizer_state_bytes(Optimizer.ADAMW)
    muon = optimizer_state_bytes(Optimizer.MUON)
    assert 4.0 <= muon < 0.6 * adamw
    config, _ = config_from_dict({"optimizer": {"optimizer": "ADAMUON_ADV", "normuon_variant": False}})
    assert optimizer_state_bytes(Optimizer.ADAMUON_ADV, block=config.optimizer) > muon  # a second moment too


# -- a run --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "method"), [(Optimizer.MUON, "FINE_TUNE"), (Optimizer.MUON_ADV, "LORA")])
def test_a_run_resumed_from_its_backup_continues_as_the_uninterrupted_run(tmp_path, name, method):
    from onetrainer.training.checkpoint import list_backups
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Finished, ListSink, Metrics, Progress
    from onetrainer.training.runner import run_training

    class StopAfter(ListSink):
        def __init__(self, control: TrainingControl, steps: int) -> None:
            super().__init__()
            self.control, self.steps = control, steps

        def emit(self, event) -> None:
            super().emit(event)
            if isinstance(event, Progress) and event.global_step >= self.steps:
                self.control.request_stop()

    def run(config: dict, control=None, sink=None):
        cfg, problems = config_from_dict(config)
        assert [p for p in problems if p.is_error] == []
        sink = sink or ListSink()
        return run_training(cfg, control or TrainingControl(), [sink]), sink

    image_folder(tmp_path, count=6)
    common = {"method": method, "epochs": 2, "backup_before_save": True, "optimizer": {"optimizer": name.value},
              "concepts": [{"path": str(tmp_path / "images"), "seed": 7}]}  # fmt: skip
    if method == "FINE_TUNE":
        common.update(learning_rate=1e-4, output_model_format="DIFFUSERS", output_model_destination=str(tmp_path / "m"))
    straight, sink = run(tiny_config(tmp_path / "a", **common))
    assert isinstance(straight, Finished) and straight.reason == "completed"
    expected = {m.global_step: m.loss for m in sink.of(Metrics)}
    rates = sink.of(Metrics)[-1].learning_rates
    group = "unet" if method == "FINE_TUNE" else "unet_lora"
    assert {group, f"{group}/adam"} <= set(rates)  # Muon's and the aux Adam's groups, both reported

    b = tiny_config(tmp_path / "b", **common)
    control = TrainingControl()
    stopped, first = run(b, control, StopAfter(control, 3))
    assert stopped.reason == "stopped" and len(list_backups(tmp_path / "b" / "workspace" / "backup")) == 1
    resumed, second = run({**b, "continue_last_backup": True})
    assert isinstance(resumed, Finished) and resumed.reason == "completed"
    got = {**{m.global_step: m.loss for m in first.of(Metrics)}, **{m.global_step: m.loss for m in second.of(Metrics)}}
    assert sorted(got) == sorted(expected) and len(expected) == 6
    for step, value in expected.items():
        assert got[step] == pytest.approx(value, rel=1e-4, abs=1e-6), step


def test_stochastic_rounding_keeps_small_muon_updates_of_bfloat16_weights():
    from onetrainer.training import stochastic_rounding

    def run(dtype, rounded: bool) -> dict[str, torch.Tensor]:
        params = {n: torch.nn.Parameter(p.detach().to(dtype) + 1.0) for n, p in tiny().items()}
        block = optim.table_defaults(Optimizer.MUON)
        block.stochastic_rounding = rounded
        # Steps below half of bfloat16's spacing near 1 (0.0039): Muon's about 6e-4, the aux Adam's 1e-3.
        layout = MuonLayout(["blocks."], aux_rates={"unet": 1e-3})
        optimizer = optim.create_optimizer(block, groups_of(params, lr=1e-2), 1e-2, 0, layout)
        if stochastic_rounding.applies(block):
            stochastic_rounding.install(optimizer)
        for p in params.values():
            p.grad = torch.ones_like(p)  # the same direction every step: the updates add up
        torch.manual_seed(0)
        for _ in range(80):
            optimizer.step()
        return {n: p.detach().float() for n, p in params.items()}

    exact, nearest, rounded = run(torch.float32, False), run(torch.bfloat16, False), run(torch.bfloat16, True)
    start = {n: p.detach() + 1.0 for n, p in tiny().items()}
    start_bf16 = {n: p.to(torch.bfloat16).float() for n, p in start.items()}
    for key in ("blocks.0.q", "blocks.0.bias"):  # a Muon weight and an aux Adam weight
        moved = (exact[key] - start[key]).mean()  # every element moves the same way: the mean shows the drift
        assert moved.abs() > 1e-3
        assert (nearest[key] - start_bf16[key]).mean().abs() < 0.1 * moved.abs()  # lost to round-to-nearest
        assert ((rounded[key] - start_bf16[key]).mean() - moved).abs() < 0.25 * moved.abs(), key  # kept on average


def test_adv_optm_rounds_its_own_updates():
    from onetrainer.training import stochastic_rounding

    for name in (Optimizer.MUON_ADV, Optimizer.ADAMUON_ADV):
        block = optim.table_defaults(name)
        assert block.stochastic_rounding is True and not stochastic_rounding.applies(block)
        assert ours(name, tiny()).stochastic_rounding is True
        assert ours(name, tiny(), stochastic_rounding=False).stochastic_rounding is False


def test_muon_overfits_a_tiny_lora(tmp_path):
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Finished, ListSink, Metrics
    from onetrainer.training.runner import run_training

    image_folder(tmp_path, count=1)
    # One image at nearly one noise level: the loss falls as the LoRA learns it (at rate 0 it stays within ~10%).
    config = tiny_config(
        tmp_path, epochs=32, batch_size=1, learning_rate=1e-2, min_noising_strength=0.4, max_noising_strength=0.45,
        optimizer={"optimizer": "MUON"}, concepts=[{"path": str(tmp_path / "images"), "seed": 3}],
    )  # fmt: skip
    cfg, problems = config_from_dict(config)
    assert [p for p in problems if p.is_error] == []
    sink = ListSink()
    assert isinstance(run_training(cfg, TrainingControl(), [sink]), Finished)
    losses = [m.loss for m in sink.of(Metrics)]
    assert len(losses) == 32
    assert sum(losses[-8:]) < 0.75 * sum(losses[:8])
