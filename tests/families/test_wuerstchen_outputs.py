"""Würstchen v2 and Stable Cascade end to end through `scripts/train.py`'s main on the tiny models: every method
trains, and every file we write loads in the loaders other tools use (diffusers' part-wise `from_pretrained` and
`StableCascadeUNet.from_single_file`, peft for diffusers LoRAs, the kohya / ComfyUI maths for kohya-named LoRAs on
Stability's stage C layout) with our model's output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from onetrainer.config import config_from_dict
from onetrainer.config.enums import ModelFormat
from onetrainer.families.wuerstchen import CascadeFamily, WuerstchenFamily
from onetrainer.methods import create_method
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Finished, Metrics
from tests.helpers import image_folder, local_config, run_config, tiny_config, write_config

CPU = torch.device("cpu")
FAMILIES = {"wuerstchen": WuerstchenFamily, "cascade": CascadeFamily}


def train(
    root: Path, variant: str, method: str, cli: bool = True, placeholder: str | None = None, **overrides
) -> tuple[dict, list[Metrics]]:
    """Train on the tiny model through the CLI's main (`cli`) or in process (the metrics come back)."""
    if not (root / "images").exists():
        image_folder(root, placeholder="<shape>" if method == "EMBEDDING" else placeholder)
    settings = {"resolution": "128", "epochs": 1, "loss_weight_fn": "P2", "layer_filter_preset": "full"}
    config = tiny_config(root, variant, method, **{**settings, **overrides})
    if cli:
        from onetrainer.cli.train import main

        assert main(["--config-path", str(write_config(root, config))]) == 0
        return config, []
    return config, [e for e in run_config(config) if isinstance(e, Metrics)]


def load(config: dict, variant: str, method: bool = True, **changes):
    cfg, problems = config_from_dict({**config, **changes})
    assert [p for p in problems if p.is_error] == []
    family = FAMILIES[variant]()
    model = family.load(local_config(cfg))
    trainer_method = create_method(cfg, family, model, CPU) if method else None
    for module in model.parts.values():
        module.eval()
    return family, model, trainer_method


def prior_output(family, model, seed: int = 0) -> torch.Tensor:
    """The prior's prediction for fixed latents at t = 0.4, conditioned on a caption through the text encoder."""
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(1, 16, 3, 3, generator=generator)
    with torch.no_grad():
        conditioning = family.encode_text(model, ["a red square on a blue ground"])
        return family.predict(model, latents, torch.tensor([0.4]), conditioning, {}).output


def apply_peft(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """A diffusers-format LoRA (alpha folded into lora_B) as peft applies it; a CLIP text encoder's names lose their
    `text_model.` level where the installed model has none, as diffusers' loader drops it."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

    if not hasattr(module, "text_model"):
        weights = {k.removeprefix("text_model."): v for k, v in weights.items()}
    targets = sorted({k.rsplit(".lora_", 1)[0] for k in weights})
    rank = next(v.shape[0] for k, v in weights.items() if k.endswith("lora_A.weight"))
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank, target_modules=targets), module)
    set_peft_model_state_dict(module, weights)


def test_diffusers_lora_on_prior_and_text_encoder_loads_with_peft(tmp_path):
    # Cascade's DIFFUSERS_LORA is written and checked in the legacy / kohya test below, from the LoRA it trains.
    variant = "wuerstchen"
    config, _ = train(tmp_path, variant, "LORA", output_model_format="DIFFUSERS_LORA", text_encoder={"train": True})
    assert_peft_reads_our_diffusers_lora(config, variant, Path(config["output_model_destination"]))


def assert_peft_reads_our_diffusers_lora(config: dict, variant: str, path: Path) -> None:
    """The DIFFUSERS_LORA at `path` (prior and text encoder), applied by peft, gives the output ours gives with it."""
    state = load_file(str(path))
    assert any(k.startswith("prior.") for k in state) and any(k.startswith("text_encoder.text_model.") for k in state)
    with safe_open(str(path), "pt") as f:
        architecture = f.metadata()["modelspec.architecture"]
    assert architecture.startswith("stable-cascade" if variant == "cascade" else "wuerstchen")

    family, ours, _ = load(config, variant, lora_model_name=str(path), output_model_format="DIFFUSERS_LORA")  # ours
    expected = prior_output(family, ours)
    _, plain, _ = load(config, variant, method=False)
    before = prior_output(family, plain)
    for part in ("prior", "text_encoder"):
        prefix = f"{part}."
        apply_peft(plain.part(part), {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
    theirs = prior_output(family, plain)
    assert torch.allclose(expected, theirs, atol=1e-5)
    assert not torch.allclose(before, theirs, atol=1e-6)  # the LoRA trained


def _split_stage_c(stability: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stage C as ComfyUI holds it: the fused `attention.attn.in_proj` split into `attn.to_q/to_k/to_v`."""
    out = {}
    for key, value in stability.items():
        if ".attn.in_proj_" in key:
            prefix, _, kind = key.rpartition(".in_proj_")
            for name, chunk in zip(("to_q", "to_k", "to_v"), value.chunk(3)):
                out[f"{prefix}.{name}.{kind}"] = chunk
        else:
            out[key] = value
    return out


def _fuse_stage_c(native: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {k: v for k, v in native.items() if ".attn.to_" not in k}
    for key in [k for k in native if ".attn.to_q." in k]:
        prefix, _, kind = key.rpartition(".to_q.")
        out[f"{prefix}.in_proj_{kind}"] = torch.cat([native[f"{prefix}.to_{n}.{kind}"] for n in "qkv"])
    return out


def _apply_kohya(weights: dict[str, torch.Tensor], state: dict[str, torch.Tensor], prefix: str) -> int:
    """W + alpha/rank · up @ down for every `prefix`ed LoRA module whose name is a weight's path with dots as `_`."""
    by_module = {k[: -len(".weight")].replace(".", "_"): k for k in weights if k.endswith(".weight")}
    applied = 0
    for key in [k for k in state if k.startswith(prefix) and k.endswith(".lora_down.weight")]:
        name = key[: -len(".lora_down.weight")]
        target = by_module[name[len(prefix) :]]
        down, up = state[key].float(), state[f"{name}.lora_up.weight"].float()
        delta = (up.flatten(1) @ down.flatten(1)).reshape(weights[target].shape)
        weights[target] = weights[target] + delta * (float(state[f"{name}.alpha"]) / down.shape[0])
        applied += 1
    return applied


def test_cascade_legacy_and_kohya_loras_apply_on_stability_stage_c_as_comfyui_does(tmp_path):
    from onetrainer.families.saving import plain_state
    from onetrainer.weights import cascade_keys

    config, _ = train(
        tmp_path, "cascade", "LORA", output_model_format="LEGACY_LORA", text_encoder={"train": True}, lora_alpha=3.0,
        placeholder="<thing>", bundle_additional_embeddings=True,
        additional_embeddings=[{"placeholder": "<thing>", "token_count": 1, "initial_embedding_text": "shape"}],
    )  # fmt: skip
    legacy_path = Path(config["output_model_destination"])
    legacy = load_file(str(legacy_path))
    # the additional embedding on the prior's text encoder, bundled as OneTrainer does (A1111's `bundle_emb.` keys)
    assert legacy["bundle_emb.<thing>.clip_g"].shape == (1, 64)
    assert "lora_prior_unet_down_blocks_0_2_attention_attn_to_q.lora_down.weight" in legacy
    assert "lora_prior_unet_down_blocks_0_2_attention_attn_out_proj.lora_up.weight" in legacy
    assert "lora_prior_te_text_model_encoder_layers_0_self_attn_q_proj.alpha" in legacy
    assert not any("depthwise" in k for k in legacy)

    # Continue from the legacy file and write it again as KOHYA_LORA: the same weights under `lora_unet_` names.
    kohya_path = tmp_path / "kohya.safetensors"
    family, ours, method = load(config, "cascade", lora_model_name=str(legacy_path), output_model_format="KOHYA_LORA")
    method.save_output(kohya_path)
    kohya = load_file(str(kohya_path))
    renamed = {k.replace("lora_prior_unet_", "lora_unet_").replace("lora_prior_te_", "lora_te_"): v
               for k, v in legacy.items()}  # fmt: skip
    assert kohya.keys() == renamed.keys() and all(torch.equal(kohya[k], renamed[k]) for k in kohya)
    expected = prior_output(family, ours)

    # The consumer's way: Stability's stage C split as ComfyUI loads it, the LoRA added to its weights; the text
    # encoder's LoRA on transformers' weights.
    for state, prefixes in ((legacy, ("lora_prior_unet_", "lora_prior_te_")), (kohya, ("lora_unet_", "lora_te_"))):
        _, plain, _ = load(config, "cascade", method=False)
        prior, text_encoder = plain.part("prior"), plain.part("text_encoder")
        native = _split_stage_c(cascade_keys.to_stability(plain_state(prior), prior.config))
        assert _apply_kohya(native, state, prefixes[0]) > 0
        prior.load_state_dict(cascade_keys.to_diffusers(_fuse_stage_c(native), prior.config))
        text_weights = dict(text_encoder.state_dict())
        assert _apply_kohya(text_weights, state, prefixes[1]) > 0
        text_encoder.load_state_dict(text_weights)
        assert torch.allclose(prior_output(family, plain), expected, atol=1e-5)

    # The same LoRA written as DIFFUSERS_LORA (the trainer's output goes through the same `save_output`): peft reads it.
    diffusers_path = tmp_path / "diffusers.safetensors"
    method.config.output_model_format = ModelFormat.DIFFUSERS_LORA
    method.save_output(diffusers_path)
    assert_peft_reads_our_diffusers_lora(config, "cascade", diffusers_path)


def test_cascade_fine_tune_as_stage_c_loads_in_diffusers_and_as_the_prior_model(tmp_path):
    from diffusers import StableCascadeUNet

    from onetrainer.tiny import tiny_model_dir

    file = tmp_path / "out" / "stage_c.safetensors"
    config, _ = train(
        tmp_path, "cascade", "FINE_TUNE", output_model_format="LEGACY_SAFETENSORS", output_model_destination=str(file)
    )
    keys = load_file(str(file)).keys()
    assert any(k.endswith(".attention.attn.in_proj_weight") for k in keys)
    with safe_open(str(file), "pt") as f:
        assert f.metadata()["modelspec.architecture"].startswith("stable-cascade")
    theirs = StableCascadeUNet.from_single_file(
        str(file), config=str(tiny_model_dir("cascade")), subfolder="prior", torch_dtype=torch.float32
    )
    family, base, _ = load(config, "cascade", method=False)
    before = prior_output(family, base)
    base.parts["prior"] = theirs.eval()
    expected = prior_output(family, base)
    assert not torch.allclose(before, expected, atol=1e-6)  # the prior trained
    # read back as the prior part's model over the base pipeline: the same prior
    _, again, _ = load(config, "cascade", method=False, prior={"model_name": str(file)})
    assert torch.allclose(prior_output(family, again), expected, atol=1e-6)


def local_prior(root: Path, variant: str, folder: Path) -> dict:
    from onetrainer.tiny.effnet import save_effnet_encoder

    effnet = save_effnet_encoder(root / "effnet_encoder.safetensors", wuerstchen=variant == "wuerstchen")
    return {
        "base_model_name": str(folder),
        "decoder": {"model_name": f"tiny:{variant}-decoder"},
        "effnet_encoder": {"model_name": str(effnet)},
    }


def test_fine_tune_writes_the_prior_folder_diffusers_loads_part_by_part(tmp_path):
    # Cascade's prior folder is checked on the uninterrupted run of the resume test below (the same kind of run).
    variant = "wuerstchen"
    folder = tmp_path / "out" / "prior"
    config, _ = train(
        tmp_path, variant, "FINE_TUNE", output_model_format="DIFFUSERS", output_model_destination=str(folder),
        text_encoder={"train": True},
    )  # fmt: skip
    assert_the_prior_folder_loads_part_by_part(tmp_path, variant, config, folder)


def assert_the_prior_folder_loads_part_by_part(root: Path, variant: str, config: dict, folder: Path) -> None:
    from diffusers import StableCascadeUNet
    from diffusers.pipelines.deprecated.wuerstchen import WuerstchenPrior

    cls = StableCascadeUNet if variant == "cascade" else WuerstchenPrior
    prior = cls.from_pretrained(str(folder), subfolder="prior")
    # A local prior folder takes its decoder and effnet from their parts' model names (the decoder: the published one
    # by default).
    family, trained, _ = load(config, variant, method=False, **local_prior(root, variant, folder))
    assert all(torch.equal(v, trained.part("prior").state_dict()[k]) for k, v in prior.state_dict().items())
    _, base, _ = load(config, variant, method=False)
    assert not torch.allclose(prior_output(family, base), prior_output(family, trained), atol=1e-6)


@pytest.mark.parametrize("variant", ["wuerstchen", "cascade"])
def test_embedding_is_saved_under_clip_g_and_continues(tmp_path, variant):
    config, _ = train(tmp_path, variant, "EMBEDDING")
    path = Path(config["output_model_destination"])
    state = load_file(str(path))
    _, model, method = load(config, variant, embedding={"model_name": str(path)})
    width = model.part("text_encoder").config.hidden_size
    assert list(state) == ["clip_g"] and state["clip_g"].shape == (2, width)
    continued = method.embeddings.file_tensors(method.embeddings.embeddings[0], torch.float32)["clip_g"]
    assert torch.equal(continued, state["clip_g"])


@pytest.mark.parametrize("variant", ["wuerstchen", "cascade"])
def test_the_loss_falls_on_an_overfit_set(tmp_path, variant):
    # 4 images at one noise level: the same 4 targets up to the noise draw, learnt in 16 steps
    _, metrics = train(
        tmp_path, variant, "LORA", cli=False, epochs=8, learning_rate=3e-3, lora_rank=8, lora_alpha=8.0,
        timestep_distribution="UNIFORM", min_noising_strength=0.3, max_noising_strength=0.31,
    )  # fmt: skip
    losses = torch.tensor([m.loss for m in metrics])
    assert len(losses) == 16 and torch.isfinite(losses).all()
    assert losses[-6:].mean() < losses[:6].mean(), losses


def test_cascade_caches_effnet_latents_and_clip_hidden_pooled_and_mask_and_trains_masked(tmp_path, monkeypatch):
    calls = {"images": 0, "captions": 0}
    seen = []
    original_images, original_text = CascadeFamily.encode_images, CascadeFamily.encode_text
    original_predict = CascadeFamily.predict

    def encode_images(family, model, pixels):
        calls["images"] += len(pixels)
        return original_images(family, model, pixels)

    def encode_text(family, model, captions):
        calls["captions"] += len(captions)
        return original_text(family, model, captions)

    def predict(family, model, noisy, times, conditioning, extra):
        seen.append(conditioning)
        return original_predict(family, model, noisy, times, conditioning, extra)

    monkeypatch.setattr(CascadeFamily, "encode_images", encode_images)
    monkeypatch.setattr(CascadeFamily, "encode_text", encode_text)
    monkeypatch.setattr(CascadeFamily, "predict", predict)
    frozen_text = {"text_encoder": {"train": False}}
    train(tmp_path, "cascade", "LORA", cli=False, only_cache=True, **frozen_text)
    assert calls == {"images": 4, "captions": 5}  # 4 captions and the empty one (caption dropout)
    calls.update(images=0, captions=0)
    _, metrics = train(tmp_path, "cascade", "LORA", cli=False, **frozen_text)
    assert metrics and calls == {"images": 0, "captions": 0}  # everything from the cache
    assert seen and all(c.pooled is not None and c.get("attention_mask") is not None for c in seen)
    assert seen[0].pooled.shape[0] == seen[0].hidden_states.shape[0] == seen[0].get("attention_mask").shape[0]
    assert seen[0].get("attention_mask").shape[1] == 77

    # Masked training scales the masks to the effnet latents: the demo folder has a `-masklabel.png` for its first
    # image, and at 128 px its mask becomes the 3×3 latents' mask. The run above is the plain run it is compared to.
    _, masked = train(tmp_path / "masked", "cascade", "LORA", cli=False, masked_training=True, unmasked_weight=0.0,
                      **frozen_text)  # fmt: skip
    plain_losses, masked_losses = [m.loss for m in metrics], [m.loss for m in masked]
    assert len(masked_losses) == len(plain_losses) == 2 and all(torch.isfinite(torch.tensor(masked_losses)))
    assert masked_losses != pytest.approx(plain_losses)  # the masked image's loss counts only inside its mask


@pytest.mark.parametrize("size", ["3.6B", "lite"])
def test_a_full_size_stage_c_file_is_read_on_the_config_its_shapes_fit(size):
    """Stability's stage_c.safetensors / stage_c_lite.safetensors over any base prior: built on the meta device at
    the real sizes (no weights), converted to Stability's layout, recognised by shape."""
    from diffusers import StableCascadeUNet

    from onetrainer.families.reference_configs import CASCADE_PRIOR_LITE_UNET, CASCADE_PRIOR_UNET
    from onetrainer.families.wuerstchen import stage_c_config
    from onetrainer.tiny import tiny_model_dir
    from onetrainer.weights import cascade_keys

    real = CASCADE_PRIOR_UNET if size == "3.6B" else CASCADE_PRIOR_LITE_UNET
    with torch.device("meta"):
        state = StableCascadeUNet.from_config(real).state_dict()
    stability = cascade_keys.to_stability(state, real)
    tiny_base = StableCascadeUNet.load_config(str(tiny_model_dir("cascade")), subfolder="prior")
    config, converted = stage_c_config(stability, tiny_base)
    assert config["block_out_channels"] == real["block_out_channels"]
    assert config["down_num_layers_per_block"] == real["down_num_layers_per_block"]
    assert converted.keys() == state.keys()
    assert stage_c_config({"clip_txt_mapper.weight": torch.zeros(1)}, tiny_base) is None


def test_cascade_fine_tune_loads_in_diffusers_part_by_part_and_resumes_from_its_backup_as_run_straight(tmp_path):
    # The fine-tune backup is the family's own (the prior pipeline folder); LoRA backups are the method's, as for SD.
    method = "FINE_TUNE"
    from onetrainer.training.checkpoint import list_backups
    from tests.training.test_resume_and_control import StopAfter, losses, run

    image_folder(tmp_path)
    common = {"resolution": "128", "epochs": 2, "backup_before_save": True, "text_encoder": {"train": True}}
    common.update(learning_rate=1e-4, output_model_format="DIFFUSERS")
    concepts = [{"path": str(tmp_path / "images"), "seed": 7}]
    folder = tmp_path / "a" / "out" / "prior"
    a = tiny_config(tmp_path / "a", "cascade", method, **common, concepts=concepts)
    a["output_model_destination"] = str(folder)
    straight, sink = run(a)
    expected = losses(sink)
    assert isinstance(straight, Finished) and len(expected) == 4
    assert_the_prior_folder_loads_part_by_part(tmp_path, "cascade", a, folder)  # what the fine-tune wrote

    b = tiny_config(tmp_path / "b", "cascade", method, **common, concepts=concepts)
    control = TrainingControl()
    stopped, first = run(b, control, StopAfter(control, 2))  # after epoch 1: a backup of the prior and CLIP
    assert isinstance(stopped, Finished) and len(list_backups(tmp_path / "b" / "workspace" / "backup")) == 1
    resumed, second = run({**b, "continue_last_backup": True})
    assert isinstance(resumed, Finished) and resumed.reason == "completed"
    got = {**losses(first), **losses(second)}
    assert sorted(got) == sorted(expected)
    for step, value in expected.items():
        assert got[step] == pytest.approx(value, rel=1e-4, abs=1e-6), step
