"""A CLIP text encoder's modules get the same names in our files whichever transformers is installed: transformers 5's
CLIPTextModel (no `text_model.` level in its module paths) and transformers 4's (the level there) write and read the
same file names."""

from __future__ import annotations

import torch

from onetrainer.weights.clip_names import file_module_path, model_module_path


class CLIPTextModel(torch.nn.Module):
    """transformers 4's layout of CLIP-L, by class name as transformers names it: everything under `text_model`."""

    def __init__(self) -> None:
        super().__init__()
        self.text_model = torch.nn.Module()


def test_both_layouts_name_a_module_as_the_file_does():
    from transformers import CLIPTextConfig
    from transformers import CLIPTextModel as Installed

    installed = Installed(CLIPTextConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, vocab_size=10))  # fmt: skip
    path = next(name for name, _ in installed.named_modules() if name.endswith("layers.0.self_attn.q_proj"))
    file_name = "text_model.encoder.layers.0.self_attn.q_proj"
    assert file_module_path(installed, path) == file_name
    assert file_module_path(CLIPTextModel(), file_name) == file_name
    assert model_module_path(installed, file_name) == path
    assert model_module_path(CLIPTextModel(), file_name) == file_name
    t5 = torch.nn.Linear(2, 2)  # another encoder's paths are its own
    assert file_module_path(t5, "encoder.block.0.layer.0") == "encoder.block.0.layer.0"
