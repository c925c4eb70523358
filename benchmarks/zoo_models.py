"""The model zoo of benchmarks/zoo.py: common architectures built from configs with random weights.

Each :class:`ZooModel` builds its module (nothing is downloaded) and its example inputs at a given
batch, either at the size the benchmark measures or, with ``small=True``, at a reduced width,
depth and resolution that runs in well under a second on a CPU (tests/python/test_zoo_models.py).
Every module returns a tensor or a tuple of tensors; the first one has the shape
:meth:`ZooModel.output_shape` states. transformers models are wrapped to take their inputs
positionally (by keyword inside) and to return their outputs as a tuple; models that return a
dict (torchvision segmentation and FPN) are wrapped likewise.

The registry :data:`MODELS` maps a name to its entry; :func:`select` picks entries by names and
shell-style patterns. Families: cnn, vision-transformer, nlp-encoder, decoder, encoder (the
encoder of an encoder-decoder model), unet, dense-prediction (segmentation and detection
backbones).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MODELS", "ZooModel", "UNet", "calibrate_batchnorm", "select", "zero_init_residuals"]

TRANSFORMER_DTYPES = ("fp16", "bf16")


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One architecture of the zoo.

    build(small) returns the module in float32 on the CPU; inputs(batch, small, gen) its example
    inputs (float32 or int64); output_shape(batch, small) the shape of its first output.
    max_batch is the largest batch the benchmark runs it at (a larger requested batch becomes
    this one); dtypes are the reduced precisions it is measured in on a GPU (fp32 runs for any
    model when asked for).
    """

    name: str
    family: str
    description: str
    build: Callable[[bool], nn.Module]
    inputs: Callable[[int, bool, torch.Generator], list[torch.Tensor]]
    output_shape: Callable[[int, bool], tuple[int, ...]]
    max_batch: int = 32
    dtypes: tuple[str, ...] = ("fp16",)

    def create(self, batch: int, small: bool = False, seed: int = 0) -> tuple[nn.Module, list[torch.Tensor]]:
        """The module in eval mode (initialized from `seed`, residual branches' last norms at zero:
        zero_init_residuals) and its inputs at `batch`."""
        torch.manual_seed(seed)
        model = zero_init_residuals(self.build(small).eval())
        return model, self.make_inputs(batch, small, seed)

    def make_inputs(self, batch: int, small: bool = False, seed: int = 0) -> list[torch.Tensor]:
        """The inputs that create(batch, small, seed) returns, without building the module."""
        return self.inputs(batch, small, torch.Generator().manual_seed(seed + 1))

    def create_randomized(self, batch: int, small: bool = False, seed: int = 0,
                          device: str = "cpu") -> tuple[nn.Module, list[torch.Tensor]]:
        """create(), then every weight re-drawn (kiln.testing.randomize_weights) and the batch
        norms' running statistics set from a batch of 8 other inputs (calibrate_batchnorm), on
        `device` (the inputs stay on the CPU)."""
        from kiln.testing import randomize_weights
        model, inputs = self.create(batch, small, seed)
        randomize_weights(model, seed)
        model = model.to(device)
        calibrate_batchnorm(model, [x.to(device) for x in self.make_inputs(8, small, seed + 100)])
        return model, inputs


def zero_init_residuals(model: nn.Module) -> nn.Module:
    """Sets the scale of the last batch norm of every residual branch to zero (torchvision ResNet's
    and RegNet's bottleneck blocks), as ResNet training recipes initialize them
    (``zero_init_residual``); randomize_weights then draws them around zero (0.02 spread). With
    unit scales, a random batch-normalized ResNet (its statistics calibrated) is chaotic: a 1e-3
    change of the input changes ResNet-50's output by 3e-2, and eager FP16 is 3e-2 (dilated
    DeepLabV3: 2e-1) from FP32, an error floor that would hide a backend's errors. With small
    branch scales the signal still flows (another input changes the output by 0.27) and the same
    input change moves the output by 7e-4."""
    from torchvision.models.regnet import ResBottleneckBlock
    from torchvision.models.resnet import BasicBlock, Bottleneck
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, Bottleneck):
                m.bn3.weight.zero_()
            elif isinstance(m, BasicBlock):
                m.bn2.weight.zero_()
            elif isinstance(m, ResBottleneckBlock):
                m.f.c[1].weight.zero_()
    return model


def calibrate_batchnorm(model: nn.Module, inputs: Sequence[torch.Tensor]) -> nn.Module:
    """Sets every batch norm's running statistics to those of `inputs` flowing through the model
    (one forward in training mode, cumulative averages), as a trained network's are. With random
    running statistics, eval-mode batch norm does not normalize: in a deep network the signal fades
    under the biases and the output stops depending on the input (MobileNetV3-Large, EfficientNet-B0:
    another input changes the output by 1e-7 relative), so that an error measured on it would miss
    any error in the network's body. Models without batch norm are left as they are."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the calibration forward
    training = model.training
    model.train()
    with torch.no_grad():
        model(*inputs)
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
    model.train(training)
    return model


# ---- inputs ------------------------------------------------------------------------------------

def _image(size: int, small_size: int, channels: int = 3) -> Callable[[int, bool, torch.Generator], list[torch.Tensor]]:
    def make(batch: int, small: bool, gen: torch.Generator) -> list[torch.Tensor]:
        s = small_size if small else size
        return [torch.randn(batch, channels, s, s, generator=gen)]
    return make


def _tokens(vocab: int, small_vocab: int, seq: int, small_seq: int, mask: bool) -> Callable[
        [int, bool, torch.Generator], list[torch.Tensor]]:
    """Token ids (and an attention mask of ones when `mask`)."""
    def make(batch: int, small: bool, gen: torch.Generator) -> list[torch.Tensor]:
        v, s = (small_vocab, small_seq) if small else (vocab, seq)
        ids = torch.randint(0, v, (batch, s), generator=gen)
        return [ids, torch.ones(batch, s, dtype=torch.int64)] if mask else [ids]
    return make


def _shape(full: Sequence[int], small: Sequence[int]) -> Callable[[int, bool], tuple[int, ...]]:
    return lambda batch, is_small: (batch, *(small if is_small else full))


# ---- wrappers ----------------------------------------------------------------------------------

class HFModel(nn.Module):
    """A transformers model called with positional inputs passed by keyword; returns the tensors of
    its output (a ModelOutput, in field order) as a tuple."""

    def __init__(self, model: nn.Module, names: Sequence[str], **fixed: Any) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)
        self.fixed = fixed

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.names, args)), **self.fixed)
        return tuple(v for v in out.values() if isinstance(v, torch.Tensor))


class DictOutputs(nn.Module):
    """A module that returns a dict of tensors, returning them as a tuple (`keys` first, in order)."""

    def __init__(self, model: nn.Module, keys: Sequence[str] = ()) -> None:
        super().__init__()
        self.model = model
        self.keys = tuple(keys)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(x)
        return tuple(out[k] for k in self.keys) if self.keys else tuple(out.values())


# ---- a diffusion-style UNet --------------------------------------------------------------------

def _groups(channels: int, groups: int) -> int:
    return math.gcd(channels, groups)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of (B,) timesteps, computed in float32 as diffusion models do."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None, :]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResBlock(nn.Module):
    """GroupNorm, SiLU, 3x3 conv, plus the projected time embedding; again; a 1x1 conv skip when
    the channel count changes."""

    def __init__(self, cin: int, cout: int, emb_dim: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(_groups(cin, groups), cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb_dim, cout)
        self.norm2 = nn.GroupNorm(_groups(cout, groups), cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(F.silu(emb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class Attention(nn.Module):
    """Multi-head attention (scaled_dot_product_attention) over tokens, keys from `context` when
    given (cross-attention)."""

    def __init__(self, dim: int, heads: int, context_dim: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(context_dim or dim, dim, bias=False)
        self.v = nn.Linear(context_dim or dim, dim, bias=False)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        b, n, d = x.shape
        src = x if context is None else context

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, -1, self.heads, d // self.heads).transpose(1, 2)
        h = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(src)), split(self.v(src)))
        return self.out(h.transpose(1, 2).reshape(b, n, d))


class SpatialTransformer(nn.Module):
    """Stable-Diffusion-style attention block: GroupNorm, 1x1 conv in, self-attention,
    cross-attention to the context (when the UNet has one), GEGLU feed-forward (each pre-LayerNorm,
    residual), 1x1 conv out, added to the input."""

    def __init__(self, channels: int, heads: int, groups: int, context_dim: int | None) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(_groups(channels, groups), channels)
        self.proj_in = nn.Conv2d(channels, channels, 1)
        self.ln1 = nn.LayerNorm(channels)
        self.attn1 = Attention(channels, heads)
        self.ln2 = nn.LayerNorm(channels) if context_dim else None
        self.attn2 = Attention(channels, heads, context_dim) if context_dim else None
        self.ln3 = nn.LayerNorm(channels)
        self.ff_in = nn.Linear(channels, 8 * channels)
        self.ff_out = nn.Linear(4 * channels, channels)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        b, c, hh, ww = x.shape
        h = self.proj_in(self.norm(x)).flatten(2).transpose(1, 2)
        h = h + self.attn1(self.ln1(h))
        if self.attn2 is not None and self.ln2 is not None:
            h = h + self.attn2(self.ln2(h), context)
        a, gate = self.ff_in(self.ln3(h)).chunk(2, dim=-1)
        h = h + self.ff_out(a * F.gelu(gate))
        return x + self.proj_out(h.transpose(1, 2).reshape(b, c, hh, ww))


class UNet(nn.Module):
    """A diffusion UNet: timestep embedding, per level `blocks` ResBlocks (each followed by an
    attention block on the levels in `attention`), 3x3 stride-2 conv downsampling, a middle
    ResBlock-attention-ResBlock, a decoder that concatenates the encoder's skips and upsamples
    (nearest, then a 3x3 conv), GroupNorm-SiLU-conv out. forward(x, t[, context]) -> x's shape
    with `out_channels` channels."""

    def __init__(self, in_channels: int, out_channels: int, channels: int, mult: Sequence[int], blocks: int,
                 attention: Sequence[int], heads: int, groups: int = 32, context_dim: int | None = None) -> None:
        super().__init__()
        emb_dim = 4 * channels
        self.channels = channels
        self.time = nn.Sequential(nn.Linear(channels, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.conv_in = nn.Conv2d(in_channels, channels, 3, padding=1)

        def attn(ch: int) -> SpatialTransformer:
            return SpatialTransformer(ch, heads, groups, context_dim)
        self.down = nn.ModuleList()
        skips = [channels]
        ch = channels
        for level, m in enumerate(mult):
            for _ in range(blocks):
                self.down.append(nn.ModuleList([ResBlock(ch, channels * m, emb_dim, groups)]
                                                + ([attn(channels * m)] if level in attention else [])))
                ch = channels * m
                skips.append(ch)
            if level != len(mult) - 1:
                self.down.append(nn.ModuleList([nn.Conv2d(ch, ch, 3, stride=2, padding=1)]))
                skips.append(ch)
        self.mid = nn.ModuleList([ResBlock(ch, ch, emb_dim, groups), attn(ch), ResBlock(ch, ch, emb_dim, groups)])
        self.up = nn.ModuleList()
        for level, m in reversed(list(enumerate(mult))):
            for i in range(blocks + 1):
                layer = nn.ModuleList([ResBlock(ch + skips.pop(), channels * m, emb_dim, groups)]
                                      + ([attn(channels * m)] if level in attention else []))
                ch = channels * m
                if level != 0 and i == blocks:
                    layer.append(nn.Conv2d(ch, ch, 3, padding=1))  # after a 2x nearest upsampling
                self.up.append(layer)
        self.norm_out = nn.GroupNorm(_groups(ch, groups), ch)
        self.conv_out = nn.Conv2d(ch, out_channels, 3, padding=1)

    @staticmethod
    def _run(layer: nn.ModuleList, h: torch.Tensor, emb: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        for module in layer:
            if isinstance(module, ResBlock):
                h = module(h, emb)
            elif isinstance(module, SpatialTransformer):
                h = module(h, context)
            elif module.stride == (1, 1):  # type: ignore[union-attr]
                h = module(F.interpolate(h, scale_factor=2.0, mode="nearest"))
            else:
                h = module(h)
        return h

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        emb = self.time(timestep_embedding(t, self.channels).to(x.dtype))
        h = self.conv_in(x)
        skips = [h]
        for layer in self.down:
            h = self._run(layer, h, emb, context)
            skips.append(h)
        h = self._run(self.mid, h, emb, context)
        for layer in self.up:
            h = self._run(layer, torch.cat([h, skips.pop()], dim=1), emb, context)
        return self.conv_out(F.silu(self.norm_out(h)))


def _unet_inputs(channels: int, size: int, small_size: int, context: tuple[int, int] | None,
                 small_context: tuple[int, int] | None) -> Callable[[int, bool, torch.Generator], list[torch.Tensor]]:
    def make(batch: int, small: bool, gen: torch.Generator) -> list[torch.Tensor]:
        s = small_size if small else size
        x = torch.randn(batch, channels, s, s, generator=gen)
        t = torch.randint(0, 1000, (batch,), generator=gen).float()
        ctx = small_context if small else context
        return [x, t] + ([torch.randn(batch, *ctx, generator=gen)] if ctx else [])
    return make


# ---- builders ----------------------------------------------------------------------------------

def _tv() -> Any:
    import torchvision
    return torchvision


def _hf() -> Any:
    import transformers
    return transformers


def _slim_bottleneck() -> type[nn.Module]:
    """ResNet's bottleneck block with expansion 1 (out = planes channels): the small variants'
    block, so that reduced widths reach the block outputs too."""
    from torchvision.models.resnet import Bottleneck

    class SlimBottleneck(Bottleneck):
        expansion = 1
    return SlimBottleneck


def _small_resnet(groups: int = 1, dilate: bool = False) -> nn.Module:
    """Bottleneck ResNet, one block per stage, widths 16 per group (out 64 .. 512 channels)."""
    from torchvision.models.resnet import ResNet
    return ResNet(_slim_bottleneck(), [1, 1, 1, 1], num_classes=10, groups=groups, width_per_group=16 // groups,
                  replace_stride_with_dilation=[False, True, True] if dilate else None)


def resnet(small: bool, groups: int = 1, width: int = 64) -> nn.Module:
    from torchvision.models.resnet import Bottleneck, ResNet
    if small:
        return _small_resnet(groups=1 if groups == 1 else 4)
    return ResNet(Bottleneck, [3, 4, 6, 3], groups=groups, width_per_group=width)


def densenet(small: bool) -> nn.Module:
    from torchvision.models.densenet import DenseNet
    if small:
        return DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, num_classes=10)
    return DenseNet(32, (6, 12, 24, 16), 64)


def regnet(small: bool) -> nn.Module:
    from torchvision.models.regnet import BlockParams, RegNet
    if small:
        return RegNet(BlockParams.from_init_params(depth=4, w_0=8, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25),
                      num_classes=10, stem_width=8)
    return _tv().models.regnet_y_1_6gf()


def efficientnet(small: bool) -> nn.Module:
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig
    if small:
        setting = [MBConvConfig(1, 3, 1, 8, 8, 1), MBConvConfig(6, 3, 2, 8, 16, 1), MBConvConfig(6, 5, 2, 16, 24, 1)]
        return EfficientNet(setting, dropout=0.2, num_classes=10, last_channel=64)
    return _tv().models.efficientnet_b0()


def efficientnet_v2(small: bool) -> nn.Module:
    from torchvision.models.efficientnet import EfficientNet, FusedMBConvConfig, MBConvConfig
    if small:
        setting = [FusedMBConvConfig(1, 3, 1, 8, 8, 1), FusedMBConvConfig(4, 3, 2, 8, 16, 1),
                   MBConvConfig(4, 3, 2, 16, 24, 1)]
        return EfficientNet(setting, dropout=0.2, num_classes=10, last_channel=64, norm_layer=nn.BatchNorm2d)
    return _tv().models.efficientnet_v2_s()


def mobilenet_v2(small: bool) -> nn.Module:
    from torchvision.models.mobilenetv2 import MobileNetV2
    if small:
        return MobileNetV2(num_classes=10, inverted_residual_setting=[[1, 8, 1, 1], [6, 16, 2, 2], [6, 24, 1, 2]])
    return MobileNetV2()


def mobilenet_v3(small: bool) -> nn.Module:
    return _tv().models.mobilenet_v3_large(**({"width_mult": 0.25, "num_classes": 10} if small else {}))


def convnext(small: bool) -> nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    if small:
        return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, 64, 1), CNBlockConfig(64, None, 1)],
                        stochastic_depth_prob=0.0, num_classes=10)
    return _tv().models.convnext_tiny()


def shufflenet(small: bool) -> nn.Module:
    from torchvision.models.shufflenetv2 import ShuffleNetV2
    if small:
        return ShuffleNetV2([1, 1, 1], [8, 16, 32, 64, 64], num_classes=10)
    return ShuffleNetV2([4, 8, 4], [24, 116, 232, 464, 1024])


def vit(small: bool) -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer
    if small:
        return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
                                 num_classes=10)
    return VisionTransformer(image_size=224, patch_size=16, num_layers=12, num_heads=12, hidden_dim=768, mlp_dim=3072)


def swin(small: bool, v2: bool = False) -> nn.Module:
    from torchvision.models import swin_transformer as sw
    kinds: dict[str, Any] = {"block": sw.SwinTransformerBlockV2, "downsample_layer": sw.PatchMergingV2} if v2 else {}
    if small:
        return sw.SwinTransformer([4, 4], 16, [1, 1], [2, 4], [4, 4], stochastic_depth_prob=0.0, num_classes=10,
                                  **kinds)
    window = [8, 8] if v2 else [7, 7]
    return sw.SwinTransformer([4, 4], 96, [2, 2, 6, 2], [3, 6, 12, 24], window, stochastic_depth_prob=0.0, **kinds)


def maxvit(small: bool) -> nn.Module:
    from torchvision.models.maxvit import MaxVit
    if small:
        return MaxVit((32, 32), stem_channels=8, partition_size=2, block_channels=[16, 32], block_layers=[1, 1],
                      head_dim=8, stochastic_depth_prob=0.0, num_classes=10)
    return MaxVit((224, 224), stem_channels=64, partition_size=7, block_channels=[64, 128, 256, 512],
                  block_layers=[2, 2, 5, 2], head_dim=32, stochastic_depth_prob=0.0)


def deeplabv3(small: bool) -> nn.Module:
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation.deeplabv3 import DeepLabHead, DeepLabV3
    if small:
        backbone, channels, classes = _small_resnet(dilate=True), 512, 5
    else:
        backbone = _tv().models.resnet50(replace_stride_with_dilation=[False, True, True])
        channels, classes = 2048, 21
    model = DeepLabV3(IntermediateLayerGetter(backbone, {"layer4": "out"}), DeepLabHead(channels, classes))
    return DictOutputs(model, ["out"])


def retinanet_fpn(small: bool) -> nn.Module:
    """ResNet-50 + FPN with RetinaNet's extra P6/P7 levels (what retinanet_resnet50_fpn's backbone is)."""
    from torchvision.models.detection.backbone_utils import BackboneWithFPN
    from torchvision.models.resnet import Bottleneck, ResNet
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7
    if small:
        backbone, widths, out = _small_resnet(), [128, 256, 512], 32
    else:
        backbone, widths, out = ResNet(Bottleneck, [3, 4, 6, 3]), [512, 1024, 2048], 256
    fpn = BackboneWithFPN(backbone, {"layer2": "0", "layer3": "1", "layer4": "2"}, widths, out,
                          extra_blocks=LastLevelP6P7(out, out))
    return DictOutputs(fpn)


def _hf_text(config: Callable[[bool], Any], model_class: str, mask: bool = True, encoder_only: bool = False,
             **fixed: Any) -> Callable[[bool], nn.Module]:
    def build(small: bool) -> nn.Module:
        model = getattr(_hf(), model_class)(config(small))
        if encoder_only:
            model = model.get_encoder()
        return HFModel(model, ["input_ids", "attention_mask"] if mask else ["input_ids"], **fixed)
    return build


def _hf_image(config: Callable[[bool], Any], model_class: str,
              name: str = "pixel_values") -> Callable[[bool], nn.Module]:
    def build(small: bool) -> nn.Module:
        return HFModel(getattr(_hf(), model_class)(config(small)), [name])
    return build


_SMALL_TEXT = {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
               "intermediate_size": 64, "max_position_embeddings": 64}


def bert_config(small: bool) -> Any:
    return _hf().BertConfig(**(_SMALL_TEXT if small else {}))


def distilbert_config(small: bool) -> Any:
    if small:
        return _hf().DistilBertConfig(vocab_size=128, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                      max_position_embeddings=64)
    return _hf().DistilBertConfig()


def roberta_config(small: bool) -> Any:
    base = {"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1, "pad_token_id": 1}
    return _hf().RobertaConfig(**(base | (_SMALL_TEXT | {"max_position_embeddings": 66} if small else {})))


def albert_config(small: bool) -> Any:
    if small:
        return _hf().AlbertConfig(**_SMALL_TEXT, embedding_size=16)
    return _hf().AlbertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072, embedding_size=128)


def deberta_config(small: bool) -> Any:
    """DeBERTa-v3-base: disentangled attention with relative position buckets."""
    common = {"relative_attention": True, "position_buckets": 256, "max_relative_positions": -1,
              "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": ["p2c", "c2p"],
              "position_biased_input": False}
    if small:
        return _hf().DebertaV2Config(**_SMALL_TEXT, **(common | {"position_buckets": 16}))
    return _hf().DebertaV2Config(vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                 intermediate_size=3072, **common)


def gpt2_config(small: bool) -> Any:
    if small:
        return _hf().GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                                eos_token_id=0)
    return _hf().GPT2Config()


def llama_config(small: bool) -> Any:
    """A Llama-style decoder: RoPE, RMSNorm, grouped-query attention (4 KV heads of 16), SwiGLU."""
    if small:
        return _hf().LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return _hf().LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                             num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)


def qwen2_config(small: bool) -> Any:
    """Qwen2-0.5B's shape: biased QKV projections, GQA with 2 KV heads, SwiGLU, RMSNorm, RoPE."""
    if small:
        return _hf().Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return _hf().Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                             tie_word_embeddings=True)


def gpt_neox_config(small: bool) -> Any:
    """Pythia-160M: parallel attention and MLP residuals, rotary embeddings on a quarter of each head."""
    if small:
        return _hf().GPTNeoXConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=64, max_position_embeddings=64, rotary_pct=0.25)
    return _hf().GPTNeoXConfig(vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                               intermediate_size=3072, max_position_embeddings=2048, rotary_pct=0.25)


def t5_config(small: bool) -> Any:
    if small:
        return _hf().T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    return _hf().T5Config(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12)


def bart_config(small: bool) -> Any:
    if small:
        return _hf().BartConfig(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=1,
                                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                decoder_ffn_dim=64, max_position_embeddings=64)
    return _hf().BartConfig(vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6,
                            encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                            decoder_ffn_dim=3072, max_position_embeddings=1024)


# Whisper-base: 80 mel bins, 3000 frames (30 s), two conv1d (the second stride 2), 6 layers of 512.
_WHISPER = {"num_mel_bins": 80, "max_source_positions": 1500, "d_model": 512, "encoder_layers": 6,
            "encoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_layers": 6,
            "decoder_attention_heads": 8, "decoder_ffn_dim": 2048, "vocab_size": 51865}
_WHISPER_SMALL = {"num_mel_bins": 16, "max_source_positions": 16, "d_model": 32, "encoder_layers": 2,
                  "encoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_layers": 1,
                  "decoder_attention_heads": 4, "decoder_ffn_dim": 64, "vocab_size": 128,
                  "max_target_positions": 32, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 0,
                  "decoder_start_token_id": 0}


def whisper_encoder(small: bool) -> nn.Module:
    config = _hf().WhisperConfig(**(_WHISPER_SMALL if small else _WHISPER))
    return HFModel(_hf().WhisperModel(config).get_encoder(), ["input_features"])


def _whisper_inputs(batch: int, small: bool, gen: torch.Generator) -> list[torch.Tensor]:
    c = _WHISPER_SMALL if small else _WHISPER
    return [torch.randn(batch, c["num_mel_bins"], 2 * c["max_source_positions"], generator=gen)]


def deit_config(small: bool) -> Any:
    if small:
        return _hf().DeiTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                image_size=32, patch_size=8)
    return _hf().DeiTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536)


def clip_config(small: bool) -> Any:
    if small:
        return _hf().CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, image_size=32, patch_size=8)
    return _hf().CLIPVisionConfig()  # ViT-B/32 at 224: quick-GELU, pre-LayerNorm


def segformer(small: bool) -> nn.Module:
    """SegFormer-B0 (Mix Transformer: overlapping patch embeddings, attention over spatially
    reduced keys, depthwise-conv MLPs) with its all-MLP decode head, 150 classes."""
    hf = _hf()
    if small:
        config = hf.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                                    patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                                    decoder_hidden_size=16, num_labels=5)
    else:
        config = hf.SegformerConfig(num_labels=150)
    return HFModel(hf.SegformerForSemanticSegmentation(config), ["pixel_values"])


def unet_ddpm(small: bool) -> nn.Module:
    """DDPM's CIFAR-10 UNet shape: 32x32 RGB, 128 channels x (1, 2, 2, 2), self-attention at 16x16."""
    if small:
        return UNet(3, 3, 16, (1, 2), 1, attention=(1,), heads=2, groups=8)
    return UNet(3, 3, 128, (1, 2, 2, 2), 2, attention=(1,), heads=4)


def unet_ldm(small: bool) -> nn.Module:
    """A latent-diffusion UNet: 4-channel 32x32 latents, 256 channels x (1, 2, 4), self- and
    cross-attention (77 tokens of 768) on the two lower levels and the middle."""
    if small:
        return UNet(4, 4, 16, (1, 2), 1, attention=(1,), heads=2, groups=8, context_dim=24)
    return UNet(4, 4, 256, (1, 2, 4), 2, attention=(1, 2), heads=8, context_dim=768)


# ---- the registry ------------------------------------------------------------------------------

def _entries() -> list[ZooModel]:
    img = _image(224, 32)
    img64 = _image(224, 64)
    cls = _shape((1000,), (10,))
    text = _tokens(30522, 128, 128, 16, mask=True)

    def hidden(full: int) -> Callable[[int, bool], tuple[int, ...]]:
        return _shape((128, full), (16, 32))  # (sequence, hidden)

    return [
        # CNNs
        ZooModel("resnet50", "cnn", "torchvision ResNet-50, 224x224", resnet, img64, cls),
        ZooModel("resnext50_32x4d", "cnn", "torchvision ResNeXt-50 32x4d (grouped convs), 224x224",
                 lambda s: resnet(s, groups=32, width=4), img64, cls),
        ZooModel("densenet121", "cnn", "torchvision DenseNet-121 (concatenating blocks), 224x224", densenet, img64,
                 cls),
        ZooModel("regnet_y_1_6gf", "cnn", "torchvision RegNetY-1.6GF (grouped convs, squeeze-excitation), 224x224",
                 regnet, img64, cls),
        ZooModel("efficientnet_b0", "cnn", "torchvision EfficientNet-B0 (MBConv, SiLU, SE), 224x224", efficientnet,
                 img64, cls),
        ZooModel("efficientnet_v2_s", "cnn", "torchvision EfficientNetV2-S (fused MBConv), 224x224",
                 efficientnet_v2, img64, cls),
        ZooModel("mobilenet_v2", "cnn", "torchvision MobileNetV2 (depthwise, ReLU6), 224x224", mobilenet_v2, img64,
                 cls),
        ZooModel("mobilenet_v3_large", "cnn", "torchvision MobileNetV3-Large (hardswish, SE), 224x224",
                 mobilenet_v3, img64, cls),
        ZooModel("convnext_tiny", "cnn", "torchvision ConvNeXt-T (7x7 depthwise, LayerNorm, layer scale), 224x224",
                 convnext, img64, cls),
        ZooModel("shufflenet_v2", "cnn", "torchvision ShuffleNetV2 x1.0 (channel shuffle, split), 224x224",
                 shufflenet, img64, cls),
        # vision transformers
        ZooModel("vit_b_16", "vision-transformer", "torchvision ViT-B/16, 224x224", vit, img, cls,
                 dtypes=TRANSFORMER_DTYPES),
        ZooModel("deit_s", "vision-transformer", "transformers DeiT-S (class + distillation tokens), 224x224",
                 _hf_image(deit_config, "DeiTModel"), img, _shape((198, 384), (18, 32)), dtypes=TRANSFORMER_DTYPES),
        ZooModel("clip_vit_b32", "vision-transformer", "transformers CLIP vision tower ViT-B/32, 224x224",
                 _hf_image(clip_config, "CLIPVisionModel"), img, _shape((50, 768), (17, 32)),
                 dtypes=TRANSFORMER_DTYPES),
        ZooModel("swin_t", "vision-transformer", "torchvision Swin-T (shifted windows), 224x224",
                 swin, img, cls, dtypes=TRANSFORMER_DTYPES),
        ZooModel("swin_v2_t", "vision-transformer",
                 "torchvision Swin-V2-T (cosine attention, continuous position bias), 256x256",
                 lambda s: swin(s, v2=True), _image(256, 32), cls, dtypes=TRANSFORMER_DTYPES),
        ZooModel("maxvit_t", "vision-transformer", "torchvision MaxViT-T (MBConv + block and grid attention), 224x224",
                 maxvit, img, cls, dtypes=TRANSFORMER_DTYPES),
        # encoder-only NLP, sequence 128
        ZooModel("bert", "nlp-encoder", "transformers BertModel, BERT-base, seq 128",
                 _hf_text(bert_config, "BertModel"), text, hidden(768), dtypes=TRANSFORMER_DTYPES),
        ZooModel("distilbert", "nlp-encoder", "transformers DistilBertModel, base, seq 128",
                 _hf_text(distilbert_config, "DistilBertModel"), text, hidden(768), dtypes=TRANSFORMER_DTYPES),
        ZooModel("roberta", "nlp-encoder", "transformers RobertaModel, RoBERTa-base, seq 128",
                 _hf_text(roberta_config, "RobertaModel"), _tokens(50265, 128, 128, 16, mask=True), hidden(768),
                 dtypes=TRANSFORMER_DTYPES),
        ZooModel("albert", "nlp-encoder", "transformers AlbertModel, ALBERT-base (shared layers), seq 128",
                 _hf_text(albert_config, "AlbertModel"), _tokens(30000, 128, 128, 16, mask=True), hidden(768),
                 dtypes=TRANSFORMER_DTYPES),
        ZooModel("deberta_v3", "nlp-encoder",
                 "transformers DebertaV2Model, DeBERTa-v3-base (disentangled relative attention), seq 128",
                 _hf_text(deberta_config, "DebertaV2Model"), _tokens(128100, 128, 128, 16, mask=True), hidden(768),
                 dtypes=TRANSFORMER_DTYPES),
        # decoder-only blocks (no LM head), causal, sequence 128, no KV cache
        ZooModel("gpt2", "decoder", "transformers GPT2Model, GPT-2 small, seq 128",
                 _hf_text(gpt2_config, "GPT2Model", mask=False, use_cache=False),
                 _tokens(50257, 128, 128, 16, mask=False), hidden(768), dtypes=TRANSFORMER_DTYPES),
        ZooModel("llama", "decoder",
                 "transformers LlamaModel, 8 layers of 1024, 16 heads / 4 KV heads, SwiGLU 2816, seq 128",
                 _hf_text(llama_config, "LlamaModel", mask=False, use_cache=False),
                 _tokens(32000, 128, 128, 16, mask=False), hidden(1024), dtypes=TRANSFORMER_DTYPES),
        ZooModel("qwen2", "decoder", "transformers Qwen2Model, Qwen2-0.5B shape (24 layers of 896), seq 128",
                 _hf_text(qwen2_config, "Qwen2Model", mask=False, use_cache=False),
                 _tokens(151936, 128, 128, 16, mask=False), hidden(896), dtypes=TRANSFORMER_DTYPES),
        ZooModel("gpt_neox", "decoder", "transformers GPTNeoXModel, Pythia-160M shape, seq 128",
                 _hf_text(gpt_neox_config, "GPTNeoXModel", mask=False, use_cache=False),
                 _tokens(50304, 128, 128, 16, mask=False), hidden(768), dtypes=TRANSFORMER_DTYPES),
        # encoders of encoder-decoder models
        ZooModel("t5_encoder", "encoder", "transformers T5EncoderModel, T5-base (relative position bias), seq 128",
                 _hf_text(t5_config, "T5EncoderModel"), _tokens(32128, 128, 128, 16, mask=True), hidden(768),
                 dtypes=TRANSFORMER_DTYPES),
        ZooModel("bart_encoder", "encoder", "transformers BART-base encoder, seq 128",
                 _hf_text(bart_config, "BartModel", encoder_only=True), _tokens(50265, 128, 128, 16, mask=True),
                 hidden(768), dtypes=TRANSFORMER_DTYPES),
        ZooModel("whisper_encoder", "encoder", "transformers Whisper-base encoder, 80 mel bins x 3000 frames",
                 whisper_encoder, _whisper_inputs, _shape((1500, 512), (16, 32)), dtypes=TRANSFORMER_DTYPES),
        # diffusion UNets
        ZooModel("unet_ddpm", "unet", "UNet of zoo_models.py: DDPM CIFAR-10 shape, 32x32 RGB, t",
                 unet_ddpm, _unet_inputs(3, 32, 16, None, None), _shape((3, 32, 32), (3, 16, 16))),
        ZooModel("unet_ldm", "unet",
                 "UNet of zoo_models.py: latent diffusion, 4x32x32 latents, t, 77x768 context (cross-attention)",
                 unet_ldm, _unet_inputs(4, 32, 16, (77, 768), (7, 24)), _shape((4, 32, 32), (4, 16, 16))),
        # dense prediction
        ZooModel("deeplabv3_resnet50", "dense-prediction",
                 "torchvision DeepLabV3 (dilated ResNet-50, ASPP), 21 classes, 512x512",
                 deeplabv3, _image(512, 64), _shape((21, 512, 512), (5, 64, 64)), max_batch=16),
        ZooModel("retinanet_fpn", "dense-prediction",
                 "torchvision ResNet-50 + FPN with P6/P7 (RetinaNet's backbone), 512x512, 5 maps out",
                 retinanet_fpn, _image(512, 64), _shape((256, 64, 64), (32, 8, 8))),
        ZooModel("segformer_b0", "dense-prediction", "transformers SegFormer-B0 semantic segmentation, 512x512",
                 segformer, _image(512, 64), _shape((150, 128, 128), (5, 16, 16)), dtypes=TRANSFORMER_DTYPES),
    ]


MODELS: dict[str, ZooModel] = {m.name: m for m in _entries()}


def select(patterns: str | Sequence[str] | None) -> list[ZooModel]:
    """The entries whose names match any of `patterns` (comma-separated names or shell-style
    globs; also a family name), in registry order; all of them for None, "" or "all"."""
    if patterns is None or patterns in ("", "all"):
        return list(MODELS.values())
    items = [p.strip() for p in (patterns.split(",") if isinstance(patterns, str) else patterns) if p.strip()]
    chosen = [m for m in MODELS.values()
              if any(fnmatch.fnmatchcase(m.name, p) or m.family == p for p in items)]
    unmatched = [p for p in items if not any(fnmatch.fnmatchcase(m.name, p) or m.family == p for m in MODELS.values())]
    if unmatched:
        raise ValueError(f"no zoo model matches {', '.join(unmatched)}; models: {', '.join(MODELS)}")
    return chosen
