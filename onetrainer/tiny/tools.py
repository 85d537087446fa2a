"""Tiny random-weight models for the mask and caption tools, built offline (tests, demos).

Each builder writes a folder (or file) laid out like the hub's: `from_pretrained` on it takes the same path a user's
downloaded model takes. The ONNX models (u2net, the WD14 tagger) are built node by node with the `onnx` package's
helper API, with the real models' input and output layouts and weights chosen so their answers can be predicted.
"""

from __future__ import annotations

import csv
from pathlib import Path

# WD14's tag list: (name, category); 9 = rating, 0 = general, 4 = character. The tiny tagger sees each image's mean
# colour: "blue_sky" fires on blue, "red_dress" on red, "simple_background" always (0.88), "outdoors" at 0.5.
WD14_TAGS = [
    ("general", "9"),
    ("blue_sky", "0"),
    ("red_dress", "0"),
    ("simple_background", "0"),
    ("outdoors", "0"),
    ("hatsune_miku", "4"),
]
# Weights on the mean B, G, R (0..1) and biases, in WD14_TAGS' order.
_WD14_WEIGHTS = [[0, 0, 0], [8, 0, 0], [0, 0, 8], [0, 0, 0], [0, 0, 0], [0, 0, 0]]
_WD14_BIASES = [5, -4, -4, 2, 0, 5]

WORDS = [
    "a",
    "photo",
    "of",
    "the",
    "cat",
    "dog",
    "red",
    "blue",
    "green",
    "on",
    "with",
    "in",
    "background",
    "person",
    "sitting",
    "table",
    "image",
    "picture",
    "an",
    "and",
    "is",
    "there",
    "white",
    "black",
    "small",
    "large",
]


def _word_tokenizer(special: list[str], folder: Path, **kwargs):
    """A word-level fast tokenizer (lower-case words, unknown words → [UNK]) saved to `folder`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([*special, *WORDS, ",", "."])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=kwargs.get("unk_token", "[UNK]")))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **kwargs), vocab


def write_tiny_clipseg(folder: Path) -> Path:
    import torch
    from transformers import CLIPSegConfig, CLIPSegForImageSegmentation, CLIPSegProcessor, ViTImageProcessor

    from onetrainer.tiny.tokenizer import build_clip_tokenizer

    tokenizer = build_clip_tokenizer()
    config = CLIPSegConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": tokenizer.model_max_length,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=16,
        reduce_dim=8,
        extract_layers=[0, 1],
        decoder_num_attention_heads=2,
        decoder_intermediate_size=16,
    )
    torch.manual_seed(0)
    model = CLIPSegForImageSegmentation(config).eval()
    image_processor = ViTImageProcessor(size={"height": 32, "width": 32})
    CLIPSegProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def write_tiny_blip(folder: Path) -> Path:
    import torch
    from transformers import BertTokenizer, BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    folder.mkdir(parents=True, exist_ok=True)
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"]
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join([*special, *WORDS, ",", "."]) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(str(vocab_file), bos_token="[DEC]")
    config = BlipConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 128,
            "encoder_hidden_size": 16,
            "bos_token_id": tokenizer.convert_tokens_to_ids("[DEC]"),
            "pad_token_id": 0,
            "sep_token_id": tokenizer.sep_token_id,
            "eos_token_id": tokenizer.sep_token_id,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=16,
    )
    torch.manual_seed(0)
    model = BlipForConditionalGeneration(config).eval()
    image_processor = BlipImageProcessor(size={"height": 32, "width": 32})
    BlipProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def write_tiny_blip2(folder: Path) -> Path:
    import torch
    from transformers import Blip2Config, Blip2ForConditionalGeneration, Blip2Processor, BlipImageProcessor

    tokenizer, vocab = _word_tokenizer(["<pad>", "</s>", "[UNK]", "<image>"], folder)
    tokenizer.add_special_tokens({"pad_token": "<pad>", "eos_token": "</s>", "bos_token": "</s>", "unk_token": "[UNK]"})
    num_query_tokens = 2
    config = Blip2Config(
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        qformer_config={
            "vocab_size": 32,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "encoder_hidden_size": 16,
        },
        text_config={
            "model_type": "opt",
            "vocab_size": len(vocab),
            "hidden_size": 16,
            "ffn_dim": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "word_embed_proj_dim": 16,
            "max_position_embeddings": 128,
            "bos_token_id": vocab["</s>"],
            "eos_token_id": vocab["</s>"],
            "pad_token_id": vocab["<pad>"],
        },
        num_query_tokens=num_query_tokens,
        image_token_index=vocab["<image>"],
    )
    torch.manual_seed(0)
    model = Blip2ForConditionalGeneration(config).eval()
    image_processor = BlipImageProcessor(size={"height": 32, "width": 32})
    Blip2Processor(
        image_processor=image_processor, tokenizer=tokenizer, num_query_tokens=num_query_tokens
    ).save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def write_tiny_florence2(folder: Path) -> Path:
    import torch
    from transformers import CLIPImageProcessor, Florence2Config, Florence2ForConditionalGeneration, Florence2Processor

    special = ["<s>", "<pad>", "</s>", "<unk>", "<image>"]
    tokenizer, vocab = _word_tokenizer(
        special,
        folder,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        extra_special_tokens={"image_token": "<image>"},
    )
    image_size = 32
    config = Florence2Config(
        vision_config={
            "depths": [1, 1],
            "patch_size": [7, 3],
            "patch_stride": [4, 2],
            "patch_padding": [3, 1],
            "patch_prenorm": [False, True],
            "embed_dim": [16, 32],
            "num_heads": [2, 2],
            "num_groups": [2, 2],
            "window_size": 2,
            "projection_dim": 16,
            "drop_path_rate": 0.0,
        },
        text_config={
            "vocab_size": len(vocab),
            "d_model": 16,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 32,
            "decoder_ffn_dim": 32,
            "max_position_embeddings": 128,
            "bos_token_id": vocab["<s>"],
            "eos_token_id": vocab["</s>"],
            "pad_token_id": vocab["<pad>"],
            "decoder_start_token_id": vocab["</s>"],
            "forced_bos_token_id": None,
            "forced_eos_token_id": vocab["</s>"],
        },
        image_token_id=vocab["<image>"],
    )
    torch.manual_seed(0)
    model = Florence2ForConditionalGeneration(config).eval()
    # Strides 4 and 2 make a 32 px image 4 x 4 = 16 features, plus the pooled one.
    image_processor = CLIPImageProcessor(
        size={"height": image_size, "width": image_size},
        crop_size={"height": image_size, "width": image_size},
        do_center_crop=False,
        image_seq_length=17,
    )
    Florence2Processor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def write_tiny_u2net(path: Path, size: int = 32) -> Path:
    """A stand-in for u2net.onnx with its layout (1×3×size×size in, several 1×1×size×size maps out): the first map is
    the normalised red channel, so red subjects come out white."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Constant", [], ["starts"], value=helper.make_tensor("s", TensorProto.INT64, [1], [0])),
        helper.make_node("Constant", [], ["ends"], value=helper.make_tensor("e", TensorProto.INT64, [1], [1])),
        helper.make_node("Constant", [], ["axes"], value=helper.make_tensor("a", TensorProto.INT64, [1], [1])),
        helper.make_node("Slice", ["input.1", "starts", "ends", "axes"], ["d0"]),
        helper.make_node("Sigmoid", ["d0"], ["d1"]),
    ]
    shape = [1, 1, size, size]
    graph = helper.make_graph(
        nodes,
        "tiny_u2net",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("d0", "d1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_tiny_wd14(folder: Path, size: int = 32) -> Path:
    """A stand-in for a WD14 tagger folder (model.onnx + selected_tags.csv): NHWC BGR 0..255 in, one sigmoid
    probability per tag out, computed from the image's mean colour (see WD14_TAGS)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.array(_WD14_WEIGHTS, dtype=np.float32).T / 255.0  # (3, tags), on 0..255 values
    biases = np.array(_WD14_BIASES, dtype=np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["input_1:0"], ["mean"], axes=[1, 2], keepdims=0),
        helper.make_node("MatMul", ["mean", "weights"], ["logits_w"]),
        helper.make_node("Add", ["logits_w", "biases"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["predictions_sigmoid"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_wd14",
        [helper.make_tensor_value_info("input_1:0", TensorProto.FLOAT, [1, size, size, 3])],
        [helper.make_tensor_value_info("predictions_sigmoid", TensorProto.FLOAT, [1, len(WD14_TAGS)])],
        initializer=[numpy_helper.from_array(weights, "weights"), numpy_helper.from_array(biases, "biases")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    with open(folder / "selected_tags.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["tag_id", "name", "category", "count"])
        for i, (name, category) in enumerate(WD14_TAGS):
            writer.writerow([i, name, category, 100])
    return folder
