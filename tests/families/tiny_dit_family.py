"""A model family written only here, against the family contract (`onetrainer/families/base.py`): a tiny DiT-like
denoiser on a continuous cosine schedule, conditioned on a masked T5 encoder, with an 8x patch autoencoder.

It is the proof that the next families are one file each: it declares its own model type (a `ModelType` member,
OneTrainer's name, that no module of the trainer declares), its own parts (`dit`, `patch_autoencoder`: no
TrainConfig field, their settings live in `TrainConfig.parts`) and its capabilities, and registering them
(`register`, at test time) is all it takes for the generic config, trainer, methods, cache and sampler to train LoRA,
fine-tune and embeddings on it and to sample it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.model_types import (
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
    register_model_type,
)
from onetrainer.families import register_family
from onetrainer.families.base import (
    BatchInputs,
    CaptionDropout,
    Conditioning,
    Family,
    LoadedModel,
    TextEncoderSlot,
    Writer,
    first_weight,
)
from onetrainer.noise.cosine import ContinuousCosineSchedule
from onetrainer.noise.prediction import Prediction
from onetrainer.weights.metadata import ModelKind

# Its tiny model (`tiny_dit_tiny.py`, registered at test time as a built-in family's is declared in `onetrainer/tiny/`):
# a folder holding the parts' weights in one file, which `load` reads; a run resolves the name to it before the family
# loads (`tests.helpers.local_config` does for a test that loads the family itself).
BASE_MODEL = "tiny:tiny-dit"
WEIGHTS_FILE = "model.safetensors"
# A name from OneTrainer's list for the test family to take while registered: `register_model_type` puts its
# declaration in place of the built-in HunyuanVideo's and the undo puts that one back.
MODEL_TYPE = ModelType.HUNYUAN_VIDEO
DIT, PATCH_AUTOENCODER = "dit", "patch_autoencoder"  # parts of its own: no TrainConfig field is named so
TOKENS = 16
WIDTH = 32
PATCH = 2
SCALE = 8  # pixels per latent

INFO = FamilyInfo(
    key="tiny_dit",
    label="Tiny DiT (test family)",
    part_roles={
        DIT: PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        PATCH_AUTOENCODER: PartRole.IMAGE_ENCODER,
    },
    part_labels={DIT: "DiT"},
    bucket_step=SCALE * PATCH,
    methods=(TrainingMethod.FINE_TUNE, TrainingMethod.LORA, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.FINE_TUNE: (ModelFormat.SAFETENSORS,),
        TrainingMethod.LORA: (ModelFormat.KOHYA_LORA,),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    layer_presets={"attn-only": ("attn",), "full": ()},
    muon_hidden_layers=("blocks", "encoder.block"),  # Muon's default: the DiT's blocks, T5's
    sample_step=SCALE * PATCH,
    # A continuous schedule without learned variance: none of the capabilities (`model_types.CAPABILITIES`) the
    # settings ask for, so the discrete-schedule and VB-loss settings do not apply to it.
    capabilities=frozenset(),
)
MODEL_TYPE_INFO = ModelTypeInfo(
    MODEL_TYPE, "Tiny DiT", INFO, 64, False, False, SampleDefaults(64, 64, 4, 3.0, NoiseScheduler.DDIM)
)


def register() -> Callable[[], None]:
    """Make the family known and trainable: its model type (with its parts) and its class. Returns the undo."""
    undos = [
        register_model_type(MODEL_TYPE_INFO),
        register_family(INFO.key, f"{__name__}:TinyDiTFamily"),
    ]

    def undo() -> None:
        for step in reversed(undos):
            step()

    return undo


def cascade_remap(t: torch.Tensor) -> torch.Tensor:
    return (t + 0.001).clamp(0.001, 1.0)


# -- the networks -----------------------------------------------------------------------------------------------------


class Attention(torch.nn.Module):
    def __init__(self, width: int, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (torch.nn.Linear(width, width) for _ in range(3))
        self.to_out = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor, context: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        b, n, w = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, -1, self.heads, w // self.heads).transpose(1, 2)

        q, k, v = split(self.to_q(x)), split(self.to_k(context)), split(self.to_v(context))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.to_out(out.transpose(1, 2).reshape(b, n, w))


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2, self.norm3 = (torch.nn.LayerNorm(width) for _ in range(3))
        self.attn1, self.attn2 = Attention(width), Attention(width)
        self.ff = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width), torch.nn.GELU(), torch.nn.Linear(2 * width, width)
        )
        self.modulation = torch.nn.Linear(width, 2 * width)

    def forward(self, x, time, text, bias):
        shift, scale = self.modulation(time)[:, None].chunk(2, dim=-1)
        h = self.norm1(x) * (1 + scale) + shift
        x = x + self.attn1(h, h)
        x = x + self.attn2(self.norm2(x), text, bias)
        return x + self.ff(self.norm3(x))


class TinyDiT(torch.nn.Module):
    """Patches in, transformer blocks with self-attention, masked cross-attention to the text and a time modulation,
    patches out; a depthwise conv on the input (grouped: LoRA must leave it alone)."""

    def __init__(self, channels: int = 4, width: int = WIDTH, text_width: int = WIDTH, depth: int = 2) -> None:
        super().__init__()
        self.channels = channels
        self.depthwise = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.patch_in = torch.nn.Linear(channels * PATCH * PATCH, width)
        self.time_embed = torch.nn.Sequential(
            torch.nn.Linear(32, width), torch.nn.SiLU(), torch.nn.Linear(width, width)
        )
        self.text_in = torch.nn.Linear(text_width, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.norm_out = torch.nn.LayerNorm(width)
        self.patch_out = torch.nn.Linear(width, channels * PATCH * PATCH)

    def forward(self, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        x = self.depthwise(x)
        tokens = x.unfold(2, PATCH, PATCH).unfold(3, PATCH, PATCH)  # b, c, h/p, w/p, p, p
        tokens = tokens.permute(0, 2, 3, 1, 4, 5).reshape(b, (h // PATCH) * (w // PATCH), c * PATCH * PATCH)
        half = torch.arange(16, device=x.device, dtype=torch.float32)
        freqs = torch.exp(-math.log(10000.0) * half / 16) * (t.float()[:, None] * 1000)
        time = self.time_embed(torch.cat([freqs.sin(), freqs.cos()], dim=-1).to(x.dtype))
        # A mask of zeros (a dropped caption) leaves a uniform attention over zero states, never NaN.
        bias = ((1.0 - mask.to(x.dtype)) * -10000.0)[:, None, None, :]
        hidden = self.patch_in(tokens)
        context = self.text_in(text)
        for block in self.blocks:
            hidden = block(hidden, time, context, bias)
        out = self.patch_out(self.norm_out(hidden)).view(b, h // PATCH, w // PATCH, c, PATCH, PATCH)
        return out.permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


class PatchAutoencoder(torch.nn.Module):
    """8x8 pixel patches to 4 latent channels and back."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Conv2d(3, 4, SCALE, stride=SCALE)
        self.decoder = torch.nn.ConvTranspose2d(4, 3, SCALE, stride=SCALE)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.encoder(pixels)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.decoder(latents).clamp(-1, 1)


def build_parts(seed: int = 0) -> tuple[dict[str, torch.nn.Module], object]:
    from transformers import T5Config, T5EncoderModel

    from onetrainer.tiny.t5_tokenizer import build_t5_tokenizer

    torch.manual_seed(seed)
    tokenizer = build_t5_tokenizer()
    tokenizer.model_max_length = TOKENS
    t5 = T5Config(
        vocab_size=len(tokenizer), d_model=WIDTH, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=0,
    )  # fmt: skip
    parts = {DIT: TinyDiT(), "text_encoder": T5EncoderModel(t5), PATCH_AUTOENCODER: PatchAutoencoder()}
    return parts, tokenizer


# -- the family -------------------------------------------------------------------------------------------------------


class TinyDiTFamily(Family):
    info = INFO
    caption_dropout = CaptionDropout.ZEROS
    sampling_parts = frozenset(INFO.parts)

    def load(self, config) -> LoadedModel:
        from safetensors.torch import load_file

        from onetrainer.families.loading import KeptParts

        built, tokenizer = build_parts()
        # The tiny model's folder, or a fine-tune this family wrote: one file of `<part>.<weight name>` tensors.
        path = Path(config.base_model_name)
        state = load_file(path / WEIGHTS_FILE if path.is_dir() else path)
        for name, module in built.items():
            module.load_state_dict({k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")})
        parts = KeptParts(config)  # each part in its configured form (cast, or quantized) as it is stored
        for name, module in built.items():
            module.requires_grad_(False)
            parts[name] = module
        t5 = parts["text_encoder"]
        slot = TextEncoderSlot("text_encoder", t5, tokenizer, "lora_te", "t5", token_embedding=t5.encoder.embed_tokens)
        schedule = ContinuousCosineSchedule(cascade_remap)
        return LoadedModel(config.model_type, parts, [slot], schedule, config.base_model_name)

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        slot = model.text_encoders[0]
        tokens = slot.tokenizer(captions, padding="max_length", max_length=TOKENS, truncation=True, return_tensors="pt")
        device = first_weight(slot.encoder).device
        mask = tokens.attention_mask.to(device)
        hidden = slot.encoder(tokens.input_ids.to(device), attention_mask=mask).last_hidden_state
        return Conditioning({"hidden_states": hidden, "attention_mask": mask})

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        vae = model.part(PATCH_AUTOENCODER)
        weight = first_weight(vae)
        return vae.encode(pixels.to(weight.device, weight.dtype))

    def batch_extras(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        # The bucket's size, as resolution-conditioned DiTs take it (unused by this tiny one, but it must arrive).
        size = [inputs.latents.shape[-2] * SCALE, inputs.latents.shape[-1] * SCALE]
        return {"resolution": torch.tensor([size] * len(inputs.latents), dtype=torch.float32)}

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        assert "resolution" in extra
        dit = model.part(DIT)
        dtype = first_weight(dit).dtype
        hidden = conditioning.hidden_states.to(dtype)
        output = dit(noisy_latents.to(dtype), timesteps, hidden, conditioning.get("attention_mask"))
        return Prediction(output)

    def sample(self, model, sample, apply_embeddings, zero_terminal_snr) -> Image.Image:
        """DDIM on the continuous schedule, with classifier-free guidance."""
        schedule = model.schedule
        dit = model.part(DIT)
        device = first_weight(dit).device
        positive = self.encode_text(model, [apply_embeddings(sample.prompt)])
        negative = self.encode_text(model, [apply_embeddings(sample.negative_prompt)])
        generator = torch.Generator().manual_seed(sample.seed)
        shape = (1, dit.channels, sample.height // SCALE, sample.width // SCALE)
        x = torch.randn(shape, generator=generator).to(device)
        times = cascade_remap(torch.linspace(1.0, 0.0, sample.diffusion_steps + 1))
        for t, t_next in itertools.pairwise(times):
            t_in = t.view(1).to(device)
            eps = self.predict(model, x, t_in, positive, {"resolution": None}).output.float()
            if sample.cfg_scale != 1.0:
                uncond = self.predict(model, x, t_in, negative, {"resolution": None}).output.float()
                eps = uncond + sample.cfg_scale * (eps - uncond)
            a, a_next = schedule.alpha_bar(t_in), schedule.alpha_bar(t_next.view(1).to(device))
            x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
            x = a_next.sqrt() * x0 + (1 - a_next).sqrt() * eps
        vae = model.part(PATCH_AUTOENCODER)
        pixels = vae.decode(x.to(first_weight(vae).dtype))[0].float().cpu()
        array = ((pixels.permute(1, 2, 0).numpy() + 1) * 127.5).round().clip(0, 255).astype(np.uint8)
        return Image.fromarray(array)

    def save_safetensors(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """Every part's weights in one file, `<part>.<weight name>` (what `load` reads back as a base model)."""
        from safetensors.torch import save_file

        state = {
            f"{name}.{k}": v.detach().to("cpu", dtype).clone()
            for name, module in model.parts.items()
            for k, v in module.state_dict().items()
            if "lora_" not in k
        }
        Path(destination).parent.mkdir(parents=True, exist_ok=True)
        save_file(state, str(destination), metadata=metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {ModelFormat.SAFETENSORS: save_safetensors}

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        prefix = "lora_unet_" if part == self.denoiser_part else "lora_te_"
        return prefix + module_path.replace(".", "_")

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return ModelKind("tiny-dit", "tiny_dit")
