"""Architectures outside the benchmark zoo, in small configurations, through kiln.compile on the
CPU: every op in engines and the output within 3e-4 of eager on random weights and inputs. They
cover what the zoo does not (Inception branches, SqueezeNet's fire modules, VGG, MNASNet,
LR-ASPP and FCN heads, ELECTRA, MPNet, MobileBERT's bottlenecks, Mistral's sliding window, Phi,
OPT, BLOOM's ALiBi, Falcon, GPT-J, Gemma, BEiT's relative position bias, DINOv2, ConvNeXt V2's
global response norm, PoolFormer, wav2vec2's conv feature encoder), so an op or a
pattern that only they use cannot silently leave the engines."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision").models
T = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from zoo_models import calibrate_batchnorm  # noqa: E402

import kiln  # noqa: E402
from kiln.testing import randomize_weights, relative_error  # noqa: E402

_H = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def _tokens(seed: int) -> list[torch.Tensor]:
    return [torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(seed))]


def _image(shape: tuple[int, ...]) -> Callable[[int], list[torch.Tensor]]:
    return lambda seed: [torch.randn(*shape, generator=torch.Generator().manual_seed(seed))]


_IMG = _image((2, 3, 64, 64))

# name -> (the model, its inputs for a seed)
MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[int], list[torch.Tensor]]]] = {
    "googlenet": (lambda: tv.googlenet(weights=None, aux_logits=False, init_weights=False), _image((2, 3, 96, 96))),
    "inception_v3": (lambda: tv.inception_v3(weights=None, aux_logits=False, init_weights=False),
                     _image((2, 3, 80, 80))),
    "squeezenet1_1": (lambda: tv.squeezenet1_1(weights=None, num_classes=10), _IMG),
    "vgg11_bn": (lambda: tv.vgg11_bn(weights=None, num_classes=10), _IMG),
    "mnasnet0_5": (lambda: tv.mnasnet0_5(weights=None, num_classes=10), _IMG),
    "lraspp_mobilenet_v3": (lambda: tv.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=5), _IMG),
    "fcn_resnet50": (lambda: tv.segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=5,
                                                          aux_loss=False), _image((1, 3, 48, 48))),
    "electra": (lambda: T.ElectraModel(T.ElectraConfig(vocab_size=100, embedding_size=32, **_H)), _tokens),
    "mpnet": (lambda: T.MPNetModel(T.MPNetConfig(vocab_size=100, **_H)), _tokens),
    "mobilebert": (lambda: T.MobileBertModel(T.MobileBertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32)), _tokens),
    "mistral": (lambda: T.MistralModel(T.MistralConfig(vocab_size=100, num_key_value_heads=2, sliding_window=8,
                                                       **_H)), _tokens),
    "phi": (lambda: T.PhiModel(T.PhiConfig(vocab_size=100, **_H)), _tokens),
    "opt": (lambda: T.OPTModel(T.OPTConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, ffn_dim=128, word_embed_proj_dim=64)), _tokens),
    "bloom": (lambda: T.BloomModel(T.BloomConfig(vocab_size=100, hidden_size=64, n_layer=2, n_head=4)), _tokens),
    "falcon": (lambda: T.FalconModel(T.FalconConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                                    num_attention_heads=4)), _tokens),
    "gptj": (lambda: T.GPTJModel(T.GPTJConfig(vocab_size=100, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                              bos_token_id=0, eos_token_id=0)), _tokens),
    "gemma": (lambda: T.GemmaModel(T.GemmaConfig(vocab_size=100, num_key_value_heads=1, head_dim=16, **_H)),
              _tokens),
    "beit": (lambda: T.BeitModel(T.BeitConfig(image_size=64, patch_size=16, use_relative_position_bias=True,
                                              **_H)), _IMG),
    "dinov2": (lambda: T.Dinov2Model(T.Dinov2Config(image_size=64, patch_size=16, **_H)), _IMG),
    "convnextv2": (lambda: T.ConvNextV2Model(T.ConvNextV2Config(image_size=64, hidden_sizes=[16, 32, 64, 128],
                                                                depths=[1, 1, 1, 1])), _IMG),
    "poolformer": (lambda: T.PoolFormerModel(T.PoolFormerConfig(hidden_sizes=[16, 32, 64, 128],
                                                                depths=[1, 1, 1, 1])), _IMG),
    "wav2vec2": (lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(
        conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, **_H)),
        lambda seed: [torch.randn(2, 4000, generator=torch.Generator().manual_seed(seed))]),
}


def _first(out: Any) -> torch.Tensor:
    """The tensor a model's output leads with (transformers' last_hidden_state)."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, dict):
        return _first(next(iter(out.values())))
    return _first(out[0])


@pytest.mark.parametrize("name", list(MODELS))
def test_model_runs_in_engines_like_eager(name: str) -> None:
    make, inputs_for = MODELS[name]
    model = randomize_weights(make())
    calibrate_batchnorm(model, inputs_for(2))  # as the zoo's models: batch norms that normalize
    model.eval()
    inputs, others = inputs_for(0), inputs_for(1)
    with torch.no_grad():
        want, want_others = _first(model(*inputs)), _first(model(*others))
        # the reference depends on the input, so a kernel that ignored it could not pass
        assert relative_error(want_others, want) > 1e-2, f"{name}: eager output hardly depends on the input"
        compiled = kiln.compile(model, inputs, device="cpu", min_block_size=1, cache_built_engines=False,
                                reuse_cached_engines=False)
        assert not compiled.summary.ops_in_pytorch, f"{name}: {dict(compiled.summary.ops_in_pytorch)} left in PyTorch"
        for x, ref in ((inputs, want), (others, want_others)):
            got = _first(compiled(*x))
            assert got.shape == ref.shape
            assert relative_error(got, ref) < 3e-4, f"{name}: {relative_error(got, ref):.2e} from eager"
