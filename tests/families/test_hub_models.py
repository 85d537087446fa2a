"""Hub model ids with no connection: answered after one question to the hub (no download retries), from the cache
when it has them, else refused clearly.

The hub is made unreachable deterministically (an endpoint on a closed local port refuses at once, or a local endpoint
that records each request and drops it) and the cache is a temporary folder, so these tests never touch the network or
the user's cache. What the hub was asked is asserted, not how long it took: timings depend on the machine's load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import diffusers
import pytest
import torch
from safetensors.torch import load_file

from onetrainer.cli.train import EXIT_INVALID, main
from onetrainer.config import config_from_dict
from onetrainer.families.loading import ModelLoadError
from onetrainer.families.sd import StableDiffusionFamily
from onetrainer.tiny import tiny_model_dir
from onetrainer.training.checks import check_model_source, run_checks
from onetrainer.util import hub
from tests.conftest import ROOT, UNREACHABLE_HUB
from tests.helpers import CountingHub, local_config

REPO = "someone/sd15-model"


def put_in_cache(cache: Path, repo_id: str, model_dir: Path) -> Path:
    """Lay a model out as huggingface_hub's cache does: refs/main names the snapshot folder holding the files."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    return snapshot


def config(**data):
    cfg, problems = config_from_dict({"train_device": "cpu", **data})
    assert [p for p in problems if p.is_error] == []
    return local_config(cfg)


def assert_names_model_cache_and_remedy(message: str, cache: Path) -> None:
    assert f"'{REPO}'" in message
    assert f"not in the local Hugging Face cache ({cache})" in message
    assert "connect to the internet" in message and "local .safetensors file" in message


def test_check_refuses_an_uncached_model_when_the_hub_is_unreachable(no_hub):
    problems = check_model_source(REPO, False, "base_model_name")
    assert [p.path for p in problems] == ["base_model_name"]
    assert_names_model_cache_and_remedy(problems[0].message, no_hub)
    assert f"the hub ({UNREACHABLE_HUB}) cannot be reached (ConnectError" in problems[0].message


def test_check_and_load_ask_the_hub_once(no_hub, counted_hub):
    """Start's check and the load that follows ask about the same repo within seconds: one question, no retries."""
    assert [p.path for p in check_model_source(REPO, False, "base_model_name")] == ["base_model_name"]
    with pytest.raises(ModelLoadError):
        StableDiffusionFamily().load(config(base_model_name=REPO))
    assert counted_hub.close() == [f"/api/models/{REPO}"]


def test_check_refuses_an_uncached_model_in_offline_mode_without_asking_the_hub(no_hub, monkeypatch):
    monkeypatch.setattr(hub, "probe", lambda *a, **k: pytest.fail("offline mode must not contact the hub"))
    problems = check_model_source(REPO, True, "base_model_name")
    assert_names_model_cache_and_remedy(problems[0].message, no_hub)
    assert "the Offline setting is on" in problems[0].message


def test_check_accepts_a_cached_model_offline_and_refuses_a_partly_cached_one(no_hub):
    snapshot = put_in_cache(no_hub, REPO, tiny_model_dir("sd15"))
    assert check_model_source(REPO, True, "base_model_name") == []
    assert check_model_source(REPO, False, "base_model_name") == []  # the hub is unreachable, the cache suffices
    shutil.rmtree(snapshot / "unet")
    assert "not in the local Hugging Face cache" in check_model_source(REPO, True, "base_model_name")[0].message


def test_the_configured_cache_folder_is_the_one_looked_in(no_hub, tmp_path):
    own = tmp_path / "my-cache"
    put_in_cache(own, REPO, tiny_model_dir("sd15"))
    assert check_model_source(REPO, True, "base_model_name", str(own)) == []
    problems = run_checks(config(base_model_name=REPO, offline_mode=True))
    assert_names_model_cache_and_remedy(next(p for p in problems if p.path == "base_model_name").message, no_hub)


def test_cli_check_refuses_the_sd15_preset_when_its_model_is_neither_cached_nor_reachable(no_hub, in_tmp, capsys):
    (in_tmp / "images").mkdir()
    code = main(["--check", "--preset", "sd15/lora", "--set", "concepts.0.path=images"])
    err = capsys.readouterr().err
    assert code == EXIT_INVALID
    assert "error: Base model (base_model_name): the base model 'stable-diffusion-v1-5/stable-diffusion-v1-5'" in err
    assert str(no_hub) in err


def test_loading_an_uncached_model_fails_after_one_question_with_the_same_message(no_hub, counted_hub):
    with pytest.raises(ModelLoadError) as raised:
        StableDiffusionFamily().load(config(base_model_name=REPO))
    assert counted_hub.close() == [f"/api/models/{REPO}"]  # no download retries
    assert_names_model_cache_and_remedy(str(raised.value), no_hub)


def test_a_cached_model_loads_from_the_cache_when_the_hub_is_unreachable(no_hub, counted_hub, tmp_path):
    own = tmp_path / "my-cache"
    put_in_cache(own, REPO, tiny_model_dir("sd15"))
    model = StableDiffusionFamily().load(config(base_model_name=REPO, huggingface_cache_dir=str(own)))
    assert counted_hub.close() == [f"/api/models/{REPO}"]  # no download retries (they alone took over 20 s)
    assert model.part("unet") is not None


def test_a_partly_cached_model_names_the_missing_part(no_hub, tmp_path):
    own = tmp_path / "my-cache"
    snapshot = put_in_cache(own, REPO, tiny_model_dir("sd15"))
    (snapshot / "vae" / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"its vae is missing there") as raised:
        StableDiffusionFamily().load(config(base_model_name=REPO, huggingface_cache_dir=str(own), offline_mode=True))
    assert f"({own})" in str(raised.value)


@pytest.mark.slow
def test_train_script_check_answers_from_the_environment_after_one_question(tmp_path):
    """The real entry point with only environment variables: HF_HOME decides the cache, HF_ENDPOINT the hub."""
    (tmp_path / "images").mkdir()
    counted = CountingHub()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))},
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_ENDPOINT": counted.url,
    }
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), "--check", "--preset", "sd15/lora"]
    try:
        result = subprocess.run(
            [*command, "--set", f"concepts.0.path={tmp_path / 'images'}"], capture_output=True, text=True, env=env
        )
    finally:
        asked = counted.close()
    assert result.returncode == EXIT_INVALID, result.stderr
    assert f"not in the local Hugging Face cache ({tmp_path / 'hf-home' / 'hub'})" in result.stderr
    assert f"the hub ({counted.url}) cannot be reached" in result.stderr
    assert asked == ["/api/models/stable-diffusion-v1-5/stable-diffusion-v1-5"], asked  # no download retries


@pytest.mark.parametrize("layout", ["vae repo", "pipeline repo"])
def test_a_hub_vae_override_loads_from_the_cache_offline(no_hub, tmp_path, layout):
    vae_repo = "someone/better-vae"
    model_dir = tiny_model_dir("sd15")
    source = model_dir / "vae" if layout == "vae repo" else model_dir
    put_in_cache(no_hub, vae_repo, source)
    cfg = config(base_model_name="tiny:sd15", offline_mode=True, vae={"model_name": vae_repo})
    assert check_model_source(vae_repo, True, "vae.model_name") == []
    model = StableDiffusionFamily().load(cfg)
    expected = diffusers.AutoencoderKL.from_pretrained(model_dir / "vae")
    assert all(
        torch.equal(a, b) for a, b in zip(model.part("vae").state_dict().values(), expected.state_dict().values())
    )


def test_an_uncached_hub_vae_override_is_refused_naming_the_vae(no_hub):
    cfg = config(base_model_name="tiny:sd15", offline_mode=True, vae={"model_name": "someone/missing-vae"})
    with pytest.raises(ModelLoadError, match=r"the VAE override 'someone/missing-vae' is not in the local"):
        StableDiffusionFamily().load(cfg)


@pytest.mark.parametrize(
    ("model_type", "repo", "filename"),
    [
        ("WUERSTCHEN_2", "warp-ai/EfficientNetEncoder", "diffusion_pytorch_model.safetensors"),
        ("STABLE_CASCADE_1", "stabilityai/stable-cascade", "effnet_encoder.safetensors"),
    ],
)
def test_the_effnet_encoder_loads_from_its_hub_repository_in_the_cache(no_hub, tmp_path, model_type, repo, filename):
    from onetrainer.config.enums import ModelType
    from onetrainer.families import load_family_class
    from onetrainer.tiny.effnet import save_effnet_encoder

    family = load_family_class(ModelType(model_type))()  # each variant is its own class

    wuerstchen = model_type == "WUERSTCHEN_2"
    local = tmp_path / "effnet"
    local.mkdir()
    save_effnet_encoder(local / filename, wuerstchen=wuerstchen)
    put_in_cache(no_hub, repo, local)
    # The tiny model's folders as a user's local model (a `tiny:` base would bring its own encoder, not the hub's).
    variant = "wuerstchen" if wuerstchen else "cascade"
    common = {
        "model_type": model_type, "base_model_name": str(tiny_model_dir(variant)), "output_model_format": "DIFFUSERS",
        "decoder": {"model_name": str(tiny_model_dir(f"{variant}-decoder"))},
    }  # fmt: skip
    cfg = config(**common, offline_mode=True, effnet_encoder={"model_name": repo})
    encoder = family.load(cfg).part("effnet_encoder")
    expected = load_file(str(local / filename))
    assert all(torch.equal(v, expected[k]) for k, v in encoder.state_dict().items() if k in expected)

    missing = config(**common, effnet_encoder={"model_name": "someone/no-effnet"})  # the hub unreachable
    with pytest.raises(ModelLoadError, match=r"EfficientNet encoder \(effnet_encoder.model_name\)"):
        family.load(missing)


def test_a_part_wise_download_counts_as_cached_offline(no_hub, tmp_path):
    """Würstchen / Cascade (and PixArt) read a pipeline repository part by part, so their cache holds subfolders
    without model_index.json: offline, the check and the load take it, and they name a part that is missing."""
    from onetrainer.families.wuerstchen import CascadeFamily
    from onetrainer.tiny.effnet import save_effnet_encoder

    for repo, variant, parts in (
        ("someone/cascade-prior", "cascade", ("prior", "text_encoder", "tokenizer")),
        ("someone/cascade", "cascade-decoder", ("decoder", "vqgan")),
    ):
        partial = tmp_path / variant
        for part in parts:
            shutil.copytree(tiny_model_dir(variant) / part, partial / part)
        put_in_cache(no_hub, repo, partial)
    effnet = save_effnet_encoder(tmp_path / "effnet_encoder.safetensors", wuerstchen=False)
    data = {
        "model_type": "STABLE_CASCADE_1", "base_model_name": "someone/cascade-prior", "offline_mode": True,
        "output_model_format": "DIFFUSERS", "decoder": {"model_name": "someone/cascade"},
        "effnet_encoder": {"model_name": str(effnet)}, "concepts": [{"path": str(tmp_path)}],
    }  # fmt: skip
    assert not [p for p in run_checks(config(**data)) if "model_name" in p.path and p.is_error]
    model = CascadeFamily().load(config(**data))
    assert model.part("decoder") is not None and model.part("prior") is not None

    shutil.rmtree(no_hub / "models--someone--cascade")  # the decoder's repository gone
    problems = [p for p in run_checks(config(**data)) if p.path == "decoder.model_name"]
    assert problems and "someone/cascade" in problems[0].message
    with pytest.raises(ModelLoadError, match=r"decoder \(decoder.model_name\)"):
        CascadeFamily().load(config(**data))
