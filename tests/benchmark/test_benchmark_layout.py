"""The benchmarks' shared files name no families (issue 43): what differs per family is in that family's own file, a
hook the one driver runs, and the parts are found from the family registry and runtime registrations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

BENCHMARK = ROOT / "onetrainer" / "benchmark"
# One pattern per family, as its names are written in code, comments and help texts.
FAMILY_PATTERNS = {
    "sd": r"stable[_ ]?diffusion(?![_ ]?(3|xl))|\bsd[ _-]?(1\.?5|2(\.?[01])?)\b",
    "sdxl": r"sdxl|stable[_ ]?diffusion[_ ]?xl",
    "pixart": r"pixart",
    "sd3": r"\bsd[_ ]?3|stable[_ ]?diffusion[_ ]?3",
    "flux": r"flux",
    # ("chroma" alone is also the colour term: the family's names are matched.)
    "chroma": r"chroma_?1|chroma(pipeline|transformer|family)",
    "qwen": r"qwen",
    "zimage": r"\bz[_-]?image",
    "sana": r"\bsana\b",
    "krea2": r"krea[ _-]?2",
    "anima": r"(?<![a-z])anima(?![a-z])",
    "lumina2": r"lumina",
    "ideogram4": r"ideogram",
    "wuerstchen": r"wuerstchen|würstchen",
    "cascade": r"cascade",
}
MOST_FAMILIES_IN_A_SHARED_FILE = 2


def _family_prefixes() -> set[str]:
    from onetrainer.families.registry import BUILT_IN_FAMILIES

    modules = {target.partition(":")[0].rpartition(".")[2] for target in BUILT_IN_FAMILIES.values()}
    return set(BUILT_IN_FAMILIES) | modules


def families_named(text: str) -> set[str]:
    return {family for family, pattern in FAMILY_PATTERNS.items() if re.search(pattern, text, re.IGNORECASE)}


def shared_files_naming_families(folder: Path) -> list[str]:
    """Each file of `folder` that belongs to no family (its stem starts with no family key or module name) and names
    more families than a shared file may, with the families it names."""
    prefixes = _family_prefixes()
    found = []
    for path in sorted(folder.glob("*.py")):
        if any(path.stem == p or path.stem.startswith(p + "_") for p in prefixes):
            continue
        named = families_named(path.read_text(encoding="utf-8"))
        if len(named) > MOST_FAMILIES_IN_A_SHARED_FILE:
            found.append(f"{path.name}: {', '.join(sorted(named))}")
    return found


def test_no_shared_benchmark_file_names_three_families():
    assert not shared_files_naming_families(BENCHMARK)


def test_the_check_finds_a_shared_file_that_names_three_families(tmp_path):
    (tmp_path / "driver.py").write_text('PARTS = ("PixArt", "FLUX.1-dev", "SDXL")\n', encoding="utf-8")
    (tmp_path / "two.py").write_text('"""tiny FLUX.1-dev and an SDXL-size UNet"""\n', encoding="utf-8")
    (tmp_path / "flux_gpu.py").write_text("# Flux, not PixArt nor SDXL nor Qwen\n", encoding="utf-8")
    (tmp_path / "chromatic.py").write_text("# chroma, hue, flux, sdxl\n", encoding="utf-8")
    assert shared_files_naming_families(tmp_path) == ["driver.py: flux, pixart, sdxl"]


def test_each_familys_overhead_module_is_a_part_found_from_the_registry():
    from onetrainer.benchmark.cli import build_parser, part_names
    from onetrainer.benchmark.family_overhead import family_overheads
    from onetrainer.families.registry import BUILT_IN_FAMILIES

    modules = {p.stem.removesuffix("_overhead") for p in BENCHMARK.glob("*_overhead.py")} - {"family"}
    hooks = family_overheads()
    # A family added since brings its own `<key>_overhead.py`, found the same way.
    assert modules <= set(BUILT_IN_FAMILIES) and set(hooks) == modules >= {"pixart", "cascade", "flux", "sd3", "qwen"}
    choices = next(a.choices for a in build_parser()._actions if a.dest == "part")
    assert set(hooks) <= set(choices) and set(part_names()) <= set(choices)


class TinySDBareLoop:
    """A bare loop written against the hook's shape alone (tiny SD 1.5: a UNet on the DDPM schedule)."""

    def __init__(self, config, device: torch.device) -> None:
        from diffusers import DDPMScheduler, StableDiffusionPipeline
        from peft import LoraConfig, inject_adapter_in_model

        from onetrainer.benchmark.overhead import lora_targets
        from onetrainer.tiny.source import resolve_local

        self.device = device
        model_dir = str(resolve_local(config.base_model_name))
        pipe = StableDiffusionPipeline.from_pretrained(model_dir, local_files_only=True, safety_checker=None)
        self.unet, self.vae, self.text_encoder, self.tokenizer = pipe.unet, pipe.vae, pipe.text_encoder, pipe.tokenizer
        self.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
        for module in (self.unet, self.vae, self.text_encoder):
            module.requires_grad_(False).to(device)
        targets = lora_targets(self.unet, config)
        lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=targets)
        inject_adapter_in_model(lora, self.unet)
        self.params = [p for p in self.unet.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate)

    def encode_image(self, pixels):
        return self.vae.encode(pixels[None]).latent_dist.mode()[0] * self.vae.config.scaling_factor

    def encode_caption(self, caption):
        tokens = self.tokenizer([caption], padding="max_length", max_length=77, truncation=True, return_tensors="pt")
        return self.text_encoder(tokens.input_ids.to(self.device))[0][0]

    def cached(self) -> None:
        self.text_encoder = None

    def loss(self, latents, texts):
        noise = torch.randn_like(latents)
        t = torch.randint(0, self.scheduler.config.num_train_timesteps, (len(latents),), device=self.device)
        predicted = self.unet(self.scheduler.add_noise(latents, noise, t), t, torch.stack(texts)).sample
        return torch.nn.functional.mse_loss(predicted, noise)


def _tiny_sd_config(workdir: Path, device: torch.device):
    from onetrainer.benchmark.family_overhead import lora_config

    settings = {"model_type": "STABLE_DIFFUSION_15", "base_model_name": "tiny:sd15", "resolution": "64"}
    return lora_config(workdir, device, "tiny SD", {**settings, "layer_filter_preset": "attn-only"})


def test_a_hook_registered_at_runtime_is_a_part_and_runs_through_the_one_driver(tmp_path, capsys):
    from onetrainer.benchmark.cli import build_parser, main, part_names
    from onetrainer.benchmark.family_overhead import FamilyOverhead, family_overheads, register_overhead

    hook = FamilyOverhead(
        part="tiny-sd-test",
        label="a test's tiny SD 1.5",
        help="a hook from a test",
        config=_tiny_sd_config,
        bare=TinySDBareLoop,
        resolution=64,
        check_trained=True,
        extras={"note": lambda steps, warmup: {"steps": steps, "warmup": warmup}},
    )
    undo = register_overhead(hook)
    try:
        assert family_overheads()["tiny-sd-test"] is hook and "tiny-sd-test" in part_names()
        parser = build_parser()
        assert "tiny-sd-test" in next(a.choices for a in parser._actions if a.dest == "part")
        assert "'tiny-sd-test' (a hook from a test)" in parser.epilog.replace("\n", " ")
        with pytest.raises(ValueError, match="exists already"):
            register_overhead(hook)
        out = tmp_path / "figures.json"
        args = ["--part", "tiny-sd-test", "--steps", "2", "--warmup", "1", "--repeat", "1", "--json", str(out)]
        assert main(args) == 0
    finally:
        undo()
    figures = json.loads(out.read_text(encoding="utf-8"))["tiny-sd-test"]
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["trained_parameters"] > 0  # checked equal to our method's, or the run would have failed
    assert figures["note"] == {"steps": 1, "warmup": 1}
    assert "Trainer overhead on a test's tiny SD 1.5" in capsys.readouterr().out
    assert "tiny-sd-test" not in family_overheads()


def test_a_shared_part_name_cannot_be_registered():
    from onetrainer.benchmark.family_overhead import FamilyOverhead, register_overhead

    hook = FamilyOverhead("gpu", "x", "x", _tiny_sd_config, TinySDBareLoop, 64)
    with pytest.raises(ValueError, match="exists already"):
        register_overhead(hook)
