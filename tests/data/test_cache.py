"""The disk cache: atomic entries on disk, recently read ones kept in memory within a byte limit."""

from __future__ import annotations

import pytest
import torch

from onetrainer.data import cache as cache_module
from onetrainer.data.cache import DiskCache, cache_key, remove_outdated_entries


def entry(value: float, count: int = 256) -> dict[str, torch.Tensor]:
    return {"latents": torch.full((count,), value)}  # 1 KiB in float32


def test_entries_round_trip_and_a_missing_or_broken_one_is_none(tmp_path):
    cache = DiskCache(tmp_path, "latents")
    key = cache_key({"image": "a.png", "bucket": (64, 64)})
    assert cache.get(key) is None and key not in cache
    cache.put(key, entry(1.0))
    assert key in cache and torch.equal(cache.get(key)["latents"], entry(1.0)["latents"])

    broken = cache_key({"image": "b.png"})
    cache.path(broken).parent.mkdir(parents=True, exist_ok=True)
    cache.path(broken).write_bytes(b"not a tensor file")
    assert cache.get(broken) is None  # encoded again rather than failing the run


def test_read_entries_are_served_from_memory_within_the_limit(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path, "latents", memory_limit=2 * 1024)  # room for two 1 KiB entries
    keys = [cache_key({"image": f"{i}.png"}) for i in range(3)]
    for i, key in enumerate(keys):
        DiskCache(tmp_path, "latents").put(key, entry(float(i)))  # written by another run: only on disk
    loads = []
    real_read = cache_module.read_entry

    def counting_read(path):
        loads.append(path)
        return real_read(path)

    monkeypatch.setattr(cache_module, "read_entry", counting_read)
    cache.get(keys[0])
    cache.get(keys[1])
    cache.get(keys[0])  # from memory
    assert len(loads) == 2
    cache.get(keys[2])  # over the limit: the least recently read (keys[1]) leaves memory
    cache.get(keys[0])
    assert len(loads) == 3
    assert cache.get(keys[1])["latents"][0] == 1.0 and len(loads) == 4


@pytest.mark.parametrize(("variant", "encoder"), [("cascade", "effnet_encoder"), ("sd15", "vae")])
def test_the_latents_are_encoded_again_when_the_image_encoder_changes(tmp_path, variant, encoder):
    # The latent cache is keyed on the family's IMAGE_ENCODER parts: Cascade's EfficientNet, SD's VAE.
    from onetrainer.training.events import CacheFilled
    from tests.helpers import image_folder, run_config, tiny_config

    image_folder(tmp_path, count=2)
    size = "128" if variant == "cascade" else "64"

    def encoded(dtype: str) -> int:
        config = tiny_config(tmp_path, variant, epochs=1, resolution=size, **{encoder: {"weight_dtype": dtype}})
        events = run_config(config)
        return next(e.encoded for e in events if isinstance(e, CacheFilled) and e.kind == "latents")

    assert encoded("FLOAT_32") == 2
    assert encoded("FLOAT_32") == 0  # the same encoder: served from the cache
    assert encoded("BFLOAT_16") == 2  # another dtype of the encoder: not the old latents


def test_the_text_cache_key_follows_each_encoders_clip_skip_and_sequence_length(tmp_path):
    from types import SimpleNamespace

    from onetrainer.config import TrainConfig
    from onetrainer.config.enums import ModelType
    from onetrainer.data.caching import TextCache
    from onetrainer.families.base import TextEncoderSlot

    config = TrainConfig(model_type=ModelType.FLUX_DEV_1, cache_dir=str(tmp_path))
    family = SimpleNamespace(info=SimpleNamespace(key="flux"))

    def key(skip: int, tokens: int | None) -> str:
        slot = TextEncoderSlot("text_encoder_2", None, None, "lora_te3", "t5", skip, max_tokens=tokens)
        return TextCache(config, family, SimpleNamespace(text_encoders=[slot])).key("a red circle")

    assert key(0, 77) == key(0, 77)
    assert len({key(0, 77), key(0, 512), key(0, None), key(1, 77)}) == 4


def test_a_written_entry_is_read_from_memory_not_from_its_file(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path, "latents")
    key = cache_key({"image": "a.png"})
    cache.put(key, entry(3.0))
    monkeypatch.setattr(cache_module, "read_entry", lambda path: pytest.fail(f"{path} was read back from disk"))
    assert torch.equal(cache.get(key)["latents"], entry(3.0)["latents"])


def test_an_entry_cut_from_a_batch_is_stored_and_kept_at_its_own_size(tmp_path):
    batch = torch.randn(16, 1024)  # sixteen captions' rows, 64 KiB: an entry is one row (4 KiB)
    cache = DiskCache(tmp_path, "text")
    key = cache_key({"caption": "a cat"})
    mask = torch.ones(16, dtype=torch.bool)
    rows = {"hidden_states": batch[5], "attention_mask": mask[3:7], "again": mask[3:7], "count": torch.tensor(4)}
    cache.put(key, rows)
    assert cache.path(key).stat().st_size < 5 * 1024  # not the batch's 64 KiB
    assert cache.get(key)["hidden_states"].untyped_storage().nbytes() == 4096  # kept in memory without its batch
    reread = DiskCache(tmp_path, "text").get(key)
    assert torch.equal(reread["hidden_states"], batch[5]) and reread["attention_mask"].tolist() == [True] * 4
    assert reread["again"].dtype == torch.bool and reread["count"].item() == 4 and reread["count"].shape == ()


def test_a_file_cut_short_is_missing_and_an_earlier_formats_entries_are_removed(tmp_path):
    cache = DiskCache(tmp_path, "latents")
    key = cache_key({"image": "a.png"})
    cache.put(key, entry(1.0))
    whole = cache.path(key).read_bytes()
    cache.path(key).write_bytes(whole[:-1])
    assert key not in DiskCache(tmp_path, "latents") and DiskCache(tmp_path, "latents").get(key) is None
    assert not cache.path(key).exists()  # removed: the next fill encodes it again

    old = tmp_path / "text" / "ab" / "ab12.pt"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"x" * 300)
    cache.put(key, entry(1.0))
    assert remove_outdated_entries(tmp_path) == (1, 300)
    assert not old.exists() and key in DiskCache(tmp_path, "latents")
