"""The model zoo: public model definitions from torchvision, timm and transformers, built with
random weights (no downloads), each with example inputs and a training loss.

Every entry builds at two sizes from one builder:

* ``"small"`` — CI on the CPU: images 2x3x64x64 (32x32 for the ViTs and DeiT), text 2x16,
  hidden widths 32-64, 2 layers, and fewer blocks per stage for ConvNeXt, ViT, DeiT, Swin and
  ShuffleNet (compile time grows with depth); the building blocks (and so the graphs' op mix)
  are the real ones.
* ``"real"`` — ``bench/models.py``: images 64x3x224x224, text 16x512, the published
  widths (BERT-base, GPT-2, t5-small, whisper-base, TinyLlama, Mistral-7B, Qwen2-0.5B), with
  the decoders cut to a few layers so that compiling stays in minutes.

Dropout is off everywhere (configs, ``nn.Dropout``, timm's drop-path), ``use_cache=False``,
and the attention implementation is left at the library's default (``sdpa`` in
transformers): the suite exercises what users get. Build under ``with torch.device(...)`` to
create the model and its inputs on a device directly; :func:`build` seeds the RNG.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from .imports import import_optional

Size = Literal["small", "real"]
SIZES: tuple[Size, ...] = ("small", "real")


@dataclasses.dataclass
class Built:
    """One built model: call it as ``model(*args, **kwargs)`` for inference and as
    ``model(*args, **kwargs, **train_kwargs)`` for training, whose output ``loss_fn`` maps to a
    scalar loss."""

    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    loss_fn: Callable[[Any], torch.Tensor]
    train_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """A zoo entry: ``builder(size)`` returns a :class:`Built`; ``package`` must be importable."""

    name: str
    package: Literal["torchvision", "timm", "transformers"]
    builder: Callable[[Size], Built]
    description: str


REGISTRY: dict[str, ModelCase] = {}


def _register(name: str, package: Literal["torchvision", "timm", "transformers"], description: str
              ) -> Callable[[Callable[[Size], Built]], Callable[[Size], Built]]:
    def wrap(builder: Callable[[Size], Built]) -> Callable[[Size], Built]:
        REGISTRY[name] = ModelCase(name, package, builder, description)
        return builder
    return wrap


def names() -> list[str]:
    """Every model's name, in registration order."""
    return list(REGISTRY)


def build(name: str, size: Size = "small", seed: int = 0) -> Built:
    """Build model ``name`` at ``size`` on the current default device, seeded with ``seed``."""
    if name not in REGISTRY:
        raise KeyError(f"unknown model {name!r}; the zoo has: {', '.join(REGISTRY)}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    case = REGISTRY[name]
    if import_optional(case.package) is None:
        raise ModuleNotFoundError(f"model {name!r} needs {case.package}: pip install {case.package}",
                                  name=case.package)
    torch.manual_seed(seed)
    built = case.builder(size)
    _disable_dropout(built.model)
    return built


def _disable_dropout(model: nn.Module) -> None:
    """Zero every dropout and stochastic-depth probability left in ``model``."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        if hasattr(module, "drop_prob"):  # timm's DropPath / DropBlock
            module.drop_prob = 0.0


def _pick(size: Size, small: Any, real: Any) -> Any:
    return small if size == "small" else real


# --------------------------------------------------------------------------- #
# Vision
# --------------------------------------------------------------------------- #


def _vision(model: nn.Module, size: Size, classes: int, small_hw: int = 64) -> Built:
    batch, hw = _pick(size, (2, small_hw), (64, 224))
    images = torch.randn(batch, 3, hw, hw)
    labels = torch.randint(0, classes, (batch,))
    return Built(model, (images,), {}, functools.partial(_cross_entropy, labels=labels))


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def _tv_builder(arch: str, **extra: Any) -> Callable[[Size], Built]:
    def builder(size: Size) -> Built:
        models = import_optional("torchvision").models
        classes = _pick(size, 10, 1000)
        return _vision(getattr(models, arch)(weights=None, num_classes=classes, **extra), size, classes)
    return builder


def _timm_builder(arch: str, small: dict[str, Any] | None = None, small_hw: int = 64
                  ) -> Callable[[Size], Built]:
    def builder(size: Size) -> Built:
        timm = import_optional("timm")
        classes = _pick(size, 10, 1000)
        extra = (small or {}) if size == "small" else {}
        model = timm.create_model(arch, pretrained=False, num_classes=classes, **extra)
        return _vision(model, size, classes, small_hw)
    return builder


_register("tv_resnet18", "torchvision", "torchvision ResNet-18")(_tv_builder("resnet18"))
_register("tv_mobilenet_v3_small", "torchvision", "torchvision MobileNetV3-small (hardswish, SE)")(
    _tv_builder("mobilenet_v3_small", dropout=0.0))
_register("tv_mobilenet_v2", "torchvision", "torchvision MobileNetV2 (inverted residuals, ReLU6)")(
    _tv_builder("mobilenet_v2", dropout=0.0))
@_register("tv_shufflenet_v2", "torchvision", "torchvision ShuffleNetV2 x0.5 (channel shuffle); "
           "stages of 2, 4, 2 units when small")
def _shufflenet(size: Size) -> Built:
    models = import_optional("torchvision").models
    if size == "real":
        return _vision(models.shufflenet_v2_x0_5(weights=None), size, 1000)
    # Shorter stages, to keep CI short (the full 4-8-4 network compiles in 10 s here).
    return _vision(models.ShuffleNetV2([2, 4, 2], [24, 48, 96, 192, 1024], num_classes=10), size, 10)
_register("timm_resnet18", "timm", "timm ResNet-18")(_timm_builder("resnet18"))
_register("timm_resnet50", "timm", "timm ResNet-50")(_timm_builder("resnet50"))
_register("timm_mobilenetv3", "timm", "timm mobilenetv3_small_050")(_timm_builder("mobilenetv3_small_050"))
_register("timm_efficientnet_b0", "timm", "timm EfficientNet-B0 (SiLU, SE, depthwise)")(
    _timm_builder("efficientnet_b0"))
_register("timm_convnext_atto", "timm", "timm ConvNeXt-atto (depthwise 7x7, LayerNorm2d, 1x1 conv MLP, "
          "layer scale); depths 1-1-2-1 when small")(
    _timm_builder("convnext_atto", {"depths": (1, 1, 2, 1)}))
_register("timm_vit_tiny", "timm", "timm ViT-tiny/16; 32x32 images, patch 8, depth 2 when small")(
    _timm_builder("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 2}, small_hw=32))
_register("timm_deit_tiny", "timm", "timm DeiT-tiny/16, distilled (class and distillation tokens, two "
          "heads averaged); 32x32 images, patch 8, depth 2 when small")(
    _timm_builder("deit_tiny_distilled_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 2},
                  small_hw=32))
_register("timm_swin_tiny", "timm", "timm Swin-tiny; 64x64 images, window 4, two stages of 2 blocks "
          "(the second shifted), width 32 when small")(
    _timm_builder("swin_tiny_patch4_window7_224", {"img_size": 64, "window_size": 4, "depths": (2, 2),
                                                   "num_heads": (2, 4), "embed_dim": 32}))


# --------------------------------------------------------------------------- #
# transformers
# --------------------------------------------------------------------------- #


def _model_loss(output: Any) -> torch.Tensor:
    """transformers models compute their own loss when given ``labels``."""
    return output.loss


def _tokens(size: Size, vocab: int) -> torch.Tensor:
    batch, seq = _pick(size, (2, 16), (16, 512))
    return torch.randint(0, vocab, (batch, seq))


def _padding_mask(ids: torch.Tensor) -> torch.Tensor:
    """Attention mask with the last quarter of the second sequence padded (right padding)."""
    mask = torch.ones_like(ids)
    if ids.shape[0] > 1:
        mask[1, ids.shape[1] - ids.shape[1] // 4:] = 0
    return mask


def _causal_lm(model: nn.Module, size: Size, vocab: int) -> Built:
    ids = _tokens(size, vocab)
    return Built(model, (), {"input_ids": ids}, _model_loss, {"labels": ids.clone()})


def _decoder_config(size: Size, config_cls: type, small: dict[str, Any], real: dict[str, Any]) -> Any:
    common = {"use_cache": False, "attention_dropout": 0.0}
    return config_cls(**common, **_pick(size, small, real))


_SMALL_DECODER = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


@_register("hf_bert", "transformers", "BERT masked LM (padding mask)")
def _bert(size: Size) -> Built:
    tf = import_optional("transformers")
    cfg = tf.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_pick(size, {
        "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "max_position_embeddings": 64}, {}))
    ids = _tokens(size, cfg.vocab_size)
    labels = torch.where(torch.rand(ids.shape) < 0.15, ids, torch.full_like(ids, -100))
    labels[:, 0] = ids[:, 0]  # at least one masked position per row
    return Built(tf.BertForMaskedLM(cfg), (), {"input_ids": ids, "attention_mask": _padding_mask(ids)},
                 _model_loss, {"labels": labels})


@_register("hf_distilbert", "transformers", "DistilBERT sequence classifier (padding mask)")
def _distilbert(size: Size) -> Built:
    tf = import_optional("transformers")
    cfg = tf.DistilBertConfig(dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=3,
                              **_pick(size, {"vocab_size": 256, "dim": 64, "n_layers": 2, "n_heads": 4,
                                             "hidden_dim": 128, "max_position_embeddings": 64}, {}))
    ids = _tokens(size, cfg.vocab_size)
    labels = torch.randint(0, 3, (ids.shape[0],))
    return Built(tf.DistilBertForSequenceClassification(cfg), (),
                 {"input_ids": ids, "attention_mask": _padding_mask(ids)}, _model_loss, {"labels": labels})


@_register("hf_gpt2", "transformers", "GPT-2 LM head")
def _gpt2(size: Size) -> Built:
    tf = import_optional("transformers")
    cfg = tf.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, **_pick(size, {
        "vocab_size": 256, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4, "bos_token_id": 0,
        "eos_token_id": 0}, {}))
    return _causal_lm(tf.GPT2LMHeadModel(cfg), size, cfg.vocab_size)


@_register("hf_llama", "transformers", "Llama-like decoder (GQA, RoPE, RMSNorm, SwiGLU); TinyLlama widths")
def _llama(size: Size) -> Built:
    tf = import_optional("transformers")
    cfg = _decoder_config(size, tf.LlamaConfig, _SMALL_DECODER, {
        "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 4,
        "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048})
    return _causal_lm(tf.LlamaForCausalLM(cfg), size, cfg.vocab_size)


@_register("hf_mistral", "transformers", "Mistral-like decoder, sliding window shorter than the text")
def _mistral(size: Size) -> Built:
    tf = import_optional("transformers")
    cfg = _decoder_config(size, tf.MistralConfig, {**_SMALL_DECODER, "sliding_window": 8}, {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 2,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 4096,
        "sliding_window": 256})
    return _causal_lm(tf.MistralForCausalLM(cfg), size, cfg.vocab_size)


@_register("hf_qwen2", "transformers", "Qwen2-like decoder (QKV bias, tied embeddings); Qwen2-0.5B widths")
def _qwen2(size: Size) -> Built:
    tf = import_optional("transformers")
    cfg = _decoder_config(size, tf.Qwen2Config, {**_SMALL_DECODER, "tie_word_embeddings": True}, {
        "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 4,
        "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 4096,
        "tie_word_embeddings": True})
    return _causal_lm(tf.Qwen2ForCausalLM(cfg), size, cfg.vocab_size)


_SMALL_T5 = {"vocab_size": 256, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2,
             "num_heads": 4}


@_register("hf_t5", "transformers", "T5 encoder-decoder (relative position bias); t5-small widths")
def _t5(size: Size) -> Built:
    tf = import_optional("transformers")
    widths = _pick(size, _SMALL_T5, {})  # T5Config's defaults are t5-small's
    cfg = tf.T5Config(dropout_rate=0.0, use_cache=False, decoder_start_token_id=0, pad_token_id=0, **widths)
    ids = _tokens(size, cfg.vocab_size)
    targets = ids[:, : ids.shape[1] // 2].flip(1).contiguous()
    decoder_ids = torch.cat([torch.zeros_like(targets[:, :1]), targets[:, :-1]], dim=1)
    return Built(tf.T5ForConditionalGeneration(cfg), (), {"input_ids": ids, "decoder_input_ids": decoder_ids},
                 _model_loss, {"labels": targets})


_SMALL_WHISPER = {"vocab_size": 256, "num_mel_bins": 16, "d_model": 64, "encoder_layers": 2,
                  "encoder_attention_heads": 4, "decoder_layers": 2, "decoder_attention_heads": 4,
                  "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_source_positions": 32,
                  "max_target_positions": 32, "bos_token_id": 1, "eos_token_id": 2}
_WHISPER_BASE = {"vocab_size": 51865, "num_mel_bins": 80, "d_model": 512, "encoder_layers": 6,
                 "encoder_attention_heads": 8, "decoder_layers": 6, "decoder_attention_heads": 8,
                 "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "max_source_positions": 1500,
                 "max_target_positions": 448}


@_register("hf_whisper", "transformers", "Whisper-like speech encoder-decoder (conv front end); "
           "whisper-base widths")
def _whisper(size: Size) -> Built:
    tf = import_optional("transformers")
    cfg = tf.WhisperConfig(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, use_cache=False,
                           decoder_start_token_id=1, pad_token_id=0, **_pick(size, _SMALL_WHISPER, _WHISPER_BASE))
    batch, target_len = _pick(size, (2, 8), (16, 64))
    # The encoder takes exactly 2 * max_source_positions frames (its convolutions halve them).
    features = torch.randn(batch, cfg.num_mel_bins, 2 * cfg.max_source_positions)
    targets = torch.randint(2, cfg.vocab_size, (batch, target_len))
    decoder_ids = torch.cat([torch.ones_like(targets[:, :1]), targets[:, :-1]], dim=1)
    inputs = {"input_features": features, "decoder_input_ids": decoder_ids}
    return Built(tf.WhisperForConditionalGeneration(cfg), (), inputs, _model_loss, {"labels": targets})


_SMALL_VIT = {"image_size": 32, "patch_size": 8, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 128}


@_register("hf_vit", "transformers", "transformers ViT image classifier; ViT-base/16 widths")
def _hf_vit(size: Size) -> Built:
    tf = import_optional("transformers")
    classes = _pick(size, 10, 1000)
    widths = _pick(size, _SMALL_VIT, {})  # ViTConfig's defaults are ViT-base/16 at 224
    cfg = tf.ViTConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=classes, **widths)
    batch = _pick(size, 2, 64)
    pixels = torch.randn(batch, 3, cfg.image_size, cfg.image_size)
    labels = torch.randint(0, classes, (batch,))
    return Built(tf.ViTForImageClassification(cfg), (), {"pixel_values": pixels}, _model_loss, {"labels": labels})
