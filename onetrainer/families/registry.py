"""The built-in model families: the class that implements each, as an import path, and where each family module's
declaration stands. It imports nothing, so reading it costs no torch, and the model-type table below the families
(`config/model_types.py`) can read it (docs/architecture.md, "Layers").

Every family module `<module>.py` has its declaration beside it, `<module>_info.py`: torch-free, written in the
config's vocabulary (`config/family_info.py`), it declares the module's model types (`MODEL_TYPES`, each with its
`FamilyInfo`: parts, roles, formats, capabilities, layer presets, notes, hub file sets, sample defaults). Adding a
family is its module, its declaration, one line here and its presets.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# family key → "package.module:Class"; two families of one module share its declaration.
BUILT_IN_FAMILIES: Mapping[str, str] = MappingProxyType(
    {
        "sd": "onetrainer.families.sd:StableDiffusionFamily",
        "sdxl": "onetrainer.families.sdxl:StableDiffusionXLFamily",
        "pixart": "onetrainer.families.pixart:PixArtFamily",
        "sd3": "onetrainer.families.sd3:StableDiffusion3Family",
        "flux": "onetrainer.families.flux:FluxFamily",
        "flux_kontext": "onetrainer.families.flux:FluxKontextFamily",
        "chroma": "onetrainer.families.flux:ChromaFamily",
        "flux2": "onetrainer.families.flux2:Flux2Family",
        "qwen": "onetrainer.families.qwen:QwenImageFamily",
        "qwen_edit": "onetrainer.families.qwen:QwenImageEditFamily",
        "zimage": "onetrainer.families.zimage:ZImageFamily",
        "sana": "onetrainer.families.sana:SanaFamily",
        "ernie": "onetrainer.families.ernie:ErnieFamily",
        "krea2": "onetrainer.families.krea2:Krea2Family",
        "anima": "onetrainer.families.anima:AnimaFamily",
        "lumina2": "onetrainer.families.lumina2:Lumina2Family",
        "ideogram4": "onetrainer.families.ideogram4:Ideogram4Family",
        "hidream": "onetrainer.families.hidream:HiDreamFamily",
        "wan": "onetrainer.families.wan:WanFamily",
        "wan22": "onetrainer.families.wan:Wan22Family",
        "hunyuan_video": "onetrainer.families.hunyuan_video:HunyuanVideoFamily",
        "wan_i2v": "onetrainer.families.wan_i2v:WanI2VFamily",
        "hunyuan_video15": "onetrainer.families.hunyuan_video15:HunyuanVideo15Family",
        "wuerstchen": "onetrainer.families.wuerstchen:WuerstchenFamily",
        "cascade": "onetrainer.families.wuerstchen:CascadeFamily",
    }
)
# The trainable families now: the built-in ones and those registered at runtime (`families.register_family`).
FAMILY_CLASSES: dict[str, str] = dict(BUILT_IN_FAMILIES)
DECLARATION_SUFFIX = "_info"


def declaration_module(target: str) -> str:
    """The declaration beside a family class's module: "package.module:Class" → "package.module_info"."""
    return target.partition(":")[0] + DECLARATION_SUFFIX


def declaration_modules() -> tuple[str, ...]:
    """The built-in families' declaration modules, each once, in the registry's order."""
    return tuple(dict.fromkeys(declaration_module(target) for target in BUILT_IN_FAMILIES.values()))
