"""EMA, timestep distributions, precision, and the guards against NaN losses and black samples."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from PIL import Image

from onetrainer.config import config_from_dict
from onetrainer.config.enums import TimestepDistribution
from onetrainer.noise import timesteps
from onetrainer.training.checkpoint import list_backups
from onetrainer.training.control import TrainingControl
from onetrainer.training.ema import EMA
from onetrainer.training.events import Failed, Finished, ListSink, SampleReady, Warning_
from onetrainer.training.runner import run_training
from tests.helpers import image_folder, local_config, read_scalars, timestep_settings, tiny_config


def run(config_dict):
    config, problems = config_from_dict(config_dict)
    assert [p for p in problems if p.is_error] == []
    sink = ListSink()
    return run_training(config, TrainingControl(), [sink]), sink


# -- EMA --------------------------------------------------------------------------------------------------------------


def test_ema_follows_the_formula_with_decay_warmup():
    param = torch.nn.Parameter(torch.zeros(3))
    ema = EMA([param], decay=0.9, every=2, device=torch.device("cpu"))
    expected = torch.zeros(3)
    updates = 0
    for step in range(1, 9):
        with torch.no_grad():
            param.add_(1.0)
        did = ema.after_step(step)
        assert did == (step % 2 == 0)
        if did:
            decay = min((1 + updates) / (10 + updates), 0.9)
            expected = decay * expected + (1 - decay) * param.detach()
            updates += 1
    assert torch.allclose(ema.shadow[0], expected)
    assert ema.current_decay() == pytest.approx(min(5 / 14, 0.9))


def test_ema_swaps_in_and_restores_and_round_trips_its_state():
    param = torch.nn.Parameter(torch.ones(2))
    ema = EMA([param], decay=0.5, every=1, device=torch.device("cpu"))
    with torch.no_grad():
        param.fill_(3.0)
    ema.after_step(1)
    with ema.swapped_in():
        assert torch.allclose(param, ema.shadow[0])
    assert torch.equal(param.detach(), torch.full((2,), 3.0))
    other = EMA([param], decay=0.5, every=1, device=torch.device("cpu"))
    other.load_state_dict(ema.state_dict())
    assert other.updates == 1 and torch.equal(other.shadow[0], ema.shadow[0])


def test_training_with_ema(tmp_path):
    image_folder(tmp_path)
    samples = [{"prompt": "a circle", "width": 64, "height": 64, "diffusion_steps": 2}]
    common = {"epochs": 2, "sample_after": 1, "sample_after_unit": "EPOCH", "samples": samples}
    outcome, sink = run(tiny_config(tmp_path, ema="CPU", ema_update_step_interval=1, backup_before_save=True, **common))
    assert isinstance(outcome, Finished)
    prompts = [e.prompt for e in sink.of(SampleReady)]
    assert prompts.count("a circle") == 2 and prompts.count("a circle - no-ema") == 2
    assert (tmp_path / "workspace" / "samples" / "0 - a circle - no-ema").is_dir()
    decay = read_scalars(tmp_path / "workspace" / "tensorboard")["ema_decay"]
    assert [round(v, 4) for _, v in decay] == [round((1 + t) / (10 + t), 4) for t in range(1, 5)]
    state = torch.load(list_backups(tmp_path / "workspace" / "backup")[-1] / "optimizer.pt", weights_only=False)
    assert state["ema"]["updates"] == 4

    from safetensors.torch import load_file

    with_ema = load_file(str(tmp_path / "out" / "lora.safetensors"))
    plain_root = tmp_path / "plain"
    image_folder(plain_root)
    outcome, _ = run(tiny_config(plain_root, **common))
    without = load_file(str(plain_root / "out" / "lora.safetensors"))
    key = next(k for k in with_ema if k.endswith("lora_up.weight"))
    assert not torch.allclose(with_ema[key], without[key])  # the final model takes the averaged weights


# -- timesteps --------------------------------------------------------------------------------------------------------


def draws(**fields) -> torch.Tensor:
    return timesteps.unit_timesteps(200_000, timestep_settings(**fields), torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    ("kind", "w", "b"),
    [
        (TimestepDistribution.COS_MAP, 0.0, 0.0),
        (TimestepDistribution.SIGMOID, 6.0, 0.1),
        (TimestepDistribution.INVERTED_PARABOLA, 4.0, -0.1),
        (TimestepDistribution.BETA, 2.0, 5.0),
    ],
)
def test_table_distributions_follow_their_density(kind, w, b):
    x = draws(timestep_distribution=kind, noising_weight=w, noising_bias=b)
    counts = torch.histc(x, bins=20, min=0, max=1)
    grid = (torch.arange(20, dtype=torch.float64) + 0.5) / 20
    density = timesteps.timestep_density(kind, w, b, grid).clamp(min=0)
    expected = density / density.sum() * len(x)
    assert torch.allclose(counts.double(), expected, rtol=0.08, atol=300)


def test_logit_normal_and_heavy_tail():
    x = draws(timestep_distribution=TimestepDistribution.LOGIT_NORMAL, noising_weight=0.0, noising_bias=0.0)
    logits = torch.log(x / (1 - x))
    assert logits.mean().item() == pytest.approx(0.0, abs=0.02) and logits.std().item() == pytest.approx(1.0, abs=0.02)
    shifted = draws(timestep_distribution=TimestepDistribution.LOGIT_NORMAL, noising_bias=1.0)
    assert torch.log(shifted / (1 - shifted)).mean().item() == pytest.approx(1.0, abs=0.02)
    u = draws(timestep_distribution=TimestepDistribution.HEAVY_TAIL, noising_weight=0.0)
    assert u.mean().item() == pytest.approx(0.5, abs=0.01)  # scale 0 is uniform
    heavy = draws(timestep_distribution=TimestepDistribution.HEAVY_TAIL, noising_weight=0.5)
    assert ((heavy < 0.1) | (heavy > 0.9)).float().mean() < ((u < 0.1) | (u > 0.9)).float().mean()


def test_shift_moves_timesteps_towards_noise():
    x = torch.linspace(0, 1, 11)
    assert torch.allclose(timesteps.shift_timesteps(x, 3.0), 3 * x / (2 * x + 1))
    assert draws(timestep_shift=3.0).mean() > 0.6 > draws().mean()


def test_histogram_for_the_preview():
    histogram = timesteps.timestep_histogram(timestep_settings(min_noising_strength=0.5), bins=10, samples=100_000)
    assert histogram[:5].sum() == 0 and histogram[5:].sum() == 100_000


def test_beta_needs_positive_parameters():
    _, problems = config_from_dict({"timestep_distribution": "BETA"})
    assert any(p.path == "noising_weight" for p in problems)


# -- precision ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["BFLOAT_16", "FLOAT_16"])
def test_mixed_precision_trains(tmp_path, dtype):
    image_folder(tmp_path)
    outcome, _ = run(tiny_config(tmp_path, epochs=1, train_dtype=dtype, vae={"weight_dtype": "FLOAT_32"}))
    assert isinstance(outcome, Finished)


def test_quantized_weight_dtypes_hold_frozen_weights_only():
    _, problems = config_from_dict(
        {"training_method": "LORA", "unet": {"weight_dtype": "FLOAT_8"}, "vae": {"weight_dtype": "NFLOAT_4"}}
    )
    assert not [p for p in problems if p.path.endswith("weight_dtype")]  # frozen under LoRA: accepted
    _, problems = config_from_dict(
        {"training_method": "FINE_TUNE", "unet": {"weight_dtype": "FLOAT_8"}, "vae": {"weight_dtype": "NFLOAT_4"}}
    )
    assert {p.path for p in problems if "frozen weights only" in p.message} == {"unet.weight_dtype"}


# -- guards -----------------------------------------------------------------------------------------------------------


def test_nan_loss_stops_with_advice_and_keeps_the_last_backup(tmp_path, monkeypatch):
    image_folder(tmp_path, count=8)
    from onetrainer.families.sd import StableDiffusionFamily
    from onetrainer.noise.prediction import Prediction

    original = StableDiffusionFamily.predict
    calls = []

    def predict(self, *args, **kwargs):
        calls.append(1)
        out = original(self, *args, **kwargs)
        return Prediction(out.output * float("nan"), out.losses) if len(calls) > 5 else out

    monkeypatch.setattr(StableDiffusionFamily, "predict", predict)
    config = tiny_config(tmp_path, epochs=2, backup_after=1, backup_after_unit="EPOCH", backup_before_save=True,
                         unet={"weight_dtype": "FLOAT_16"}, train_dtype="FLOAT_16")  # fmt: skip
    outcome, _ = run(config)
    assert isinstance(outcome, Failed)
    assert "NaN or infinite at step 6" in outcome.message and "FLOAT_16" in outcome.message
    assert "learning rate" in outcome.message
    backups = list_backups(tmp_path / "workspace" / "backup")
    assert len(backups) == 1  # the epoch-1 backup, untouched; no backup of the broken state
    assert not (tmp_path / "out" / "lora.safetensors").exists()


def test_black_samples_are_reported_with_the_fix(tmp_path, monkeypatch):
    image_folder(tmp_path)
    monkeypatch.setattr("onetrainer.training.outputs.render", lambda *a, **k: Image.new("RGB", (64, 64)))
    config = tiny_config(tmp_path, epochs=1, sample_after=1, sample_after_unit="EPOCH",
                         samples=[{"prompt": "x", "width": 64, "height": 64}])  # fmt: skip
    outcome, sink = run(config)
    assert isinstance(outcome, Finished)
    [warning] = [w.text for w in sink.of(Warning_) if "black" in w.text]
    assert "FLOAT_32 or BFLOAT_16" in warning and "VAE" in warning


def test_a_failed_sample_is_reported_and_training_goes_on(tmp_path, monkeypatch):
    image_folder(tmp_path)
    rendered = []

    def render(family, model, sample, *args):
        if sample.prompt == "broken":
            raise RuntimeError("Input type (c10::Half) and bias type (float) should be the same\nmore detail")
        rendered.append(sample.prompt)
        return Image.new("RGB", (64, 64), (200, 10, 10))

    monkeypatch.setattr("onetrainer.training.outputs.render", render)
    samples = [{"prompt": p, "width": 64, "height": 64} for p in ("broken", "fine")]
    config = tiny_config(tmp_path, epochs=2, sample_after=1, sample_after_unit="EPOCH", samples=samples)
    outcome, sink = run(config)
    assert isinstance(outcome, Finished) and (tmp_path / "out" / "lora.safetensors").exists()
    failures = [w.text for w in sink.of(Warning_) if "failed" in w.text]
    assert len(failures) == 2  # once per epoch: the run went on after the first
    assert failures[0] == (
        "sample 0 ('broken') failed: RuntimeError: Input type (c10::Half) and bias type (float) should be the same; "
        "training goes on"
    )
    assert rendered == ["fine", "fine"] and [e.index for e in sink.of(SampleReady)] == [1, 1]
    log = (tmp_path / "workspace" / "logs").rglob("*.log")
    assert any("Traceback" in path.read_text(encoding="utf-8") for path in log)  # the details, for a bug report


def test_a_step_without_gradients_steps_past_a_grad_scaler(tmp_path, monkeypatch):
    # FLOAT_16 on CUDA scales the loss; torch's scaler refuses to step an optimizer that got no gradient, which is
    # every step of an embedding whose placeholder is in none of the batch's captions. The CPU's scaler behaves alike.
    image_folder(tmp_path)  # captions without the placeholder
    scalers = []

    def cpu_scaler(*args):
        scalers.append(torch.amp.GradScaler("cpu"))
        return scalers[-1]

    monkeypatch.setattr("onetrainer.training.optimization.grad_scaler", cpu_scaler)
    outcome, _ = run(tiny_config(tmp_path, method="EMBEDDING", epochs=1))
    assert isinstance(outcome, Finished) and scalers


def test_no_grad_scaler_for_trained_bfloat16_weights():
    from onetrainer.config.enums import DataType
    from onetrainer.training.devices import _NoScaler, grad_scaler

    cuda = torch.device("cuda")
    bf16 = [{"params": [torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))]}]
    fp32 = [{"params": [torch.nn.Parameter(torch.zeros(2))]}]
    with pytest.warns(UserWarning) if not torch.cuda.is_available() else contextlib.nullcontext():
        assert isinstance(grad_scaler(cuda, DataType.FLOAT_16, fp32), torch.amp.GradScaler)
    assert isinstance(grad_scaler(cuda, DataType.FLOAT_16, bf16), _NoScaler)  # it cannot unscale bf16 gradients
    assert isinstance(grad_scaler(cuda, DataType.BFLOAT_16, fp32), _NoScaler)


@pytest.mark.parametrize("key", ["sd", "sdxl", "pixart", "flux", "chroma", "wuerstchen", "cascade"])
def test_the_broken_sample_advice_names_the_familys_own_fields(key):
    import re

    from onetrainer.config.model_types import MODEL_TYPES
    from onetrainer.families import FAMILY_CLASSES, load_family_class

    model_type = next(t for t, info in MODEL_TYPES.items() if info.family.key == key)
    family = load_family_class(model_type)()
    fields = re.findall(r"(\w+)\.weight_dtype", family.broken_sample_advice)
    assert fields and set(fields) <= set(family.info.parts), (key, FAMILY_CLASSES[key], fields)


def test_zero_terminal_snr_rescales_the_schedule_and_predicts_v(tmp_path):
    image_folder(tmp_path)
    outcome, _ = run(tiny_config(tmp_path, epochs=1, rescale_noise_scheduler_to_zero_terminal_snr=True))
    assert isinstance(outcome, Finished)
    from onetrainer.families.sd import StableDiffusionFamily

    config, _ = config_from_dict({"base_model_name": "tiny:sd15", "rescale_noise_scheduler_to_zero_terminal_snr": True})
    model = StableDiffusionFamily().load(local_config(config))
    assert model.v_prediction and model.schedule.alphas_cumprod[-1].item() == pytest.approx(0.0, abs=1e-6)
    assert math.isclose(model.schedule.alphas_cumprod[0].item(), 0.99915, rel_tol=1e-3)
