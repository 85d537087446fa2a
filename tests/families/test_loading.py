"""Every part is read in the dtype it is kept in (`loading.load_dtype`), never in float32 first: from a diffusers
folder (diffusers and transformers parts), from one original file, from a transformer file; and what is read that way
is what a float32 read followed by the old cast gave, to the bit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.tiny import tiny_model_dir
from tests.helpers import loaded_model, tiny_config

PLAIN = {"weight_dtype": "BFLOAT_16"}


def config_data(variant: str, **changes) -> dict:
    return tiny_config(Path("/nonexistent"), variant, output_model_format="DIFFUSERS_LORA", **changes)


@pytest.fixture
def arriving(monkeypatch) -> dict[str, set[torch.dtype]]:
    """The dtypes of each part's weights as `cast_parts` receives them, by part: as its loading read them, before any
    cast or quantization."""
    from onetrainer.precision import quantize

    seen: dict[str, set[torch.dtype]] = {}
    quantize_part = quantize.quantize_part

    def recording(name, module, data_type, settings, filtered=False):
        seen[name] = {p.dtype for p in module.parameters() if p.is_floating_point()}
        return quantize_part(name, module, data_type, settings, filtered)

    monkeypatch.setattr(quantize, "quantize_part", recording)
    return seen


def load(variant: str, **changes):
    """The tiny model of `variant` (saved in float32) as a run loads it in BFLOAT_16: every part's weights in it but
    where `changes` say otherwise."""
    from onetrainer.config import config_from_dict
    from onetrainer.config.model_types import model_type_info

    data = config_data(variant, train_dtype="BFLOAT_16")
    parts = model_type_info(config_from_dict(data)[0].model_type).family.parts
    return loaded_model(data, **{part: PLAIN for part in parts} | changes)


def saved(variant: str, fmt: ModelFormat, path: Path) -> Path:
    """The tiny model of `variant` written in `fmt`, in float32."""
    family, model = loaded_model(config_data(variant))
    family.save(model, fmt, path, torch.float32)
    return path


@pytest.mark.parametrize("variant", ["flux-dev", "qwen-image", "cascade"])
def test_the_parts_of_a_diffusers_folder_are_read_in_their_dtype(variant, arriving):
    """diffusers parts (read in float32 unless told) and transformers encoders (read as their config says) of a folder
    saved in float32 arrive in bfloat16: the transformer or prior, the VAE, T5, CLIP, Qwen2.5-VL, the decoder, its
    VQGAN, the EfficientNet encoder."""
    _, model = load(variant)
    assert set(arriving) == set(model.parts)
    assert arriving == {part: {torch.bfloat16} for part in model.parts}


def test_a_quantized_part_is_read_in_the_training_dtype_it_is_quantized_from(arriving):
    quantized = {"transformer": {"weight_dtype": "FLOAT_8"}, "text_encoder_2": {"weight_dtype": "INT_8"}}
    load("flux-dev", **quantized, vae={"weight_dtype": "FLOAT_32"})
    assert arriving["transformer"] == arriving["text_encoder_2"] == {torch.bfloat16}  # the training dtype
    assert arriving["vae"] == {torch.float32}  # as configured


@pytest.mark.parametrize(
    ("variant", "fmt", "where"),
    [
        ("sdxl", ModelFormat.ORIGINAL_SINGLE_FILE, "base_model_name"),  # built from the bundled configs
        ("flux-dev", ModelFormat.ORIGINAL_TRANSFORMER, "transformer"),  # Black Forest Labs' layout
        ("z-image", ModelFormat.ORIGINAL_TRANSFORMER, "transformer"),  # diffusers' names, `load_transformer_part`
    ],
)
def test_the_parts_of_a_single_file_are_read_in_their_dtype(variant, fmt, where, tmp_path, arriving):
    path = saved(variant, fmt, tmp_path / "model.safetensors")
    if where == "base_model_name":
        _, model = load(variant, base_model_name=str(path))
    else:
        _, model = load(variant, **{where: {**PLAIN, "model_name": str(path)}})
    read = {part: arriving[part] for part in ({"transformer"} if where == "transformer" else model.parts)}
    assert read == {part: {torch.bfloat16} for part in read}


@pytest.mark.parametrize("dtype_name", ["BFLOAT_16", "FLOAT_16"])
@pytest.mark.parametrize("variant", ["z-image", "pixart"])
def test_a_part_read_in_its_dtype_is_a_float32_read_cast_to_it(variant, dtype_name, torch_default_threads):
    """The same weights and buffers to the bit as the model read in float32 and every part cast, as loading did
    before: the buffers a model computes itself included (Qwen3's rotary frequencies, PixArt's position table)."""
    data = config_data(variant, train_dtype=dtype_name)
    _, full = loaded_model(data)
    _, model = loaded_model(data, **{part: {"weight_dtype": dtype_name} for part in full.parts})
    dtype = getattr(torch, {"BFLOAT_16": "bfloat16", "FLOAT_16": "float16"}[dtype_name])
    for name, part in full.parts.items():
        expected = {**dict(part.to(dtype).named_parameters()), **dict(part.named_buffers())}
        ours = {**dict(model.part(name).named_parameters()), **dict(model.part(name).named_buffers())}
        assert ours.keys() == expected.keys(), name
        for key, tensor in expected.items():
            assert ours[key].dtype == tensor.dtype and torch.equal(ours[key], tensor), (name, key)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_what_the_weights_do_not_bring_stays_as_the_librarys_read_and_cast_left_it(dtype, tmp_path):
    """A Qwen3 text encoder released in bfloat16 keeps its float32 rotary frequencies when read in bfloat16 (no cast
    happened), and has them cast to float16 with the rest when read in float16; T5's `wo`, which transformers keeps in
    float32 when it reads in float16, is cast as before."""
    from transformers import AutoModel, T5EncoderModel

    from onetrainer.families.loading import read_pretrained

    released = tmp_path / "qwen3"
    shutil.copytree(tiny_model_dir("z-image") / "text_encoder", released)
    AutoModel.from_pretrained(released, dtype=torch.bfloat16).save_pretrained(released)
    for cls, folder in ((AutoModel, released), (T5EncoderModel, tiny_model_dir("flux-dev") / "text_encoder_2")):
        before = cls.from_pretrained(folder)
        if next(before.parameters()).dtype != dtype:  # the cast loading applied after the library's own read
            before.to(dtype)
        ours = read_pretrained(cls, str(folder), dtype)
        assert ours.state_dict().keys() == before.state_dict().keys()
        for (name, tensor), (_, expected) in zip(
            [*ours.named_parameters(), *ours.named_buffers()], [*before.named_parameters(), *before.named_buffers()]
        ):
            assert tensor.dtype == expected.dtype and torch.equal(tensor, expected), (cls.__name__, name)


def test_a_file_of_mixed_dtypes_gives_every_weight_the_parts_dtype(tmp_path, arriving):
    """A transformer file whose weights are stored in several dtypes (float32 and bfloat16 here) is read as stored and
    cast weight by weight: the old cast looked at the first weight only and, finding it in bfloat16 already, left the
    float32 ones as they were."""
    from safetensors.torch import load_file, save_file

    path = saved("flux-dev", ModelFormat.ORIGINAL_TRANSFORMER, tmp_path / "model.safetensors")
    state = load_file(str(path))
    save_file({k: v if i % 2 else v.to(torch.bfloat16) for i, (k, v) in enumerate(sorted(state.items()))}, str(path))
    _, model = load("flux-dev", transformer={**PLAIN, "model_name": str(path)})
    assert arriving["transformer"] == {torch.bfloat16}
    assert {p.dtype for p in model.part("transformer").parameters()} == {torch.bfloat16}


FLOAT8_PARTS = ("transformer", "unet", "prior", "text_encoder", "text_encoder_2", "text_encoder_3")


def tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A module's parameters and buffers, float8 ones as their bytes (which `torch.equal` compares on a CPU)."""
    named = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return {name: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for name, t in named.items()}


@pytest.mark.parametrize(
    ("variant", "transformer_file"),
    [
        ("sd15", False),
        ("sdxl", False),
        ("pixart", False),
        ("sd3", False),
        ("flux-dev", False),
        ("flux-dev", True),  # the transformer from Black Forest Labs' file (`assign_weights`), the rest from the base
        ("chroma", False),
        ("z-image", False),  # its transformer keeps its timestep embedder unquantized (`KEEP_UNQUANTIZED`)
        ("qwen-image", False),
        ("wuerstchen", False),
    ],
)
def test_each_part_is_quantized_before_the_next_is_read(variant, transformer_file, tmp_path, monkeypatch):
    """Loading's host RAM peak is the parts read so far as they are kept plus the part being read: each part is put in
    its form (here FLOAT_8, read in bfloat16) as soon as it is read, before the next part's read begins
    (`loading.KeptParts`), not once every part is in (a Flux transformer was 22 GiB in bfloat16 beside T5 then). The
    parts are read in their family's declared order, which the estimate counts the load by, and are quantized to the
    bit as when every part was read first."""
    from onetrainer.config import config_from_dict
    from onetrainer.config.model_types import model_type_info
    from onetrainer.families import loading
    from tests.helpers import quantize_as_configured

    file = {}
    if transformer_file:
        file = {"model_name": str(saved(variant, ModelFormat.ORIGINAL_TRANSFORMER, tmp_path / "model.safetensors"))}
    declared = model_type_info(config_from_dict(config_data(variant))[0].model_type).family.parts
    float8 = {part: {"weight_dtype": "FLOAT_8"} for part in declared if part in FLOAT8_PARTS}
    if file:
        float8["transformer"] |= file
    read: list[torch.nn.Module] = []  # every module read, in order
    unquantized: list[list[torch.nn.Module]] = []  # at each read's start, the earlier modules with no float8 weight
    read_pretrained, checked_load = loading.read_pretrained, loading.checked_load

    def starting() -> None:
        unquantized.append([m for m in read if all(p.dtype != torch.float8_e4m3fn for p in m.parameters())])

    def reading(cls, where, dtype, **options):  # a diffusers or transformers folder (`load_diffusers_component`)
        starting()
        read.append(read_pretrained(cls, where, dtype, **options))
        return read[-1]

    def assigning(module, state, what, assign=False):  # a file's tensors (`assign_weights`)
        starting()
        checked_load(module, state, what, assign)
        read.append(module)

    with monkeypatch.context() as patches:
        patches.setattr(loading, "read_pretrained", reading)
        patches.setattr(loading, "checked_load", assigning)
        _, model = load(variant, **float8)
    names = {id(module): name for name, module in model.parts.items()}
    quantized = {id(model.part(part)) for part in float8}
    assert [[names[id(m)] for m in earlier if id(m) in quantized] for earlier in unquantized] == [[]] * len(read)
    order = [names[id(m)] for m in read if id(m) in names]
    assert order == [part for part in declared if part in order]

    # every part read in bfloat16 first, then quantized, as loading did before
    _, before = load(variant, **({"transformer": {**PLAIN, **file}} if file else {}))
    config = config_from_dict(config_data(variant, train_dtype="BFLOAT_16") | float8)[0]
    for part in float8:
        assert quantize_as_configured(part, before.part(part), config, filtered=part == declared[0])
    for name, part in model.parts.items():
        ours, expected = tensors(part), tensors(before.part(name))
        assert ours.keys() == expected.keys(), name
        assert all(ours[k].dtype == t.dtype and torch.equal(ours[k], t) for k, t in expected.items()), name
