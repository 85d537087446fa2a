"""The contract every model family implements: exactly what the loop, the methods, the cache, the sampler and the
savers call, with the data they exchange. `families/README.md` says who calls what in which order and the tensor
conventions.

A family is declarative facts (`FamilyInfo` from `onetrainer.config.model_types`: its parts with their roles and
labels; caption dropout) plus the calls of `Family`: load (with the noise schedule), encode_text, drop_captions,
encode_images, cache_extras, batch_extras, predict, sample, lora_targets, kohya_name, metadata_kind, save,
save_backup / backup_state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from PIL import Image
from torch.nn.utils.rnn import pad_sequence

from onetrainer.config.enums import ModelFormat, ModelType

# PartRole is the config's vocabulary (the GUI reads it without torch); the families import it from here too.
from onetrainer.config.model_types import FamilyInfo, ModelTypeInfo, PartRole, SampleDefaults, model_type_info
from onetrainer.config.sample_config import SampleConfig
from onetrainer.noise.prediction import Prediction, PredictionType
from onetrainer.noise.schedule import NoiseSchedule
from onetrainer.util.part_dtypes import compute_weight

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.weights.metadata import ModelKind


@dataclass
class TextEncoderSlot:
    """One text encoder with its tokenizer, as the methods see it."""

    part: str  # "text_encoder", "text_encoder_2"
    encoder: torch.nn.Module
    tokenizer: Any
    kohya_prefix: str  # "lora_te", "lora_te1", …
    embedding_key: str  # the tensor name in embedding files: "emb_params", "clip_l", "clip_g"
    layer_skip: int = 0  # clip skip: the family fills it from the part's config (`ModelPartConfig.layer_skip`)
    # How many tokens captions are padded and cut to, where the config sets it (`text_encoder_N_sequence_length`);
    # None: the family's own length. Part of the text cache's key, as the clip skip is.
    max_tokens: int | None = None
    # The embedding module the encoder's forward looks token ids up in, where it is not `get_input_embeddings()`
    # (transformers' T5EncoderModel: `encoder.embed_tokens`, a module of its own that shares the weight).
    token_embedding: torch.nn.Embedding | None = None


@dataclass(slots=True)
class FamilyState:
    """A family's own state on its loaded model (`LoadedModel.state`): what `load` learns besides the parts and the
    schedule and the family's methods read back (Flux's guidance and schedule length, PixArt's caption length, SD's
    kept tensors). A family that keeps any declares a subclass, a slotted dataclass whose fields carry their defaults
    (the one place they are written), and reads it with `model.family_state(ItsState)`; a field it does not declare
    cannot be set. Nothing of it is saved: `load` derives it again, from a backup too."""


State = TypeVar("State", bound=FamilyState)


@dataclass
class LoadedModel:
    """A loaded model: its parts by name, its text encoders and its noise schedule (which carries the prediction
    type: `v_prediction` is derived from it), and the family's own state (`family_state`)."""

    model_type: ModelType
    parts: dict[str, torch.nn.Module]
    text_encoders: list[TextEncoderSlot]
    schedule: NoiseSchedule  # the training noise process (created by the family)
    source: str
    state: FamilyState | None = None  # the family's own state, of the `FamilyState` subclass it declares

    def __post_init__(self) -> None:
        # A plain dict: a part stored later is kept as it is given, not put in its form as loading's `KeptParts` does.
        self.parts = dict(self.parts)

    def family_state(self, kind: type[State]) -> State:
        """The family's state, typed: a model made without one (the memory estimate's stand-in, a test's) gets
        `kind`'s defaults, kept; a state of another class is a TypeError (another family's model)."""
        if self.state is None:
            self.state = kind()
        if not isinstance(self.state, kind):
            raise TypeError(f"this model holds {type(self.state).__name__}, not {kind.__name__}")
        return self.state

    @property
    def v_prediction(self) -> bool:
        return self.schedule.prediction is PredictionType.V

    @property
    def type_info(self) -> ModelTypeInfo:
        """The model type's facts (resolution, inpainting, its family's `FamilyInfo`)."""
        return model_type_info(self.model_type)

    def part(self, name: str) -> torch.nn.Module:
        return self.parts[name]


class CaptionDropout(Enum):
    """How a family trains without its caption (caption dropout): encode the empty caption, or zero every tensor of
    the conditioning (the attention mask included)."""

    EMPTY_CAPTION = "empty_caption"
    ZEROS = "zeros"


@dataclass
class Conditioning:
    """What the denoiser is conditioned on for a batch of captions: named tensors, each [B, ...] with one row per
    caption (e.g. "hidden_states" [B, L, D], "pooled" [B, D], "attention_mask" [B, L]). The text cache stores and
    stacks every tensor of it, so a family may add any it needs."""

    tensors: dict[str, torch.Tensor]

    @property
    def hidden_states(self) -> torch.Tensor:
        return self.tensors["hidden_states"]

    @property
    def pooled(self) -> torch.Tensor | None:
        return self.tensors.get("pooled")

    def get(self, name: str) -> torch.Tensor | None:
        return self.tensors.get(name)

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def row(self, index: int) -> dict[str, torch.Tensor]:
        """One caption's tensors (float32 on the CPU for floating ones), as the text cache stores them."""
        return {k: (v[index].float() if v.is_floating_point() else v[index]).cpu() for k, v in self.tensors.items()}

    def row_of_its_tokens(self, index: int, names: tuple[str, ...] = ("hidden_states", "attention_mask")) -> dict:
        """`row(index)` with the tensors of `names` (each [L, ...] in the row, as the "attention_mask") cut after the
        caption's last attended token (one kept at least): the padding, for a family whose denoiser never sees it.
        `stack` pads such rows again, with masked zeros, to the longest of a batch."""
        row = self.row(index)
        attended = row["attention_mask"].nonzero()
        length = int(attended[-1, 0]) + 1 if len(attended) else 1
        return {k: v[:length] if k in names else v for k, v in row.items()}

    @classmethod
    def stack(cls, rows: list[dict[str, torch.Tensor]], device) -> Conditioning:
        """Rows into a batch; rows of different lengths (an "attention_mask" tells their tokens) are padded with
        masked zeros to the longest."""
        out = {}
        for name in rows[0]:
            values = [r[name] for r in rows]
            if "attention_mask" in rows[0] and len({v.shape for v in values}) > 1:
                out[name] = pad_sequence(values, batch_first=True).to(device)  # zeros after each row
            else:
                out[name] = torch.stack(values).to(device)
        return cls(out)

    def zeroed(self, drop: torch.Tensor) -> Conditioning:
        """The rows where `drop` ([B] bool) is true set to zero (caption dropout by zeros)."""
        out = {}
        for name, value in self.tensors.items():
            keep = (~drop).to(value.device).view(-1, *([1] * (value.dim() - 1)))
            out[name] = value * keep.to(value.dtype)
        return Conditioning(out)


@dataclass
class BatchInputs:
    """What a family may use to build a batch's extra denoiser inputs (all on the training device)."""

    latents: torch.Tensor  # [B, C, h, w], the clean latents
    pixels: torch.Tensor | None  # [B, 3, H, W] in [-1, 1]; None when the latents come from the cache
    original_sizes: list[tuple[int, int]]  # (height, width) of each image before scaling
    crop_offsets: list[tuple[int, int]]  # (top, left) of the crop in the scaled image
    input_masks: torch.Tensor | None  # inpainting models: [B, 1, H, W], 1 = paint; all ones for unmasked samples
    keep_unmasked: torch.Tensor  # [B] bool: samples trained as if they had no mask
    cached: dict[str, torch.Tensor] = field(default_factory=dict)  # the `cache_extras` of the batch, stacked
    # a family with `info.reference_images`: each sample's reference images, [3, h, w] in [-1, 1] on the device
    references: list[list[torch.Tensor]] | None = None
    # a model type with a depth input, the latents not cached: each sample's depth map file [1, H, W] on the device,
    # moved as its image (None where it has none)
    depths: list[torch.Tensor | None] | None = None


# A fine-tune writer: a family's method, called as `writer(family, model, destination, dtype, metadata)` (`metadata`:
# extra header entries of a single file).
Writer = Callable[["Family", LoadedModel, Path, torch.dtype, "dict | None"], None]


@dataclass(frozen=True)
class LoraFile:
    """One file of a LoRA output (`Family.lora_output_files`): where it goes and {part: the name the part's adapters
    go by in it}."""

    path: Path
    parts: dict[str, str]


class _PartRolesOfInfo:
    """`Family.part_roles`: the roles the family's `info` declares, read on the class as on an instance."""

    def __get__(self, instance: Family | None, owner: type[Family]) -> dict[str, PartRole]:
        return owner.info.part_roles


class Family(ABC):
    """One model family: what the loop, the methods, the cache, the sampler and the savers call.

    Declarations: `info` (parts with their roles and labels, bucket step, methods, formats, layer presets),
    `sampling_parts` (placement), `caption_dropout`. See `families/README.md` for who calls what in which order.
    """

    info: FamilyInfo
    caption_dropout: CaptionDropout = CaptionDropout.EMPTY_CAPTION
    # Every part of `info.parts` with its role: `info.part_roles`, the one declaration (placement, caches, config).
    part_roles = _PartRolesOfInfo()
    sampling_parts: ClassVar[frozenset[str]]  # the parts `sample` runs
    # What a sample that decodes to black or NaN usually needs, in the family's own field names.
    broken_sample_advice: ClassVar[str] = "set the VAE's weight data type (vae.weight_dtype) to FLOAT_32 or BFLOAT_16"
    # Text-encoder modules that get a LoRA: every linear layer inside a transformer block (CLIP's
    # `encoder.layers.N.`, T5's `encoder.block.N.`), as kohya trains them.
    text_encoder_blocks: ClassVar[str] = r"(^|\.)(layers|block)\.\d+\."
    # The blocks layer offloading moves, {part: module paths of ModuleLists in execution order}, for the parts the
    # family declares `LAYER_OFFLOADING` for (`FamilyInfo.part_capabilities`); the denoiser's are also those
    # MODEL_SPLIT spreads over devices and SHARDED shards one by one.
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {}
    # ComfyUI's prefix of each part's modules, for a family offering COMFY_LORA (`weights/comfy_lora.py`).
    comfy_prefixes: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Roles are declared once, in the FamilyInfo that the config and the GUI read too.
        if "part_roles" in cls.__dict__:
            raise TypeError(f"{cls.__name__} declares part_roles: declare them in its FamilyInfo.part_roles")

    @property
    def denoiser_part(self) -> str:
        """The trained network: the first of `info.parts`."""
        return self.info.parts[0]

    @property
    def denoiser_parts(self) -> tuple[str, ...]:
        """Every part of the `DENOISER` role, the first `denoiser_part`: a family with several denoisers (Wan 2.2's
        two experts, each running on its own range of noise levels) trains any of them (each part's `train`)."""
        roles = self.part_roles
        return tuple(p for p in self.info.parts if roles[p] is PartRole.DENOISER) or (self.denoiser_part,)

    def idle_parts(self, model: LoadedModel) -> frozenset[str]:
        """The non-`SAMPLING` parts that no training step of this run runs (a denoiser whose noise levels the run's
        noising range leaves out): they wait in host memory as sampling parts do and join the others on the device
        for samples. Default: none."""
        return frozenset()

    def lora_output_files(self, model: LoadedModel, destination: Path, parts: Sequence[str]) -> list[LoraFile]:
        """The files a LoRA output of `parts` is written as: each its path, the parts it holds and the name each of
        them goes by in it (`diffusers_lora`'s prefix, the part the kohya / ComfyUI names are made for). Default:
        one file at `destination` holding every part under its own name; Wan 2.2 writes one file per trained expert
        (as ComfyUI and diffusers load one per expert)."""
        return [LoraFile(destination, {part: part for part in parts})]

    def lora_file_part(self, model: LoadedModel, part: str) -> str:
        """The part whose names `part`'s adapters go by in a LoRA file it alone of its kind is in (a LoRA file read
        back as `lora_model_name`; Wan 2.2's low-noise expert is the `transformer` of its file). Default: itself."""
        return part

    # -- loading (Trainer.run, scripts/sample.py) -----------------------------------------------------------------

    @abstractmethod
    def load(self, config: TrainConfig) -> LoadedModel:
        """Load the base model of `config` (a diffusers folder, a single file, a hub id or one of our backups), each
        part in its configured weight dtype, on the CPU; with its noise schedule."""

    # -- encoders (the caching pass, and every step whose inputs are not cached) ----------------------------------

    @abstractmethod
    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """Tokenize the captions and run the text encoders (with their clip skip): one row per caption."""

    def text_cache_row(self, conditioning: Conditioning, index: int) -> dict[str, torch.Tensor]:
        """What the text cache keeps of caption `index` of `encode_text`'s conditioning: by default its whole row."""
        return conditioning.row(index)

    def drop_captions(
        self,
        model: LoadedModel,
        captions: list[str],
        drops: Sequence[torch.Tensor | None],
        encode: Callable[[list[str]], Conditioning],
    ) -> Conditioning:
        """The batch's conditioning under caption dropout. `drops` holds one [B] bool mask per text encoder, in
        `model.text_encoders` order (None: that encoder drops nothing); `encode` gives the conditioning of captions
        (from the text cache, or `encode_text`). What a dropped row holds is `caption_dropout`'s: the empty caption's
        conditioning, or zeros.

        The default treats the conditioning as one whole: a row is dropped where any encoder drops it (with one text
        encoder, exactly that encoder's mask). A family whose conditioning keeps its encoders' outputs apart drops
        each encoder's share on its own (SDXL)."""
        dropped = any_dropped(drops)
        if self.caption_dropout is CaptionDropout.EMPTY_CAPTION:
            # the empty caption in the batch itself, so the text cache's "" entry (or the encoder) gives its rows
            return encode(["" if d else c for c, d in zip(captions, dropped.tolist())])
        return encode(captions).zeroed(dropped)

    def dropped_conditioning(
        self, conditioning: Conditioning, encode: Callable[[list[str]], Conditioning]
    ) -> Conditioning:
        """What every row of `conditioning` holds once dropped, by `caption_dropout`: the empty caption's
        conditioning (broadcast to the batch) or zeros. For `drop_captions` overrides that mix it in per encoder."""
        if self.caption_dropout is CaptionDropout.ZEROS:
            return Conditioning({k: torch.zeros_like(v) for k, v in conditioning.tensors.items()})
        empty = encode([""])
        return Conditioning({k: empty.tensors[k].expand_as(v) for k, v in conditioning.tensors.items()})

    @abstractmethod
    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels [B, 3, H, W] in [-1, 1] → latents [B, C, h, w] as the denoiser takes them (scaled)."""

    def cache_extras(
        self, model: LoadedModel, pixels: torch.Tensor, masks: torch.Tensor | None, depths: list | None = None
    ) -> dict:
        """Per-sample tensors to cache with the latents of `pixels` ([B, 3, H, W] in [-1, 1]; `masks` [B, 1, H, W]
        in [0, 1] when the run uses masks; `depths`, for a model type with a depth input, each sample's depth map file
        [1, H, W] moved as its image, or None where it has none): each value [B, ...]. They come back in
        `BatchInputs.cached`."""
        return {}

    def encode_references(self, model: LoadedModel, references: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """A family with `info.reference_images`: tensors of one sample's reference images ([3, h, w] in [-1, 1]) to
        cache with its latents (e.g. their latents); they come back in `BatchInputs.cached`, stacked."""
        return {}

    def typical_references(self, model: LoadedModel) -> dict[str, torch.Tensor]:
        """The memory estimate's stand-in for one sample's cached references, as `encode_references` gives them for one
        reference at the size the family resizes it to, with a batch dimension ({}: the family takes none)."""
        return {}

    # -- a training step ------------------------------------------------------------------------------------------

    def batch_extras(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        """Per-batch denoiser inputs beyond latents, time and text (SDXL's size and crop ids, the inpainting mask and
        masked image); they reach `predict` as its `extra` mapping."""
        return {}

    @abstractmethod
    def predict(
        self,
        model: LoadedModel,
        noisy_latents: torch.Tensor,
        timesteps: torch.Tensor,
        conditioning: Conditioning,
        extra: dict[str, torch.Tensor],
    ) -> Prediction:
        """The denoiser's prediction (plus any learned-variance channels and family loss terms) for `noisy_latents` at
        `timesteps` (the schedule's `model_time`); `extra` is `batch_extras`' mapping."""

    # -- sampling -------------------------------------------------------------------------------------------------

    @abstractmethod
    def sample(
        self,
        model: LoadedModel,
        sample: SampleConfig,
        apply_embeddings: Callable[[str], str],
        zero_terminal_snr: bool,
    ) -> Image.Image:
        """Render one sample (prompt, size, steps, CFG, sampler, seed) with the live modules, in one or several
        stages. Called under `torch.no_grad()` with every part in eval mode and the sampling parts on the device;
        `apply_embeddings` turns placeholders into the embedding tokens."""

    def sample_defaults(self, model: LoadedModel) -> SampleDefaults:
        """The size, steps, guidance and sampler a sample gets when nothing sets them (`scripts/sample.py --prompt`):
        the model type's, unless the loaded checkpoint asks for others (a few-step distilled model)."""
        return model.type_info.sample

    # -- sampling through one diffusers pipeline (`sampling/sampler.render_pipeline`) --------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        """The diffusers pipeline over the live modules, with `sampler` as its scheduler: for families whose `sample`
        calls `render_pipeline`."""
        raise NotImplementedError(f"{type(self).__name__} does not sample through one diffusers pipeline")

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """The pipeline call's prompt arguments for a sample: the texts, or embeddings a family computes itself (e.g.
        with a clip skip per text encoder, which the pipeline cannot express)."""
        return {"prompt": prompt, "negative_prompt": negative_prompt}

    def sample_prompt_arguments(
        self, model: LoadedModel, prompt: str, negative_prompt: str | None, arguments: dict
    ) -> dict:
        """`prompt_arguments` for a sample whose other pipeline arguments are `arguments` (a family whose prompt
        encoding reads them, as an edit model's reads the reference images, overrides this)."""
        return self.prompt_arguments(model, prompt, negative_prompt)

    def pipeline_arguments(self, model: LoadedModel, sample: SampleConfig, zero_terminal_snr: bool) -> dict:
        """The family's own arguments of the pipeline call beyond size, steps, guidance and prompts (SD's guidance
        rescale under zero terminal SNR, an inpainting model's image and mask)."""
        return {}

    # -- methods: LoRA targets and names --------------------------------------------------------------------------

    def lora_targets(self, model: LoadedModel, part: str, patterns: list[str], regex: bool) -> list[str]:
        """The module names of `part` that get a LoRA. The denoiser: its linear and (ungrouped) conv layers that the
        layer filter (`patterns`) selects; peft cannot put a rank-r LoRA on a grouped or depthwise conv. A text
        encoder: every linear layer of its transformer blocks (`text_encoder_blocks`)."""
        import re

        from onetrainer.util.layer_filter import name_matches

        module = model.part(part)
        if part in self.denoiser_parts:
            return [
                n
                for n, m in module.named_modules()
                if (isinstance(m, torch.nn.Linear) or (isinstance(m, torch.nn.Conv2d) and m.groups == 1))
                and name_matches(n, patterns, regex)
            ]
        blocks = re.compile(self.text_encoder_blocks)
        return [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear) and blocks.search(n)]

    def conv_input_sizes(self, model: LoadedModel, part: str, height: int, width: int) -> dict[str, tuple[int, int]]:
        """The (height, width) of the input each Conv2d of `part` gets when the model trains on `height` × `width`
        pixel images, by module name. Adapters that unfold a convolution's input without padding (OFT v2) cannot
        take a layer whose input is smaller than its kernel. Empty where the family's convolutions always fit (the
        default: only the UNets' deepest levels get that small)."""
        return {}

    def lora_file_state(
        self,
        model: LoadedModel,
        part: str,
        kind: str,
        state: dict[str, torch.Tensor],
        alphas: dict,
        ranks: dict,
        fmt: ModelFormat = ModelFormat.KOHYA_LORA,
    ) -> dict[str, torch.Tensor] | None:
        """A family's own kohya / LyCORIS layout for one part's adapter state (peft names), e.g. adapters on separate
        projections written as one LoRA on the fused layer of the original checkpoint; None: the generic layout
        (`weights/lycoris_keys.to_kohya` over `lora_file_name`). `fmt`: the file's format (KOHYA_LORA, LEGACY_LORA or
        COMFY_LORA), for a family whose own layout names modules differently in them."""
        return None

    def read_lora_file(self, model: LoadedModel, part: str, kind: str, state: dict[str, torch.Tensor]):
        """The inverse of `lora_file_state` for a kohya file: (peft weights, alphas, ranks, LoKr structure, the file
        keys used) for `part`, or None for the generic reading."""
        return None

    def kohya_named_lora(self, model: LoadedModel, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A LoRA file whose module names are not kohya's renamed to the kohya names `lora_file_name` gives, so the
        generic reading takes it: a COMFY_LORA file's dotted names (`comfy_prefixes`); default: other files as they
        are."""
        from onetrainer.weights import comfy_lora

        prefixes = tuple(self.comfy_prefixes.values())
        if not prefixes or not any(key.startswith(prefixes) for key in state):
            return state
        names = {
            self.lora_file_name(model, part, module, ModelFormat.COMFY_LORA): self.kohya_name(model, part, module)
            for part in self.comfy_prefixes
            if part in model.parts
            for module, _ in model.part(part).named_modules()
        }
        return comfy_lora.kohya_names(state, names)

    @abstractmethod
    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        """The kohya LoRA module name of a module of `part` (`lora_unet_…`, `lora_te_…`)."""

    def lora_file_name(self, model: LoadedModel, part: str, module_path: str, fmt: ModelFormat) -> str:
        """The module's name in a LoRA file of format `fmt` (KOHYA_LORA, LEGACY_LORA or COMFY_LORA); default: the kohya
        name, and for COMFY_LORA the module's path in ComfyUI's model under the part's `comfy_prefixes` entry
        (`comfy_module_path`). A family whose legacy layout has other names (Stable Cascade's `lora_prior_unet_…`)
        overrides this."""
        if fmt is ModelFormat.COMFY_LORA and part in self.comfy_prefixes:
            return self.comfy_prefixes[part] + self.comfy_module_path(part, module_path)
        return self.kohya_name(model, part, module_path)

    def comfy_module_path(self, part: str, module_path: str) -> str:
        """A module's path in ComfyUI's model of the part, for COMFY_LORA; default: ours (diffusers' names)."""
        return module_path

    @abstractmethod
    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        """What file metadata says the model is (`modelspec.architecture`, `ss_base_model_version`, …)."""

    # -- savers ---------------------------------------------------------------------------------------------------

    # The fine-tune output formats and the method that writes each (`Writer`), the function itself: a format without a
    # writer is found by the contract test, not at save time. A subclass that overrides a writer declares the table
    # again (the contract test checks that every writer is the one the class has under its name).
    writers: ClassVar[Mapping[ModelFormat, Writer]] = {}

    def save(
        self, model: LoadedModel, fmt: ModelFormat, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """Write the whole model (fine-tune result) in `fmt` at `destination`; `metadata` joins a single file's
        header. Default: the format's writer in `writers`; any other format is refused in one message."""
        from onetrainer.families.saving import save_in_format

        save_in_format(self, self.writers, model, fmt, destination, dtype, metadata)

    def save_backup(self, model: LoadedModel, folder: Path) -> None:
        """The whole model into a fine-tune backup's `folder` (float32); default: one safetensors file per part."""
        from safetensors.torch import save_file

        for name, module in model.parts.items():
            (folder / name).mkdir(parents=True, exist_ok=True)
            # clone: tied weights (T5's shared token table) must not share memory in a safetensors file
            state = {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}
            save_file(state, str(folder / name / "model.safetensors"))

    def backup_state(self, model: LoadedModel, folder: Path, part: str) -> dict[str, torch.Tensor]:
        """The weights of `part` from a backup that `save_backup` wrote, named as the module's own state dict."""
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for file in sorted((folder / part).glob("*.safetensors")):
            state.update(load_file(str(file)))
        return state


def any_dropped(drops: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """[B] bool: the rows that at least one encoder drops (`drops` as `Family.drop_captions` takes them)."""
    masks = [d for d in drops if d is not None]
    if not masks:
        raise ValueError("caption dropout without any encoder's drop mask")
    out = masks[0]
    for mask in masks[1:]:
        out = out | mask
    return out


def first_weight(module: torch.nn.Module) -> torch.Tensor:
    """The module's first weight in its compute dtype, whose dtype and device are the module's own (a base weight:
    adapters come after it). diffusers' `.dtype` / `.device` walk every submodule, which costs milliseconds per call on
    a UNet."""
    return compute_weight(module)
