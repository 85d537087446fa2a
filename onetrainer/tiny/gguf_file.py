"""A tiny model's transformer written as a .gguf file, as the Flux and Chroma GGUFs people download are laid out:
for the tests and the benchmark of GGUF weights (`precision/gguf_weights.py`), offline."""

from __future__ import annotations

from pathlib import Path


def write_gguf_transformer(path: Path, variant: str = "flux-dev", kinds: tuple[str, ...] = ("Q8_0",)) -> Path:
    """The tiny model's transformer as a .gguf file in Black Forest Labs' layout, as the downloadable Flux / Chroma
    GGUFs are: each Linear weight whose rows fit the 32-element blocks quantized, cycling through `kinds` (Q8_0,
    Q4_0, Q5_0: the types the gguf package can write), the norms' scales in BF16, the rest F32."""
    import numpy as np
    from diffusers import ChromaTransformer2DModel, FluxTransformer2DModel
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from onetrainer.tiny import tiny_model_dir
    from onetrainer.weights import flux_keys

    cls = ChromaTransformer2DModel if variant == "chroma" else FluxTransformer2DModel
    transformer = cls.from_pretrained(tiny_model_dir(variant), subfolder="transformer")
    state = flux_keys.diffusers_to_original(transformer.state_dict(), dict(transformer.config))
    writer = GGUFWriter(str(path), arch="flux")
    types = [GGMLQuantizationType[k] for k in kinds]
    quantized = 0
    for name, tensor in state.items():
        values = tensor.float().numpy()
        if values.ndim == 2 and values.shape[1] % 32 == 0:
            kind = types[quantized % len(types)]
            writer.add_tensor(name, quantize(values, kind), raw_dtype=kind)
            quantized += 1
        elif name.endswith(".scale"):
            writer.add_tensor(name, quantize(values, GGMLQuantizationType.BF16), raw_dtype=GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
