"""3-D convolutions (video models, volumetric UNets) on the CPU backend: every stride, padding,
dilation and group count against PyTorch's conv3d on random weights and inputs, with the batch norm,
residual and activation a ResNet block folds into them, and through torchvision's r3d_18 (the CUDA
backend's cuDNN plans are checked against the CPU in tests/cpp/test_cuda_conv_build.cpp). A
partition for CUDA asks that backend, without a GPU. A transposed 3-D convolution is refused at
import and runs in PyTorch."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln.lowering import lower_module
from kiln.partition import partition
from kiln.pipeline import supported_targets
from kiln.runtime import KilnEngineModule
from kiln.settings import settings_from_options
from kiln.testing import randomize_weights, relative_error
from kiln.translate import Capability


class _Block(torch.nn.Module):
    """conv3d -> batch norm -> + x -> relu: the epilogue a ResNet block fuses into its conv."""

    def __init__(self, c: int, kernel: tuple[int, int, int], stride: int, padding: tuple[int, int, int],
                 dilation: int, groups: int, bias: bool) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(c, c, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups,
                                    bias=bias)
        self.norm = torch.nn.BatchNorm3d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.conv(x))
        return torch.relu(y + x) if y.shape == x.shape else torch.relu(y)


def _engine_plans(compiled: torch.nn.Module) -> list[str]:
    return [m.engine.graph_text for m in compiled.modules() if isinstance(m, KilnEngineModule)]


@pytest.mark.parametrize("kernel,stride,padding,dilation,groups,bias", [
    ((3, 3, 3), 1, (1, 1, 1), 1, 1, True),   # a ResNet3D block: the residual and relu fuse
    ((3, 3, 3), 2, (1, 1, 1), 1, 1, False),  # strided
    ((1, 1, 1), 1, (0, 0, 0), 1, 1, True),   # pointwise: a GEMM over every position
    ((3, 1, 1), 1, (1, 0, 0), 1, 1, True),   # R(2+1)D's temporal conv
    ((1, 3, 3), 1, (0, 1, 1), 2, 2, True),   # spatial, dilated, grouped
    ((3, 3, 3), 1, (1, 1, 1), 1, 8, False),  # depthwise
    ((2, 3, 2), (2, 1, 3), (0, 2, 1), 1, 4, True),  # uneven kernel, strides and padding
])
def test_conv3d_matches_pytorch(kernel: tuple[int, int, int], stride: object, padding: tuple[int, int, int],
                                dilation: int, groups: int, bias: bool) -> None:
    torch.manual_seed(0)
    model = randomize_weights(_Block(8, kernel, stride, padding, dilation, groups, bias)).eval()  # type: ignore[arg-type]
    x, other = torch.randn(2, 8, 5, 9, 10), torch.randn(2, 8, 5, 9, 10)
    with torch.no_grad():
        compiled = kiln.compile(model, [x], device="cpu", min_block_size=1)
        assert not compiled.summary.ops_in_pytorch, compiled.summary
        plans = _engine_plans(compiled)
        assert len(plans) == 1 and "= conv(" in plans[0] and "batch_norm" not in plans[0], plans
        for inp in (x, other):
            err = relative_error(compiled(inp), model(inp))
            assert err < 1e-5, f"relative error {err:.2e} against eager"


def test_r3d_18_runs_in_one_engine() -> None:
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = randomize_weights(tv.models.video.r3d_18(weights=None, num_classes=10)).eval()
    x, other = torch.randn(1, 3, 4, 32, 32), torch.randn(1, 3, 4, 32, 32)
    with torch.no_grad():
        want, want_other = model(x), model(other)
        assert relative_error(want_other, want) > 1e-2  # the output depends on the input
        compiled = kiln.compile(model, [x], device="cpu")
        assert not compiled.summary.ops_in_pytorch and compiled.summary.engines == 1, compiled.summary
        assert relative_error(compiled(x), want) < 1e-4
        assert relative_error(compiled(other), want_other) < 1e-4


def test_transposed_conv3d_is_refused_with_its_reason() -> None:
    model = torch.nn.ConvTranspose3d(4, 4, 3).eval()
    x = torch.randn(1, 4, 3, 5, 5)
    with torch.no_grad():
        compiled = kiln.compile(model, [x], device="cpu", min_block_size=1)
        left = compiled.summary.ops_in_pytorch
        assert left and all("convolution" in op for op in left), compiled.summary
        assert relative_error(compiled(x), model(x)) < 1e-6


def _cuda_built() -> bool:
    return any(lib["name"] == "cudart" for lib in kiln._C.build_info()["libraries"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_partition_for_cuda_asks_its_backend(dtype: torch.dtype) -> None:
    """The CUDA backend runs 3-D convs in f32 / f16 / bf16 (cuDNN, 5-D descriptors), not in f64:
    a partition for CUDA, asked without a GPU, leaves f64 convs to PyTorch with that reason; the
    CPU runs both."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv3d(4, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv3d(4, 4, 1),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 3 * 6 * 6, 5)).eval().to(dtype)
    lowered = lower_module(model, [torch.randn(1, 4, 3, 6, 6, dtype=dtype)], None, supported_targets())
    settings = settings_from_options({"min_block_size": 1})
    convs = [n for n in lowered.gm.graph.nodes if "convolution" in str(n.target)]
    assert len(convs) == 2
    for device in ["cpu"] + (["cuda"] if _cuda_built() else []):
        capability = Capability(lowered.gm, settings, device)
        refused = device == "cuda" and dtype == torch.float64
        for conv in convs:
            ok, why = capability(conv)
            assert ok != refused, why
            if refused:
                assert why == "the CUDA backend cannot run conv: conv on CUDA runs f32, f16 and bf16, got f64", why
        left = partition(lowered.gm, capability, settings).pytorch_ops()
        assert left.get("aten.convolution.default", 0) == (2 if refused else 0), left


def test_a_dry_run_for_cuda_takes_inputs_on_the_cpu(tmp_path) -> None:
    """Planning a GPU build on a machine without one: the report says what would stay in PyTorch
    there (here f64 convs), and nothing is built. A real build for CUDA from inputs on the CPU is
    refused."""
    if not _cuda_built():
        pytest.skip("this Kiln build has no CUDA backend")
    model = torch.nn.Sequential(torch.nn.Conv3d(4, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 3 * 6 * 6, 5)).eval().double()
    x = torch.randn(1, 4, 3, 6, 6, dtype=torch.float64)
    report = tmp_path / "report.txt"
    with torch.no_grad():
        compiled = kiln.compile(model, [x], device="cuda", dryrun=str(report), min_block_size=1)
        assert relative_error(compiled(x), model(x)) < 1e-12  # the graph runs in PyTorch, on the CPU
    text = report.read_text()
    assert "aten.convolution.default x1: the CUDA backend cannot run conv: conv on CUDA runs f32" in text, text
    assert not compiled.engines()
    with pytest.raises(ValueError, match="Kiln option 'device' is 'cuda:0', but the inputs are on"):
        kiln.compile(model, [x], device="cuda", min_block_size=1)
