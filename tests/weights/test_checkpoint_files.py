"""The safetensors header reader shared by the metadata reader, the memory estimate and the cache's completeness
check."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from onetrainer.weights.checkpoint_files import (
    parse_safetensors_header,
    read_safetensors_header,
    read_safetensors_metadata,
)


def test_the_header_names_each_tensor_and_leaves_the_file_at_their_bytes(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(2, 3), "b": torch.ones(4, dtype=torch.int64)}, str(path), metadata={"k": "v"})
    header = read_safetensors_header(path)
    assert header["a"]["shape"] == [2, 3] and header["b"]["dtype"] == "I64"
    assert read_safetensors_metadata(path) == {"k": "v"}
    with path.open("rb") as f:
        parse_safetensors_header(f)
        end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
        assert f.tell() + end == path.stat().st_size


@pytest.mark.parametrize(
    "content",
    [
        b"\x05\x00",
        (2**40).to_bytes(8, "little") + b"{}",
        (4).to_bytes(8, "little") + b"nope",
        (2).to_bytes(8, "little") + b"[]",
    ],
    ids=["too short", "length beyond the bound", "not JSON", "not an object"],
)
def test_a_file_without_a_header_is_refused(tmp_path, content):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError):
        read_safetensors_header(path)
