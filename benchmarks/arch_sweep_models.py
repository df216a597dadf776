"""`transformers` architectures outside the real-model suite, from tiny configs (nothing is
downloaded; every setting not named here is the library's default), for
`benchmarks/arch_sweep.py`.

    fusion-plan tune --model benchmarks/arch_sweep_models.py:bloom --shape B=2 --dynamic S=9..16

Each factory returns `(model, inputs)` like `benchmarks/models/gpt2.py`: text models take
`(B, S)` (token ids, plus an attention mask where the name says so), vision models
`(B, IMG)` (a `(B, 3, IMG, IMG)` image; models with learned position embeddings for one image
size take only `IMG` equal to it), audio models `(B, N)` (N samples of a waveform). Inputs
with a mask are keyword arguments, as users pass them. Random weights from the seed in
effect, eval mode.
"""

from __future__ import annotations

import torch
import transformers as T

V = 128
TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
IMG_FIXED = 32


def _ids(B: int, S: int) -> torch.Tensor:
    return torch.randint(0, V, (B, S))


def _mask(B: int, S: int) -> torch.Tensor:
    return torch.ones(B, S, dtype=torch.long)


def _with_mask(B: int, S: int) -> dict[str, torch.Tensor]:
    """Keyword inputs, as a user calls a Hugging Face model."""
    return {"input_ids": _ids(B, S), "attention_mask": _mask(B, S)}


def _image(B: int, IMG: int) -> torch.Tensor:
    return torch.randn(B, 3, IMG, IMG)


def _causal(model_cls, config) -> torch.nn.Module:
    return model_cls(config).eval()


# --- decoders (causal LM heads, default use_cache) ---------------------------------------


def longformer(B: int = 2, S: int = 16):
    """Runs as many graphs under torch.compile: its padding to the attention window reads
    a data-dependent size (graph breaks at default settings)."""
    cfg = T.LongformerConfig(vocab_size=V, attention_window=[4, 4], **TEXT)
    return T.LongformerModel(cfg).eval(), (_ids(B, S),)


def opt(B: int = 2, S: int = 16):
    cfg = T.OPTConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=64,
        word_embed_proj_dim=32,
        max_position_embeddings=128,
    )
    return _causal(T.OPTForCausalLM, cfg), _with_mask(B, S)


def bloom(B: int = 2, S: int = 16):
    cfg = T.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4)
    return _causal(T.BloomForCausalLM, cfg), _with_mask(B, S)


def falcon(B: int = 2, S: int = 16):
    cfg = T.FalconConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    return _causal(T.FalconForCausalLM, cfg), (_ids(B, S),)


def qwen2(B: int = 2, S: int = 16):
    cfg = T.Qwen2Config(vocab_size=V, num_key_value_heads=2, **TEXT)
    return _causal(T.Qwen2ForCausalLM, cfg), _with_mask(B, S)


def phi(B: int = 2, S: int = 16):
    cfg = T.PhiConfig(vocab_size=V, **TEXT)
    return _causal(T.PhiForCausalLM, cfg), (_ids(B, S),)


def gemma(B: int = 2, S: int = 16):
    cfg = T.GemmaConfig(vocab_size=V, num_key_value_heads=1, head_dim=8, **TEXT)
    return _causal(T.GemmaForCausalLM, cfg), (_ids(B, S),)


def gemma2(B: int = 2, S: int = 16):
    cfg = T.Gemma2Config(vocab_size=V, num_key_value_heads=2, head_dim=8, sliding_window=8, **TEXT)
    return _causal(T.Gemma2ForCausalLM, cfg), (_ids(B, S),)


def gptj(B: int = 2, S: int = 16):
    cfg = T.GPTJConfig(vocab_size=V, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=128)
    return _causal(T.GPTJForCausalLM, cfg), (_ids(B, S),)


def gpt_neo(B: int = 2, S: int = 16):
    cfg = T.GPTNeoConfig(
        vocab_size=V,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        window_size=8,
        max_position_embeddings=128,
    )
    return _causal(T.GPTNeoForCausalLM, cfg), (_ids(B, S),)


def codegen(B: int = 2, S: int = 16):
    cfg = T.CodeGenConfig(
        vocab_size=V,
        n_embd=32,
        n_layer=2,
        n_head=4,
        rotary_dim=4,
        n_positions=128,
        n_ctx=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    return _causal(T.CodeGenForCausalLM, cfg), (_ids(B, S),)


def stablelm(B: int = 2, S: int = 16):
    cfg = T.StableLmConfig(vocab_size=V, num_key_value_heads=2, **TEXT)
    return _causal(T.StableLmForCausalLM, cfg), (_ids(B, S),)


# --- decoders, base models (no LM head, default use_cache) --------------------------------


def mistral(B: int = 2, S: int = 16):
    cfg = T.MistralConfig(vocab_size=V, num_key_value_heads=2, **TEXT)
    return T.MistralModel(cfg).eval(), _with_mask(B, S)


def gpt_neox(B: int = 2, S: int = 16):
    cfg = T.GPTNeoXConfig(vocab_size=V, **TEXT)
    return T.GPTNeoXModel(cfg).eval(), (_ids(B, S),)


def gpt_bigcode(B: int = 2, S: int = 16):
    """Multi-query attention (the library's default)."""
    cfg = T.GPTBigCodeConfig(
        vocab_size=V,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_inner=64,
        n_positions=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    return T.GPTBigCodeModel(cfg).eval(), _with_mask(B, S)


def mixtral(B: int = 2, S: int = 16):
    cfg = T.MixtralConfig(
        vocab_size=V, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **TEXT
    )
    return T.MixtralModel(cfg).eval(), (_ids(B, S),)


def qwen2_moe(B: int = 2, S: int = 16):
    cfg = T.Qwen2MoeConfig(
        vocab_size=V,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
        **TEXT,
    )
    return T.Qwen2MoeModel(cfg).eval(), _with_mask(B, S)


def mamba(B: int = 2, S: int = 16):
    cfg = T.MambaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, state_size=8)
    return T.MambaModel(cfg).eval(), (_ids(B, S),)


# --- encoders (token ids and an attention mask) -------------------------------------------


def roberta(B: int = 2, S: int = 16):
    cfg = T.RobertaConfig(vocab_size=V, **TEXT)
    return T.RobertaModel(cfg).eval(), _with_mask(B, S)


def distilbert(B: int = 2, S: int = 16):
    cfg = T.DistilBertConfig(vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64)
    return T.DistilBertModel(cfg).eval(), _with_mask(B, S)


def albert(B: int = 2, S: int = 16):
    cfg = T.AlbertConfig(vocab_size=V, embedding_size=16, **TEXT)
    return T.AlbertModel(cfg).eval(), _with_mask(B, S)


def electra(B: int = 2, S: int = 16):
    cfg = T.ElectraConfig(vocab_size=V, embedding_size=16, **TEXT)
    return T.ElectraModel(cfg).eval(), _with_mask(B, S)


def deberta_v2(B: int = 2, S: int = 16):
    cfg = T.DebertaV2Config(
        vocab_size=V,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_buckets=16,
        max_relative_positions=-1,
        **TEXT,
    )
    return T.DebertaV2Model(cfg).eval(), _with_mask(B, S)


def mobilebert(B: int = 2, S: int = 16):
    cfg = T.MobileBertConfig(
        vocab_size=V,
        hidden_size=32,
        embedding_size=16,
        true_hidden_size=16,
        intra_bottleneck_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_feedforward_networks=2,
    )
    return T.MobileBertModel(cfg).eval(), _with_mask(B, S)


def clip_text(B: int = 2, S: int = 16):
    cfg = T.CLIPTextConfig(
        vocab_size=V, max_position_embeddings=64, bos_token_id=0, eos_token_id=2, **TEXT
    )
    return T.CLIPTextModel(cfg).eval(), (_ids(B, S),)


# --- encoder-decoders (S: the decoder's length) -------------------------------------------


def bart(B: int = 2, S: int = 16):
    cfg = T.BartConfig(
        vocab_size=V,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
    )
    model = T.BartModel(cfg).eval()
    return model, {
        "input_ids": torch.randint(0, V, (B, 12)),
        "attention_mask": torch.ones(B, 12, dtype=torch.long),
        "decoder_input_ids": _ids(B, S),
    }


def whisper(B: int = 2, S: int = 16):
    cfg = T.WhisperConfig(
        vocab_size=V,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
    )
    model = T.WhisperModel(cfg).eval()
    features = torch.randn(B, cfg.num_mel_bins, 2 * cfg.max_source_positions)
    return model, {"input_features": features, "decoder_input_ids": _ids(B, S)}


def t5(B: int = 2, S: int = 16):
    cfg = T.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    model = T.T5Model(cfg).eval()
    return model, {
        "input_ids": torch.randint(0, V, (B, 12)),
        "attention_mask": torch.ones(B, 12, dtype=torch.long),
        "decoder_input_ids": _ids(B, S),
    }


# --- vision -------------------------------------------------------------------------------


def deit(B: int = 2, IMG: int = IMG_FIXED):
    cfg = T.DeiTConfig(image_size=IMG_FIXED, patch_size=8, **TEXT)
    return T.DeiTModel(cfg).eval(), (_image(B, IMG),)


def beit(B: int = 2, IMG: int = IMG_FIXED):
    cfg = T.BeitConfig(image_size=IMG_FIXED, patch_size=8, use_relative_position_bias=True, **TEXT)
    return T.BeitModel(cfg).eval(), (_image(B, IMG),)


def clip_vision(B: int = 2, IMG: int = IMG_FIXED):
    cfg = T.CLIPVisionConfig(image_size=IMG_FIXED, patch_size=8, **TEXT)
    return T.CLIPVisionModel(cfg).eval(), (_image(B, IMG),)


def segformer(B: int = 2, IMG: int = 32):
    cfg = T.SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
    )
    return T.SegformerModel(cfg).eval(), (_image(B, IMG),)


def resnet(B: int = 2, IMG: int = 32):
    cfg = T.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"
    )
    return T.ResNetModel(cfg).eval(), (_image(B, IMG),)


def mobilevit(B: int = 2, IMG: int = 64):
    cfg = T.MobileViTConfig(
        image_size=64,
        hidden_sizes=[16, 24, 32],
        neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
        num_attention_heads=2,
    )
    return T.MobileViTModel(cfg).eval(), (_image(B, IMG),)


def dinov2(B: int = 2, IMG: int = IMG_FIXED):
    cfg = T.Dinov2Config(image_size=IMG_FIXED, patch_size=8, **TEXT)
    return T.Dinov2Model(cfg).eval(), (_image(B, IMG),)


def convnext(B: int = 2, IMG: int = 32):
    cfg = T.ConvNextConfig(num_stages=2, depths=[1, 1], hidden_sizes=[16, 32])
    return T.ConvNextModel(cfg).eval(), (_image(B, IMG),)


def swin(B: int = 2, IMG: int = 32):
    cfg = T.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4
    )
    return T.SwinModel(cfg).eval(), (_image(B, IMG),)


# --- audio --------------------------------------------------------------------------------


def wav2vec2(B: int = 2, N: int = 512):
    """Takes `(B, N)`: N audio samples (a 16-channel conv feature extractor, strides 5 and 2)."""
    cfg = T.Wav2Vec2Config(
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        **TEXT,
    )
    return T.Wav2Vec2Model(cfg).eval(), (torch.randn(B, N),)
