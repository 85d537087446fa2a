"""The full-size configs of the real models, as they appear in their diffusers folders on the hub (the families
build single-file checkpoints on them; the tiny test models are derived from them in `onetrainer/tiny/`).

Like the config.json files, diffusers configs name their class in `_class_name`, transformers configs in
`architectures`; schedulers' dicts are their scheduler_config.json.

The tiny models are derived from these by replacing width fields only (see `TINY_WIDTH_FIELDS`), so their module
trees, and therefore their state-dict key names, are those of the real checkpoints. The tests build the real
topologies from here on the meta device to check exactly that.
"""

from __future__ import annotations

from typing import Any

Config = dict[str, Any]


# --- UNets -------------------------------------------------------------------------------------------------------

SD15_UNET: Config = {
    "_class_name": "UNet2DConditionModel",
    "act_fn": "silu",
    "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "out_channels": 4,
    "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}

# Inpainting UNets take the noisy latent, the masked image's latent and the mask: 4 + 4 + 1 channels.
SD15_INPAINTING_UNET: Config = {**SD15_UNET, "in_channels": 9}

# SD 2.x: OpenCLIP-H conditioning (1024 wide), per-block head counts and linear transformer projections.
SD2_BASE_UNET: Config = {
    **SD15_UNET,
    "attention_head_dim": [5, 10, 20, 20],
    "cross_attention_dim": 1024,
    "use_linear_projection": True,
    "sample_size": 64,
}
SD2_768_UNET: Config = {**SD2_BASE_UNET, "sample_size": 96}
# SD 2.1 768 runs its attention in fp32, the other 2.x UNets do not.
SD21_768_UNET: Config = {**SD2_768_UNET, "upcast_attention": True}
SD2_INPAINTING_UNET: Config = {**SD2_BASE_UNET, "in_channels": 9}

SDXL_UNET: Config = {
    "_class_name": "UNet2DConditionModel",
    "act_fn": "silu",
    "addition_embed_type": "text_time",
    "addition_embed_type_num_heads": 64,
    "addition_time_embed_dim": 256,
    "attention_head_dim": [5, 10, 20],
    "block_out_channels": [320, 640, 1280],
    "center_input_sample": False,
    "class_embed_type": None,
    "class_embeddings_concat": False,
    "conv_in_kernel": 3,
    "conv_out_kernel": 3,
    "cross_attention_dim": 2048,
    "cross_attention_norm": None,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "downsample_padding": 1,
    "dual_cross_attention": False,
    "encoder_hid_dim": None,
    "encoder_hid_dim_type": None,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_only_cross_attention": None,
    "mid_block_scale_factor": 1,
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "num_attention_heads": None,
    "num_class_embeds": None,
    "only_cross_attention": False,
    "out_channels": 4,
    # 6 micro-conditioning values (original size, crop offset, target size) x 256 + the pooled CLIP-bigG embedding.
    "projection_class_embeddings_input_dim": 2816,
    "resnet_out_scale_factor": 1.0,
    "resnet_skip_time_act": False,
    "resnet_time_scale_shift": "default",
    "sample_size": 128,
    "time_cond_proj_dim": None,
    "time_embedding_act_fn": None,
    "time_embedding_dim": None,
    "time_embedding_type": "positional",
    "timestep_post_act": None,
    "transformer_layers_per_block": [1, 2, 10],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "upcast_attention": False,
    "use_linear_projection": True,
}
SDXL_INPAINTING_UNET: Config = {**SDXL_UNET, "in_channels": 9}

# --- VAEs --------------------------------------------------------------------------------------------------------

SD_VAE: Config = {
    "_class_name": "AutoencoderKL",
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "in_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "out_channels": 3,
    "sample_size": 512,
    "scaling_factor": 0.18215,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
}
SDXL_VAE: Config = {**SD_VAE, "sample_size": 1024, "scaling_factor": 0.13025, "force_upcast": True}

# Flux's VAE (FLUX.1-dev, also Chroma's): the SD VAE's blocks with 16 latent channels and no quant convs; latents
# are shifted, then scaled: (z - 0.1159) * 0.3611.
FLUX_VAE: Config = {
    **SD_VAE,
    "force_upcast": True,
    "latent_channels": 16,
    "mid_block_add_attention": True,
    "sample_size": 1024,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "use_post_quant_conv": False,
    "use_quant_conv": False,
}

# Stable Diffusion 3 / 3.5's VAE: Flux's 16-channel blocks with SD3's own shift and scale ((z - 0.0609) * 1.5305).
SD3_VAE: Config = {**FLUX_VAE, "scaling_factor": 1.5305, "shift_factor": 0.0609}

# Z-Image's VAE (Tongyi-MAI/Z-Image and Z-Image-Turbo, vae/config.json): Flux's, shift and scale included (16 latent
# channels, sample_size 1024, force_upcast, (z - 0.1159) * 0.3611).
Z_IMAGE_VAE: Config = FLUX_VAE

# Qwen-Image's VAE (Qwen/Qwen-Image vae/config.json; Qwen-Image-Edit-2509 and -2511 ship the same): Wan 2.1's causal
# video VAE, used on single frames ([B, C, 1, H, W]). Widths 96 x (1, 2, 4, 4), 2 residual blocks per level, no
# attention but the middle block's, 8x down in space (the last two levels also halve time, which one frame never
# notices), 16 latent channels normalised per channel: (z - latents_mean) / latents_std.
# fmt: off
_QWEN_IMAGE_LATENTS_MEAN = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
]
_QWEN_IMAGE_LATENTS_STD = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
]
# fmt: on
QWEN_IMAGE_VAE: Config = {
    "_class_name": "AutoencoderKLQwenImage",
    "attn_scales": [],
    "base_dim": 96,
    "dim_mult": [1, 2, 4, 4],
    "dropout": 0.0,
    "latents_mean": _QWEN_IMAGE_LATENTS_MEAN,
    "latents_std": _QWEN_IMAGE_LATENTS_STD,
    "num_res_blocks": 2,
    "temperal_downsample": [False, True, True],
    "z_dim": 16,
}

# Flux.2's VAE (AutoencoderKLFlux2: every Flux.2 model's vae/, and ERNIE-Image's): the SD VAE's blocks with 32 latent
# channels and quant convs; no shift or scale: latents are patchified 2x2 (128 channels) and normalised by the
# batch-norm statistics the VAE carries (`bn.running_mean`, `bn.running_var`, eps 1e-4;
# `families/vae_batch_norm.py`).
FLUX2_VAE: Config = {
    "_class_name": "AutoencoderKLFlux2",
    "act_fn": "silu",
    "batch_norm_eps": 0.0001,
    "batch_norm_momentum": 0.1,
    "block_out_channels": [128, 256, 512, 512],
    "decoder_block_out_channels": None,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "in_channels": 3,
    "latent_channels": 32,
    "layers_per_block": 2,
    "mid_block_add_attention": True,
    "norm_num_groups": 32,
    "out_channels": 3,
    "patch_size": [2, 2],
    "sample_size": 1024,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "use_post_quant_conv": True,
    "use_quant_conv": True,
}

# --- Text encoders -----------------------------------------------------------------------------------------------

CLIP_VOCAB_SIZE = 49408

# OpenAI CLIP ViT-L/14: SD 1.x, and SDXL's first encoder.
CLIP_L_TEXT: Config = {
    "architectures": ["CLIPTextModel"],
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "hidden_act": "quick_gelu",
    "hidden_size": 768,
    "initializer_factor": 1.0,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 77,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "projection_dim": 768,
    "vocab_size": CLIP_VOCAB_SIZE,
}
# OpenCLIP ViT-H/14 as shipped with SD 2.x: the last of its 24 layers is dropped (SD 2 conditions on the
# penultimate layer), so the diffusers checkpoint holds 23.
OPEN_CLIP_H_TEXT: Config = {
    **CLIP_L_TEXT,
    "hidden_act": "gelu",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_attention_heads": 16,
    "num_hidden_layers": 23,
    "projection_dim": 512,
}
# OpenCLIP ViT-bigG/14: SDXL's second encoder, whose pooled, projected output feeds the UNet's added embedding.
OPEN_CLIP_BIGG_TEXT: Config = {
    **CLIP_L_TEXT,
    "architectures": ["CLIPTextModelWithProjection"],
    "hidden_act": "gelu",
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_attention_heads": 20,
    "num_hidden_layers": 32,
    "projection_dim": 1280,
}

# Stable Diffusion 3's CLIP-L and CLIP-G: both with their projections (the pooled outputs condition the transformer).
CLIP_L_PROJECTED_TEXT: Config = {**CLIP_L_TEXT, "architectures": ["CLIPTextModelWithProjection"]}
CLIP_G_PROJECTED_TEXT: Config = OPEN_CLIP_BIGG_TEXT

# LAION's OpenCLIP text towers as Würstchen v2 uses them: bigG (all 32 layers, no projection) for the prior, H (all
# 24 layers) for the decoder.
LAION_BIGG_TEXT: Config = {**OPEN_CLIP_BIGG_TEXT, "architectures": ["CLIPTextModel"]}
LAION_H_TEXT: Config = {**OPEN_CLIP_H_TEXT, "num_hidden_layers": 24, "projection_dim": 1024}

# OpenAI CLIP ViT-L/14's vision tower: Stable Cascade's image encoder, for image-conditioned prior runs.
CLIP_L_VISION: Config = {
    "architectures": ["CLIPVisionModelWithProjection"],
    "attention_dropout": 0.0,
    "hidden_act": "quick_gelu",
    "hidden_size": 1024,
    "image_size": 224,
    "initializer_factor": 1.0,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-05,
    "num_attention_heads": 16,
    "num_channels": 3,
    "num_hidden_layers": 24,
    "patch_size": 14,
    "projection_dim": 768,
}

# T5 v1.1 XXL's encoder: PixArt's text encoder, Flux's second and Chroma's only one.
T5_XXL_ENCODER: Config = {
    "architectures": ["T5EncoderModel"],
    "d_ff": 10240,
    "d_kv": 64,
    "d_model": 4096,
    "decoder_start_token_id": 0,
    "dense_act_fn": "gelu_new",
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "feed_forward_proj": "gated-gelu",
    "initializer_factor": 1.0,
    "is_encoder_decoder": True,
    "is_gated_act": True,
    "layer_norm_epsilon": 1e-06,
    "num_decoder_layers": 24,
    "num_heads": 64,
    "num_layers": 24,
    "pad_token_id": 0,
    "relative_attention_max_distance": 128,
    "relative_attention_num_buckets": 32,
    "tie_word_embeddings": False,
    "vocab_size": 32128,
}

# Qwen3-4B (Qwen/Qwen3-4B) as Z-Image's text encoder (Tongyi-MAI/Z-Image and Z-Image-Turbo, text_encoder/config.json):
# 36 decoder layers, 32 query heads and 8 key/value heads of 128 (the queries, 4096 wide, are wider than the 2560-wide
# model), RMS-normed queries and keys, embeddings tied to the (unused) LM head. The pipeline conditions on the
# penultimate layer's hidden states. The hub config names Qwen3ForCausalLM and the files hold that model's
# `model.`-prefixed weights (no `lm_head`: it is the embedding), while model_index.json loads the bare Qwen3Model,
# as here. transformers 5 keeps `rope_theta` inside `rope_parameters`.
QWEN3_4B_TEXT: Config = {
    "architectures": ["Qwen3Model"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# Qwen3-0.6B-Base as Anima's text encoder (read as the bare Qwen3Model): 28 decoder layers of 1024, 16 query heads of
# 128 over 8 key/value heads; Qwen3-4B's vocabulary and rotary base. The base model's config (kohya-ss/sd-scripts
# configs/qwen3_06b/config.json, ComfyUI's Qwen3_06BConfig, diffusers' scripts/convert_anima_to_diffusers.py):
# "<|endoftext|>" (151643) both starts and ends a text (the chat model's end, "<|im_end|>" 151645, is not the base's)
# and 32768 positions (not the chat model's 40960).
QWEN3_06B_TEXT: Config = {
    **QWEN3_4B_TEXT,
    "eos_token_id": 151643,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
}

# Qwen2.5-VL-7B-Instruct (Qwen/Qwen2.5-VL-7B-Instruct config.json) as Qwen-Image's text encoder (Qwen/Qwen-Image and
# Qwen-Image-Edit-2509/-2511 text_encoder/), the whole model: the files hold the decoder under `model.`, the vision
# tower under `visual.` and the untied `lm_head` (transformers 5 moves the first two under `model.language_model.` and
# `model.visual.` on load, and back on save). A Qwen2 decoder of 28 layers, 28 query heads and 4 key/value heads of 128
# over 3584 channels, whose rotary embedding splits each head's 64 frequency pairs over (time, row, column) positions
# (`mrope_section` 16/24/24): text tokens advance all three together, image tokens take their grid cell. Its vision
# tower: 32 blocks over 14 px patches (2 frames deep), windowed attention over 112 px tiles except the last block of
# each eight, then 2x2 neighbouring patches merged into one token of the decoder's width. The pipelines condition on
# the last layer's (normed) hidden states. Transformers 5 keeps the text fields in a nested `text_config` and
# `rope_theta` / `rope_scaling` in `rope_parameters`, and names the vision config's model type itself (the file's
# "qwen2_5_vl" there is left out).
QWEN25_VL_7B_TEXT: Config = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "image_token_id": 151655,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "video_token_id": 151656,
    "vision_config": {
        "depth": 32,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "hidden_act": "silu",
        "hidden_size": 1280,
        "in_chans": 3,
        "intermediate_size": 3420,
        "num_heads": 16,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "temporal_patch_size": 2,
        "tokens_per_second": 2,
        "window_size": 112,
    },
    "vision_end_token_id": 151653,
    "vision_start_token_id": 151652,
    "vision_token_id": 151654,
    "vocab_size": 152064,
}

# --- Transformers ------------------------------------------------------------------------------------------------

# PixArt-XL-2-1024-MS. sample_size 128 (1024 px) switches on the resolution and aspect-ratio micro-conditioning.
PIXART_ALPHA_TRANSFORMER: Config = {
    "_class_name": "PixArtTransformer2DModel",
    "activation_fn": "gelu-approximate",
    "attention_bias": True,
    "attention_head_dim": 72,
    "attention_type": "default",
    "caption_channels": 4096,
    "cross_attention_dim": 1152,
    "dropout": 0.0,
    "in_channels": 4,
    "interpolation_scale": None,
    "norm_elementwise_affine": False,
    "norm_eps": 1e-06,
    "norm_num_groups": 32,
    "norm_type": "ada_norm_single",
    "num_attention_heads": 16,
    "num_embeds_ada_norm": 1000,
    "num_layers": 28,
    # The model also predicts the variance: 4 noise channels + 4 variance channels.
    "out_channels": 8,
    "patch_size": 2,
    "sample_size": 128,
    "upcast_attention": False,
    "use_additional_conditions": None,
}

# FLUX.1-dev (black-forest-labs/FLUX.1-dev): 19 double-stream and 38 single-stream blocks of 24 heads of 128, T5-XXL
# hidden states (4096) and CLIP-L's pooled output (768) in, a guidance embedding (the guidance-distilled model),
# rotary position axes 16/56/56 over (unused, row, column). Latents are 2x2-packed: 16 channels x 4 = 64 inputs.
FLUX_DEV_TRANSFORMER: Config = {
    "_class_name": "FluxTransformer2DModel",
    "attention_head_dim": 128,
    "axes_dims_rope": [16, 56, 56],
    "guidance_embeds": True,
    "in_channels": 64,
    "joint_attention_dim": 4096,
    "num_attention_heads": 24,
    "num_layers": 19,
    "num_single_layers": 38,
    "out_channels": None,
    "patch_size": 1,
    "pooled_projection_dim": 768,
}
# FLUX.1-schnell: the same transformer without the guidance embedding (timestep-distilled, ~4 steps).
FLUX_SCHNELL_TRANSFORMER: Config = {**FLUX_DEV_TRANSFORMER, "guidance_embeds": False}
# FLUX.1-Fill-dev: the noisy latents, the masked image's latents and the 8x8-pixel mask (64 channels), each packed
# 2x2: (16 + 16 + 64) x 4 = 384 inputs; it predicts the 64 packed latent channels.
FLUX_FILL_TRANSFORMER: Config = {**FLUX_DEV_TRANSFORMER, "in_channels": 384, "out_channels": 64}
# Stable Diffusion 3 Medium (stabilityai/stable-diffusion-3-medium-diffusers): 24 joint (MMDiT) blocks of 24 heads
# of 64 over 2x2 patches of 16-channel latents; T5-XXL's hidden states (4096) beside the CLIPs' (768 + 1280, zero-padded
# to 4096) projected to 1536, the CLIPs' pooled outputs (768 + 1280 = 2048) into the time embedding.
SD3_MEDIUM_TRANSFORMER: Config = {
    "_class_name": "SD3Transformer2DModel",
    "attention_head_dim": 64,
    "caption_projection_dim": 1536,
    "in_channels": 16,
    "joint_attention_dim": 4096,
    "num_attention_heads": 24,
    "num_layers": 24,
    "out_channels": 16,
    "patch_size": 2,
    "pooled_projection_dim": 2048,
    "pos_embed_max_size": 192,
    "sample_size": 128,
}
# Stable Diffusion 3.5 Large: 38 blocks of 38 heads, RMS-normed queries and keys.
SD35_LARGE_TRANSFORMER: Config = {
    **SD3_MEDIUM_TRANSFORMER,
    "caption_projection_dim": 2432,
    "num_attention_heads": 38,
    "num_layers": 38,
    "qk_norm": "rms_norm",
}
# Stable Diffusion 3.5 Medium (MMDiT-X): SD3 Medium's size with qk-norm, a second self-attention over the image in
# its first 13 blocks, and position embeddings for up to 384 patches a side.
SD35_MEDIUM_TRANSFORMER: Config = {
    **SD3_MEDIUM_TRANSFORMER,
    "dual_attention_layers": list(range(13)),
    "pos_embed_max_size": 384,
    "qk_norm": "rms_norm",
}

# Chroma1-HD (lodestones/Chroma1-HD): Flux's blocks without the pooled text and guidance inputs; one approximator
# network gives every block's modulation from the time.
CHROMA_TRANSFORMER: Config = {
    "_class_name": "ChromaTransformer2DModel",
    "approximator_hidden_dim": 5120,
    "approximator_layers": 5,
    "approximator_num_channels": 64,
    "attention_head_dim": 128,
    "axes_dims_rope": [16, 56, 56],
    "in_channels": 64,
    "joint_attention_dim": 4096,
    "num_attention_heads": 24,
    "num_layers": 19,
    "num_single_layers": 38,
    "out_channels": None,
    "patch_size": 1,
}

# Z-Image (Tongyi-MAI/Z-Image; Z-Image-Turbo has the same transformer/config.json): the 6B single-stream DiT. 30 blocks
# of 30 heads of 128 over one sequence of image and text tokens, each kind refined first by 2 blocks of its own (the
# image's modulated by the time, the text's not); Qwen3-4B's hidden states (2560) in; 3D rotary axes 32/48/48 over
# (text position or frame, row, column) with theta 256; 2x2 patches of 16-channel latents.
Z_IMAGE_TRANSFORMER: Config = {
    "_class_name": "ZImageTransformer2DModel",
    "all_f_patch_size": [1],
    "all_patch_size": [2],
    "axes_dims": [32, 48, 48],
    "axes_lens": [1536, 512, 512],
    "cap_feat_dim": 2560,
    "dim": 3840,
    "in_channels": 16,
    "n_heads": 30,
    "n_kv_heads": 30,
    "n_layers": 30,
    "n_refiner_layers": 2,
    "norm_eps": 1e-05,
    "qk_norm": True,
    "rope_theta": 256.0,
    "t_scale": 1000.0,
}

# Qwen-Image (Qwen/Qwen-Image transformer/config.json; Qwen-Image-Edit-2509's is the same): the 20B MMDiT. 60
# dual-stream blocks (separate weights for the image and the text tokens, joint attention) of 24 heads of 128, with
# RMS-normed queries and keys; Qwen2.5-VL's hidden states (3584) in, RMS-normed first; 3D rotary axes 16/56/56 over
# (image index, row, column), centred on the image, the text's positions continuing past the image's; 2x2 patches of
# 16-channel latents (64 in), 16 out. The edit models append their reference images' latents to the sequence, each as
# a further image index.
QWEN_IMAGE_TRANSFORMER: Config = {
    "_class_name": "QwenImageTransformer2DModel",
    "attention_head_dim": 128,
    "axes_dims_rope": [16, 56, 56],
    "guidance_embeds": False,
    "in_channels": 64,
    "joint_attention_dim": 3584,
    "num_attention_heads": 24,
    "num_layers": 60,
    "out_channels": 16,
    "patch_size": 2,
}
# Qwen-Image-Edit-2511 (Qwen/Qwen-Image-Edit-2511 transformer/config.json): the same weights' layout, but the reference
# images' tokens are modulated as at time 0 (`zero_cond_t`), the generated ones at the step's time.
QWEN_IMAGE_EDIT_2511_TRANSFORMER: Config = {**QWEN_IMAGE_TRANSFORMER, "zero_cond_t": True}

# Anima (circlestone-labs/Anima-Base-v1.0-Diffusers transformer/config.json: NVIDIA's Cosmos-Predict2-2B DiT, which
# Anima fine-tunes): 28 blocks of 16 heads of 128 (self-attention, cross-attention to 1024-wide text, an MLP, each
# AdaLN-modulated through a 256-wide low-rank branch), 3D rotary positions (spatial scale 4), the padding mask as a
# 17th input channel, 1x2x2 patches of 16-channel latents.
ANIMA_TRANSFORMER: Config = {
    "_class_name": "CosmosTransformer3DModel",
    "adaln_lora_dim": 256,
    "attention_head_dim": 128,
    "concat_padding_mask": True,
    "extra_pos_embed_type": None,
    "in_channels": 16,
    "max_size": [128, 240, 240],
    "mlp_ratio": 4.0,
    "num_attention_heads": 16,
    "num_layers": 28,
    "out_channels": 16,
    "patch_size": [1, 2, 2],
    "rope_scale": [1.0, 4.0, 4.0],
    "text_embed_dim": 1024,
}
# Anima's LLM adapter (text_conditioner/config.json; `net.llm_adapter.` in the original file): 6 blocks over learned
# embeddings of the caption's T5 token ids (as queries), each self-attention, cross-attention to Qwen3-0.6B's last
# hidden states and an MLP; its output, padded with zeros to 512 tokens, is the transformer's text.
ANIMA_TEXT_CONDITIONER: Config = {
    "_class_name": "AnimaTextConditioner",
    "min_sequence_length": 512,
    "mlp_ratio": 4.0,
    "model_dim": 1024,
    "num_attention_heads": 16,
    "num_layers": 6,
    "source_dim": 1024,
    "target_dim": 1024,
    "target_vocab_size": 32128,
    "use_layer_norm": False,
    "use_self_attention": True,
}

# --- Würstchen v2 and Stable Cascade ------------------------------------------------------------------------------

# Stage C of Würstchen v2 (warp-ai/wuerstchen-prior): text -> 16-channel image embedding at 1/42.67 resolution.
WUERSTCHEN_PRIOR: Config = {
    "_class_name": "WuerstchenPrior",
    "c_in": 16,
    "c": 1536,
    "c_cond": 1280,
    "c_r": 64,
    "depth": 32,
    "nhead": 24,
    "dropout": 0.1,
}
# Stage B of Würstchen v2 (warp-ai/wuerstchen): image embedding + text -> VQGAN latents.
WUERSTCHEN_DECODER: Config = {
    "_class_name": "WuerstchenDiffNeXt",
    "c_in": 4,
    "c_out": 4,
    "c_r": 64,
    "patch_size": 2,
    "c_cond": 1024,
    "c_hidden": [320, 640, 1280, 1280],
    "nhead": [-1, 10, 20, 20],
    "blocks": [4, 4, 14, 4],
    "level_config": ["CT", "CTA", "CTA", "CTA"],
    "inject_effnet": [False, True, True, True],
    "effnet_embd": 16,
    "clip_embd": 1024,
    "kernel_size": 3,
    "dropout": 0.1,
}
# Stage A, shared by Würstchen v2 and Stable Cascade: a 4x VQGAN.
PAELLA_VQGAN: Config = {
    "_class_name": "PaellaVQModel",
    "in_channels": 3,
    "out_channels": 3,
    "up_down_scale_factor": 2,
    "levels": 2,
    "bottleneck_blocks": 12,
    "embed_dim": 384,
    "latent_channels": 4,
    "num_vq_embeddings": 8192,
    "scale_factor": 0.3764,
}
_CASCADE_PRIOR_BLOCK = ["SDCascadeResBlock", "SDCascadeTimestepBlock", "SDCascadeAttnBlock"]
# Stage C of Stable Cascade (stabilityai/stable-cascade-prior).
CASCADE_PRIOR_UNET: Config = {
    "_class_name": "StableCascadeUNet",
    "in_channels": 16,
    "out_channels": 16,
    "timestep_ratio_embedding_dim": 64,
    "patch_size": 1,
    "conditioning_dim": 2048,
    "block_out_channels": [2048, 2048],
    "num_attention_heads": [32, 32],
    "down_num_layers_per_block": [8, 24],
    "up_num_layers_per_block": [24, 8],
    "down_blocks_repeat_mappers": [1, 1],
    "up_blocks_repeat_mappers": [1, 1],
    "block_types_per_layer": [_CASCADE_PRIOR_BLOCK, _CASCADE_PRIOR_BLOCK],
    "clip_text_in_channels": 1280,
    "clip_text_pooled_in_channels": 1280,
    "clip_image_in_channels": 768,
    "clip_seq": 4,
    "kernel_size": 3,
    "dropout": [0.1, 0.1],
    "self_attn": True,
    "timestep_conditioning_type": ["sca", "crp"],
    "switch_level": [False],
}
# Stage B of Stable Cascade (stabilityai/stable-cascade).
CASCADE_DECODER_UNET: Config = {
    "_class_name": "StableCascadeUNet",
    "in_channels": 4,
    "out_channels": 4,
    "timestep_ratio_embedding_dim": 64,
    "patch_size": 2,
    "conditioning_dim": 1280,
    "block_out_channels": [320, 640, 1280, 1280],
    "down_num_layers_per_block": [2, 6, 28, 6],
    "up_num_layers_per_block": [6, 28, 6, 2],
    "down_blocks_repeat_mappers": [1, 1, 1, 1],
    "up_blocks_repeat_mappers": [3, 3, 2, 2],
    "num_attention_heads": [0, 0, 20, 20],
    "block_types_per_layer": [
        ["SDCascadeResBlock", "SDCascadeTimestepBlock"],
        ["SDCascadeResBlock", "SDCascadeTimestepBlock"],
        _CASCADE_PRIOR_BLOCK,
        _CASCADE_PRIOR_BLOCK,
    ],
    "clip_text_pooled_in_channels": 1280,
    "clip_seq": 4,
    "effnet_in_channels": 16,
    "pixel_mapper_in_channels": 3,
    "kernel_size": 3,
    "dropout": [0, 0, 0.1, 0.1],
    "self_attn": True,
    "timestep_conditioning_type": ["sca"],
}

# --- Tokenizers --------------------------------------------------------------------------------------------------

# tokenizer_config.json of the CLIP tokenizers. OpenAI's pads with the end token; OpenCLIP's (SD 2.x, SDXL's second
# tokenizer) pads with "!", token id 0.
CLIP_TOKENIZER: Config = {
    "tokenizer_class": "CLIPTokenizer",
    "model_max_length": 77,
    "do_lower_case": True,
    "add_prefix_space": False,
    "errors": "replace",
    "bos_token": "<|startoftext|>",
    "eos_token": "<|endoftext|>",
    "unk_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
}
OPEN_CLIP_TOKENIZER: Config = {**CLIP_TOKENIZER, "pad_token": "!"}
# The PixArt pipeline truncates prompts to 120 tokens itself.
T5_TOKENIZER: Config = {
    "tokenizer_class": "T5Tokenizer",
    "model_max_length": 512,
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
    "extra_ids": 100,
}

# tokenizer_config.json of Qwen3's tokenizer (Z-Image's tokenizer/, class Qwen2Tokenizer): byte-level BPE, no start
# token, "<|im_end|>" ends a turn (the chat template writes it), "<|endoftext|>" pads. Its chat template is the
# tiny tokenizer's concern (`onetrainer/tiny/qwen_tokenizer.py`).
QWEN3_TOKENIZER: Config = {
    "tokenizer_class": "Qwen2Tokenizer",
    "model_max_length": 131072,
    "add_bos_token": False,
    "add_prefix_space": False,
    "bos_token": None,
    "clean_up_tokenization_spaces": False,
    "eos_token": "<|im_end|>",
    "errors": "replace",
    "pad_token": "<|endoftext|>",
    "split_special_tokens": False,
    "unk_token": None,
}
# Qwen2.5-VL's tokenizer (Qwen-Image's tokenizer/, and inside Qwen-Image-Edit's processor/): Qwen3's settings; its
# added tokens and chat template differ (`onetrainer/tiny/qwen_tokenizer.py`).
QWEN25_VL_TOKENIZER: Config = QWEN3_TOKENIZER

# --- Image processors ---------------------------------------------------------------------------------------------

# Qwen2.5-VL's image processor (Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json; the Qwen-Image-Edit processor/
# folder carries it with the tokenizer): images resized to multiples of 28 px (14 px patches, merged 2x2) keeping
# their area within [3136, 12845056] px, CLIP's normalisation, each patch repeated over 2 frames.
QWEN2VL_IMAGE_PROCESSOR: Config = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "max_pixels": 12845056,
    "merge_size": 2,
    "min_pixels": 3136,
    "patch_size": 14,
    "temporal_patch_size": 2,
}

# --- Schedulers --------------------------------------------------------------------------------------------------

_SD_BETAS: Config = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "trained_betas": None,
    "clip_sample": False,
    "set_alpha_to_one": False,
    "steps_offset": 1,
    "skip_prk_steps": True,
}
PNDM_EPSILON: Config = {"_class_name": "PNDMScheduler", **_SD_BETAS, "prediction_type": "epsilon"}
DDIM_EPSILON: Config = {"_class_name": "DDIMScheduler", **_SD_BETAS, "prediction_type": "epsilon"}
# The 768 px SD 2.x models predict v instead of the noise.
DDIM_V_PREDICTION: Config = {"_class_name": "DDIMScheduler", **_SD_BETAS, "prediction_type": "v_prediction"}
# PixArt-alpha's: DPM-Solver++ on the original DDPM's linear betas.
DPM_SOLVER_PIXART: Config = {
    "_class_name": "DPMSolverMultistepScheduler",
    "algorithm_type": "dpmsolver++",
    "beta_start": 0.0001,
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "dynamic_thresholding_ratio": 0.995,
    "lower_order_final": True,
    "num_train_timesteps": 1000,
    "prediction_type": "epsilon",
    "sample_max_value": 1.0,
    "solver_order": 2,
    "solver_type": "midpoint",
    "steps_offset": 0,
    "thresholding": False,
    "timestep_spacing": "linspace",
    "trained_betas": None,
    "use_karras_sigmas": False,
    "variance_type": None,
}
# Würstchen and Stable Cascade: continuous-time DDPM with a cosine schedule; the models predict the noise.
DDPM_WUERSTCHEN: Config = {"_class_name": "DDPMWuerstchenScheduler", "scaler": 1.0, "s": 0.008}
EULER_EPSILON: Config = {
    "_class_name": "EulerDiscreteScheduler",
    **_SD_BETAS,
    "interpolation_type": "linear",
    "prediction_type": "epsilon",
    "sample_max_value": 1.0,
    "timestep_spacing": "leading",
    "use_karras_sigmas": False,
}
# Flux and Chroma: rectified flow, Euler over sigmas shifted by the image's token count (dev, Fill, Chroma) or not at
# all (schnell, shift 1).
FLOW_MATCH_EULER_DYNAMIC: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}
FLOW_MATCH_EULER_SCHNELL: Config = {**FLOW_MATCH_EULER_DYNAMIC, "shift": 1.0, "use_dynamic_shifting": False}
# Stable Diffusion 3 and 3.5: rectified flow at a fixed shift of 3.
FLOW_MATCH_EULER_SD3: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 3.0,
}
# Z-Image (Tongyi-MAI/Z-Image, scheduler_config.json): rectified flow at a fixed shift of 6. The pipeline passes a
# resolution-dependent `mu` too, which applies only with dynamic shifting: off.
Z_IMAGE_SCHEDULER: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 6.0,
    "use_dynamic_shifting": False,
}
# Z-Image-Turbo (Tongyi-MAI/Z-Image-Turbo): the distilled model samples (in ~8 steps, without CFG) at shift 3.
Z_IMAGE_TURBO_SCHEDULER: Config = {**Z_IMAGE_SCHEDULER, "shift": 3.0}
# Anima's scheduler (scheduler/config.json): flow-matching Euler at a fixed shift of 3, which the pipeline applies to
# its linear sigmas; no resolution-dependent shift.
ANIMA_SCHEDULER: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": False,
}
# Qwen-Image (Qwen/Qwen-Image scheduler/scheduler_config.json; Qwen-Image-Edit-2509's is the same): rectified flow,
# sigmas shifted exponentially by the image's token count (mu from 0.5 at 256 tokens to 0.9 at 8192, the pipelines
# compute it), the last one stretched to 0.02.
QWEN_IMAGE_SCHEDULER: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}
# Stage C lite (stabilityai/stable-cascade-prior, prior_lite): the 1B prior.
CASCADE_PRIOR_LITE_UNET: Config = {
    **CASCADE_PRIOR_UNET,
    "conditioning_dim": 1536,
    "block_out_channels": [1536, 1536],
    "num_attention_heads": [24, 24],
    "down_num_layers_per_block": [4, 12],
    "up_num_layers_per_block": [12, 4],
}

# --- Sana ---------------------------------------------------------------------------------------------------------

# Sana 1600M at 1024 px (Efficient-Large-Model/Sana_1600M_1024px_diffusers and its BF16 twin, transformer/config.json):
# diffusers' conversion script (scripts/convert_sana_to_diffusers.py, model SanaMS_1600M_P1_D20 at --image_size 1024)
# writes these values. 20 blocks of 70 linear-attention heads of 32 (2240 wide), cross-attention to the text in 20
# heads of 112, a GLUMBConv feed-forward (1x1 conv, 3x3 depthwise conv, 1x1 conv, 2.5x wide), no position embedding
# at 1024 px (`interpolation_scale` None), 1x1 patches of the DC-AE's 32-channel latents; Gemma-2's 2304-wide hidden
# states in.
SANA_1600M_TRANSFORMER: Config = {
    "_class_name": "SanaTransformer2DModel",
    "attention_bias": False,
    "attention_head_dim": 32,
    "caption_channels": 2304,
    "cross_attention_dim": 2240,
    "cross_attention_head_dim": 112,
    "dropout": 0.0,
    "guidance_embeds": False,
    "guidance_embeds_scale": 0.1,
    "in_channels": 32,
    "interpolation_scale": None,
    "mlp_ratio": 2.5,
    "norm_elementwise_affine": False,
    "norm_eps": 1e-06,
    "num_attention_heads": 70,
    "num_cross_attention_heads": 20,
    "num_layers": 20,
    "out_channels": 32,
    "patch_size": 1,
    "qk_norm": None,
    "sample_size": 32,
    "timestep_scale": 1.0,
}
# Sana's deep-compression autoencoder (mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers, the `vae` of Sana's diffusers
# folders; diffusers' scripts/convert_dcae_to_diffusers.py, "dc-ae-f32c32-sana-1.0"): 32x down to 32 channels, residual
# blocks in the first three stages and EfficientViT (multi-scale linear attention) blocks in the last three; the
# latents are scaled by 0.41407 (no shift).
SANA_DC_AE: Config = {
    "_class_name": "AutoencoderDC",
    "attention_head_dim": 32,
    "decoder_act_fns": "silu",
    "decoder_block_out_channels": [128, 256, 512, 512, 1024, 1024],
    "decoder_block_types": [
        "ResBlock",
        "ResBlock",
        "ResBlock",
        "EfficientViTBlock",
        "EfficientViTBlock",
        "EfficientViTBlock",
    ],
    "decoder_layers_per_block": [3, 3, 3, 3, 3, 3],
    "decoder_norm_types": "rms_norm",
    "decoder_qkv_multiscales": [[], [], [], [5], [5], [5]],
    "downsample_block_type": "conv",
    "encoder_block_out_channels": [128, 256, 512, 512, 1024, 1024],
    "encoder_block_types": [
        "ResBlock",
        "ResBlock",
        "ResBlock",
        "EfficientViTBlock",
        "EfficientViTBlock",
        "EfficientViTBlock",
    ],
    "encoder_layers_per_block": [2, 2, 2, 3, 3, 3],
    "encoder_qkv_multiscales": [[], [], [], [5], [5], [5]],
    "in_channels": 3,
    "latent_channels": 32,
    "scaling_factor": 0.41407,
    "upsample_block_type": "interpolate",
}
# Gemma-2 2B instruct (Efficient-Large-Model/gemma-2-2b-it, google/gemma-2-2b-it's weights; the `text_encoder` of Sana's
# diffusers folders, loaded as the bare Gemma2Model, which diffusers' conversion script takes from the causal LM with
# `get_decoder()`): 26 layers alternating sliding-window (4096) and full attention, 8 query heads and 4 key/value heads
# of 256 (queries wider than the 2304-wide model), logits soft-capped at 50 in attention. The values are transformers'
# Gemma2Config defaults, which are this model's.
GEMMA2_2B_TEXT: Config = {
    "architectures": ["Gemma2Model"],
    "model_type": "gemma2",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304,
    "initializer_range": 0.02,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": True,
    "vocab_size": 256000,
}
# Gemma's tokenizer (byte-fallback BPE, "▁" for spaces), as Sana's folders ship it: a start token before every text,
# no end token (SanaPipeline pads on the right itself).
GEMMA_TOKENIZER: Config = {
    "tokenizer_class": "GemmaTokenizer",
    "add_bos_token": True,
    "add_eos_token": False,
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
}
# Lumina-Image 2.0 (Alpha-VLLM/Lumina-Image-2.0 transformer/config.json): the 2.6B unified "NextDiT". 26 joint blocks
# of 24 query heads of 96 sharing 8 key/value heads (2304 wide) over one sequence of the caption's tokens and the
# image's, each kind refined first by 2 blocks of its own (the image's modulated by the time, the caption's not);
# Gemma-2 2B's hidden states (2304) in; 3D rotary axes 32/32/32 over (caption position, row, column); a SwiGLU rounded
# up to a multiple of 256; 2x2 patches of Flux's 16-channel latents.
LUMINA2_TRANSFORMER: Config = {
    "_class_name": "Lumina2Transformer2DModel",
    "axes_dim_rope": [32, 32, 32],
    "axes_lens": [300, 512, 512],
    "cap_feat_dim": 2304,
    "ffn_dim_multiplier": None,
    "hidden_size": 2304,
    "in_channels": 16,
    "multiple_of": 256,
    "norm_eps": 1e-05,
    "num_attention_heads": 24,
    "num_kv_heads": 8,
    "num_layers": 26,
    "num_refiner_layers": 2,
    "out_channels": None,
    "patch_size": 2,
    "sample_size": 128,
    "scaling_factor": 1.0,
}
# Lumina-Image 2.0 (scheduler/scheduler_config.json): rectified flow at a fixed shift of 6; the pipeline passes a
# resolution-dependent `mu` too, which applies only with dynamic shifting: off.
LUMINA2_SCHEDULER: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 6.0,
    "use_dynamic_shifting": False,
}
# Sana's sampler (scheduler/scheduler_config.json of the 1024 px folders; diffusers' conversion script's default
# "flow-dpm_solver"): DPM-Solver++ on flow sigmas shifted by 3 (4096 px: 6), the model predicting the flow.
SANA_SCHEDULER: Config = {
    "_class_name": "DPMSolverMultistepScheduler",
    "flow_shift": 3.0,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
}
# Sana 600M (Efficient-Large-Model/Sana_600M_1024px_diffusers): the conversion script's SanaMS_600M_P1_D28, 28 blocks
# of 36 heads of 32 (1152 wide), cross-attention in 16 heads of 72.
SANA_600M_TRANSFORMER: Config = {
    **SANA_1600M_TRANSFORMER,
    "num_attention_heads": 36,
    "num_cross_attention_heads": 16,
    "cross_attention_head_dim": 72,
    "cross_attention_dim": 1152,
    "num_layers": 28,
}
# SANA 1.5 4.8B (Efficient-Large-Model/SANA1.5_4.8B_1024px_diffusers): SanaMS1.5_4800M_P1_D60, the 1600M's blocks 60
# deep with RMS-normed queries and keys across the heads.
SANA15_4800M_TRANSFORMER: Config = {**SANA_1600M_TRANSFORMER, "num_layers": 60, "qk_norm": "rms_norm_across_heads"}

# --- Krea 2 -------------------------------------------------------------------------------------------------------

# Krea 2 (krea/Krea-2-Raw, krea/Krea-2-Turbo; transformer/config.json: diffusers' Krea2Transformer2DModel defaults,
# which its conversion writes): a single-stream MMDiT of 28 blocks, 48 query heads and 12 key/value heads of 128 (6144
# wide), a SwiGLU feed-forward 16384 wide, rotary positions split 32/48/48 over (t, row, column), 2x2 patches of the
# Qwen-Image VAE's 16 channels in (64). The text arrives as 12 tapped layers of Qwen3-VL-4B's 2560-wide states per
# token, fused by two blocks across the layers and two across the tokens (20 heads of 128, 6912 wide) before joining
# the image tokens.
KREA2_TRANSFORMER: Config = {
    "_class_name": "Krea2Transformer2DModel",
    "in_channels": 64,
    "num_layers": 28,
    "attention_head_dim": 128,
    "num_attention_heads": 48,
    "num_key_value_heads": 12,
    "intermediate_size": 16384,
    "timestep_embed_dim": 256,
    "text_hidden_dim": 2560,
    "num_text_layers": 12,
    "text_num_attention_heads": 20,
    "text_num_key_value_heads": 20,
    "text_intermediate_size": 6912,
    "num_layerwise_text_blocks": 2,
    "num_refiner_text_blocks": 2,
    "axes_dims_rope": [32, 48, 48],
    "rope_theta": 1000.0,
    "norm_eps": 1e-05,
}
# Qwen3-VL-4B-Instruct (Qwen/Qwen3-VL-4B-Instruct config.json) as Krea 2's text encoder, loaded as the bare
# Qwen3VLModel (the pipeline's class): a Qwen3 decoder of 36 layers, 32 query heads and 8 key/value heads of 128 over
# 2560 channels, RMS-normed queries and keys, interleaved multimodal rotary sections 24/20/20 (text tokens advance all
# three together); its vision tower of 24 blocks over 16 px patches, merged 2x2 into tokens of the decoder's width,
# blocks 5, 11 and 17 feeding the decoder's first layers (deepstack). The pipeline stacks the hidden states of the
# embedding output's 2nd, 5th, ... 35th successors (`text_encoder_select_layers`, 12 of them). Transformers 5 keeps
# `rope_theta` / `rope_scaling` in `rope_parameters`.
QWEN3_VL_4B_TEXT: Config = {
    "architectures": ["Qwen3VLModel"],
    "model_type": "qwen3_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": True,
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2560,
        "initializer_range": 0.02,
        "intermediate_size": 9728,
        "max_position_embeddings": 262144,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [24, 20, 20],
            "rope_type": "default",
            "rope_theta": 5000000,
        },
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": 151936,
    },
    "vision_config": {
        "deepstack_visual_indexes": [5, 11, 17],
        "depth": 24,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1024,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4096,
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 2560,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}
# The Krea 2 pipeline's taps of Qwen3-VL-4B's `hidden_states` (0 is the embedding output): every third layer from 2.
KREA2_SELECT_LAYERS: tuple[int, ...] = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)
# Krea 2's sampler (the pipeline's documented scheduler config): flow-matching Euler, sigmas shifted exponentially by
# the image's token count, mu from 0.5 at 256 tokens to 1.15 at 6400 (the distilled Turbo model samples at mu 1.15).
KREA2_SCHEDULER: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 6400,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "time_shift_type": "exponential",
    "use_dynamic_shifting": True,
}


# The Pixtral vision tower of Mistral Small 3.x / Ministral 3 (`Mistral3ForConditionalGeneration.vision_config`), the
# same in FLUX.2 [dev]'s and ERNIE-Image's text encoders: counted by the estimate, never run (they prompt with text).
PIXTRAL_VISION: dict[str, Any] = {
    "model_type": "pixtral",
    "attention_dropout": 0.0,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "image_size": 1540,
    "intermediate_size": 4096,
    "num_attention_heads": 16,
    "num_channels": 3,
    "num_hidden_layers": 24,
    "patch_size": 14,
    "rope_theta": 10000.0,
}

# --- HiDream-I1 ----------------------------------------------------------------------------------------------------

# HiDream-I1-Full (HiDream-ai/HiDream-I1-Full transformer/config.json): 16 double-stream and 32 single-stream blocks
# of 20 heads of 128 (2560 wide), each block's feed-forward a mixture of 4 routed SwiGLU experts (2 chosen per token)
# beside a shared one, rotary positions split 64/32/32, 2x2 patches of the Flux VAE's 16 channels. Each block reads
# one tapped layer of Llama-3.1-8B's hidden states (`llama_layers`: the 32 decoder layers' outputs in order, the last
# one again for the remaining 16 blocks), projected from 4096; T5-XXL's states (4096) are projected once; the pooled
# CLIP-L and CLIP-G outputs (768 + 1280) join the time embedding.
HIDREAM_I1_TRANSFORMER: Config = {
    "_class_name": "HiDreamImageTransformer2DModel",
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 16,
    "num_single_layers": 32,
    "attention_head_dim": 128,
    "num_attention_heads": 20,
    "caption_channels": [4096, 4096],
    "text_emb_dim": 2048,
    "num_routed_experts": 4,
    "num_activated_experts": 2,
    "axes_dims_rope": [64, 32, 32],
    "max_resolution": [128, 128],
    "llama_layers": [*range(32), *([31] * 16)],
}
# HiDream-I1's CLIP-L and CLIP-G (text_encoder/, text_encoder_2/): Long-CLIP's towers, with 248 positions (the pipeline
# prompts them with up to 218 tokens), both with their projections (the pooled outputs condition the transformer).
LONG_CLIP_L_PROJECTED_TEXT: Config = {**CLIP_L_PROJECTED_TEXT, "max_position_embeddings": 248}
LONG_CLIP_G_PROJECTED_TEXT: Config = {**CLIP_G_PROJECTED_TEXT, "max_position_embeddings": 248}
# Llama-3.1-8B-Instruct (meta-llama/Llama-3.1-8B-Instruct config.json) as HiDream-I1's fourth text encoder, loaded as
# LlamaForCausalLM (the pipeline's class; its LM head is never run): 32 decoder layers, 32 query heads and 8 key/value
# heads of 128 over 4096 channels, Llama 3's stretched rotary frequencies. The pipeline keeps every layer's output
# (`hidden_states[1:]`, the last after the final norm). Transformers 5 keeps `rope_theta` / `rope_scaling` in
# `rope_parameters`.
LLAMA31_8B_TEXT: Config = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 128256,
}
# Llama 3.1 Instruct's tokenizer_config.json: byte-level BPE (tiktoken's), the start token before every text,
# "<|eot_id|>" ends a turn; no padding token (HiDreamImagePipeline pads with the end token). Its vocabulary is the
# tiny tokenizer's concern (`onetrainer/tiny/llama_tokenizer.py`).
LLAMA3_TOKENIZER: Config = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "model_max_length": 131072,
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<|eot_id|>",
    "clean_up_tokenization_spaces": True,
}
# HiDream-I1-Full (scheduler/scheduler_config.json): flow-matching UniPC at a shift of 3 (its `flow_shift`), which the
# family samples with as the flow-matching Euler sampler's `shift` (OneTrainer reads the folder's scheduler as
# FlowMatchEulerDiscreteScheduler too). HiDream-ai's own code (HiDream-I1 gradio_demo.py) samples Full at shift 3 with
# its flow UniPC (50 steps, CFG 5), the distilled Dev at 6 (28 steps) and Fast at 3 (16 steps) with its flash Euler,
# both without CFG; the hub file's field names were not read here (`hidream.euler_config` takes `shift` or
# `flow_shift`).
HIDREAM_I1_FULL_SCHEDULER: Config = {
    "_class_name": "UniPCMultistepScheduler",
    "flow_shift": 3.0,
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
}

# --- Wan 2.1 / 2.2 (Wan-AI/Wan2.1-T2V-1.3B-Diffusers, Wan2.1-T2V-14B-Diffusers, Wan2.2-T2V-A14B-Diffusers) ---------
# The text-to-video transformer: 3-D patches (1, 2, 2) of 16-channel latents, self-attention with RMS-normed queries
# and keys over all heads, cross-attention to UMT5's 4096-wide states (normed first), a 256-frequency time embedding.
WAN21_T2V_1_3B_TRANSFORMER: Config = {
    "_class_name": "WanTransformer3DModel",
    "added_kv_proj_dim": None,
    "attention_head_dim": 128,
    "cross_attn_norm": True,
    "eps": 1e-06,
    "ffn_dim": 8960,
    "freq_dim": 256,
    "image_dim": None,
    "in_channels": 16,
    "num_attention_heads": 12,
    "num_layers": 30,
    "out_channels": 16,
    "patch_size": [1, 2, 2],
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 1024,
    "text_dim": 4096,
}
WAN21_T2V_14B_TRANSFORMER: Config = {
    **WAN21_T2V_1_3B_TRANSFORMER,
    "ffn_dim": 13824,
    "num_attention_heads": 40,
    "num_layers": 40,
}
# Wan 2.2 A14B: two experts of the 14B's shape (transformer/ for the high-noise steps, transformer_2/ for the rest).
WAN22_T2V_A14B_TRANSFORMER: Config = WAN21_T2V_14B_TRANSFORMER
# Wan 2.1's causal 3-D VAE (AutoencoderKLWan): 8x spatial, 4x temporal after the first frame, 16 latent channels
# normalised per channel; Qwen-Image's VAE is the same network and statistics.
WAN_VAE: Config = {**QWEN_IMAGE_VAE, "_class_name": "AutoencoderKLWan"}
# UMT5-XXL's encoder (google/umt5-xxl, Wan's text_encoder/): T5 v1.1 XXL's shape with a 256k multilingual vocabulary and
# per-layer relative position biases.
UMT5_XXL_ENCODER: Config = {
    **T5_XXL_ENCODER,
    "architectures": ["UMT5EncoderModel"],
    "model_type": "umt5",
    "scalable_attention": True,
    "tokenizer_class": "T5Tokenizer",
    "vocab_size": 256384,
}
# Wan's tokenizer/ (google/umt5-xxl's): a SentencePiece T5 tokenizer; the pipeline pads and cuts captions to 512.
UMT5_TOKENIZER: Config = {**T5_TOKENIZER, "extra_ids": 300}
# The Wan pipelines' sampler (scheduler_config.json): UniPC on flow sigmas, shifted by 3 (the 480p models' shift).
WAN_SCHEDULER: Config = {
    "_class_name": "UniPCMultistepScheduler",
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "beta_start": 0.0001,
    "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995,
    "final_sigmas_type": "zero",
    "flow_shift": 3.0,
    "lower_order_final": True,
    "num_train_timesteps": 1000,
    "predict_x0": True,
    "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": False,
    "sample_max_value": 1.0,
    "solver_order": 2,
    "solver_p": None,
    "solver_type": "bh2",
    "steps_offset": 0,
    "thresholding": False,
    "timestep_spacing": "linspace",
    "trained_betas": None,
    "use_beta_sigmas": False,
    "use_exponential_sigmas": False,
    "use_flow_sigmas": True,
    "use_karras_sigmas": False,
}
# Wan 2.2 A14B's model_index.json: the high-noise expert runs while the timestep is at least 0.875 · 1000.
WAN22_BOUNDARY_RATIO = 0.875

# --- HunyuanVideo (hunyuanvideo-community/HunyuanVideo, tencent/HunyuanVideo in diffusers' layout) ------------------
# The text-to-video transformer: 20 double-stream and 40 single-stream blocks over (1, 2, 2) patches of 16-channel
# latents, a token refiner (2 blocks) over Llama's states, CLIP-L's pooled output and the guidance value in the time
# embedding (guidance-distilled), 3-D rotary embeddings split 16/56/56 over (frames, rows, columns). diffusers' defaults
# for HunyuanVideoTransformer3DModel are this config.
HUNYUAN_VIDEO_TRANSFORMER: Config = {
    "_class_name": "HunyuanVideoTransformer3DModel",
    "attention_head_dim": 128,
    "guidance_embeds": True,
    "image_condition_type": None,
    "in_channels": 16,
    "mlp_ratio": 4.0,
    "num_attention_heads": 24,
    "num_layers": 20,
    "num_refiner_layers": 2,
    "num_single_layers": 40,
    "out_channels": 16,
    "patch_size": 2,
    "patch_size_t": 1,
    "pooled_projection_dim": 768,
    "qk_norm": "rms_norm",
    "rope_axes_dim": [16, 56, 56],
    "rope_theta": 256.0,
    "text_embed_dim": 4096,
}
# HunyuanVideo's causal 3-D VAE (AutoencoderKLHunyuanVideo): 8x spatial, 4x temporal after the first frame, 16 latent
# channels scaled by one factor (no per-channel statistics).
HUNYUAN_VIDEO_VAE: Config = {
    "_class_name": "AutoencoderKLHunyuanVideo",
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["HunyuanVideoDownBlock3D"] * 4,
    "in_channels": 3,
    "latent_channels": 16,
    "layers_per_block": 2,
    "mid_block_add_attention": True,
    "norm_num_groups": 32,
    "out_channels": 3,
    "scaling_factor": 0.476986,
    "spatial_compression_ratio": 8,
    "temporal_compression_ratio": 4,
    "up_block_types": ["HunyuanVideoUpBlock3D"] * 4,
}
# The text encoder: the language model of LLaVA-Llama-3-8B (xtuner/llava-llama-3-8b-v1_1), a LlamaModel (no LM head)
# with Llama 3's shape and a vocabulary of 128320 (Llama 3's and LLaVA's added tokens); the pipeline reads its
# third-last hidden states.
HUNYUAN_VIDEO_LLAMA_TEXT: Config = {
    "architectures": ["LlamaModel"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 128320,
}
# Its tokenizer: Llama 3's byte-level BPE; captions are padded on the right (the pipeline crops the template's tokens
# off the front).
HUNYUAN_VIDEO_LLAMA_TOKENIZER: Config = {**LLAMA3_TOKENIZER, "padding_side": "right"}
# The pipeline's sampler (scheduler_config.json): flow-matching Euler at a fixed shift of 7.
HUNYUAN_VIDEO_SCHEDULER: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 7.0,
    "use_dynamic_shifting": False,
}
# --- Wan 2.1 I2V (Wan-AI/Wan2.1-I2V-14B-480P-Diffusers, Wan2.1-I2V-14B-720P-Diffusers) --------------------------------
# The image-to-video transformer: the T2V 14B's with 36 input channels (the noisy latents, 4 mask channels, the start
# image's 16 latent channels) and image cross-attention (`image_dim` 1280: the CLIP states, projected to 5120 and
# attended to by each block's `add_k_proj` / `add_v_proj` beside the text). 480p and 720p share the shape.
WAN21_I2V_14B_TRANSFORMER: Config = {
    **WAN21_T2V_14B_TRANSFORMER,
    "added_kv_proj_dim": 5120,
    "image_dim": 1280,
    "in_channels": 36,
}
# Its image encoder: OpenCLIP ViT-H/14's vision tower (the penultimate layer's 257 states are the condition).
OPEN_CLIP_H_VISION: Config = {
    "architectures": ["CLIPVisionModel"],
    "attention_dropout": 0.0,
    "dropout": 0.0,
    "hidden_act": "gelu",
    "hidden_size": 1280,
    "image_size": 224,
    "initializer_factor": 1.0,
    "initializer_range": 0.02,
    "intermediate_size": 5120,
    "layer_norm_eps": 1e-05,
    "model_type": "clip_vision_model",
    "num_attention_heads": 16,
    "num_channels": 3,
    "num_hidden_layers": 32,
    "patch_size": 14,
    "projection_dim": 1024,
}
# Its image_processor/ (preprocessor_config.json): CLIP's 224 px resize, centre crop and normalisation.
CLIP_IMAGE_PROCESSOR: Config = {
    "crop_size": {"height": 224, "width": 224},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 224},
}
# --- HunyuanVideo 1.5 (hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v) ---------------------------------
# The 8.3B text-to-video transformer: 54 dual-stream blocks over 1x1 patches of the 32-channel latents of its own VAE
# (16x spatial, 4x temporal), taking 65 input channels (the latents, a conditioning latent and its mask: zeros for text
# to video), a token refiner over Qwen2.5-VL's 3584-wide states, a projection of the ByT5 glyph encoder's 1472-wide
# states and one of SigLIP's 1152-wide image embeddings (masked out for text to video).
HUNYUAN_VIDEO15_480P_T2V_TRANSFORMER: Config = {
    "_class_name": "HunyuanVideo15Transformer3DModel",
    "attention_head_dim": 128,
    "image_embed_dim": 1152,
    "in_channels": 65,
    "mlp_ratio": 4.0,
    "num_attention_heads": 16,
    "num_layers": 54,
    "num_refiner_layers": 2,
    "out_channels": 32,
    "patch_size": 1,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "rope_axes_dim": [16, 56, 56],
    "rope_theta": 256.0,
    # As diffusers' converter writes the 480p T2V transformer (scripts/convert_hunyuan_video1_5_to_diffusers.py,
    # TRANSFORMER_CONFIGS["480p_t2v"]): the pipeline's default size is from 640, and it is trained as "i2v" too.
    "target_size": 640,
    "task_type": "i2v",
    "text_embed_2_dim": 1472,
    "text_embed_dim": 3584,
    "use_meanflow": False,
}
# Its causal 3-D VAE: 16x spatial and 4x temporal compression into 32 channels, scaled by 1.03682 (no shift).
HUNYUAN_VIDEO15_VAE: Config = {
    "_class_name": "AutoencoderKLHunyuanVideo15",
    "block_out_channels": [128, 256, 512, 1024, 1024],
    "downsample_match_channel": True,
    "in_channels": 3,
    "latent_channels": 32,
    "layers_per_block": 2,
    "out_channels": 3,
    "scaling_factor": 1.03682,
    "spatial_compression_ratio": 16,
    "temporal_compression_ratio": 4,
    "upsample_match_channel": True,
}
# Qwen2.5-VL-7B's decoder alone (Qwen2_5_VLTextModel: no vision tower, no LM head), the pipeline's text_encoder: its
# third-last hidden states of the prompt in the pipeline's chat template.
QWEN25_VL_7B_TEXT_MODEL: Config = {
    "architectures": ["Qwen2_5_VLTextModel"],
    "model_type": "qwen2_5_vl_text",
    **{
        k: v
        for k, v in QWEN25_VL_7B_TEXT.items()
        if not k.startswith(("vision", "image_", "video_", "architectures", "model_type"))
    },
}
# The glyph encoder (text_encoder_2): ByT5-small's encoder (Glyph-SDXL-v2's), reading the quoted text of a prompt as
# bytes; the pipeline pads it to 256 tokens.
BYT5_SMALL_ENCODER: Config = {
    **T5_XXL_ENCODER,
    "d_ff": 3584,
    "d_kv": 64,
    "d_model": 1472,
    "num_decoder_layers": 4,
    "num_heads": 6,
    "num_layers": 12,
    "tie_word_embeddings": False,
    "vocab_size": 384,
}
# ByT5's tokenizer (bytes + 3 special tokens + 125 extra ids), which builds without any file.
BYT5_TOKENIZER: Config = {
    "tokenizer_class": "ByT5Tokenizer",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
    "extra_ids": 125,
}
# The 480p text-to-video model's sampler: flow-matching Euler shifted by 5, on the pipeline's linear sigmas.
HUNYUAN_VIDEO15_480P_SCHEDULER: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 5.0,
    "use_dynamic_shifting": False,
}
# Its guider (guider/guider_config.json, a ClassifierFreeGuidance): the guidance scale.
HUNYUAN_VIDEO15_480P_GUIDANCE_SCALE = 6.0
