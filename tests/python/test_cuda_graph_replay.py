"""A conv block whose cuDNN plans must be right when replayed from a CUDA graph.

torchvision resnet50's layer4.0 at batch 32 (1x1 -> 3x3 stride 2 -> 1x1 with a strided 1x1
downsample as the residual) was right when its engine ran kernel by kernel and wrong, and
different from one replay to the next, when replayed from the CUDA graph the execution context
captures: the graph held a programmatic (early-launch) edge into cuDNN's fused conv + residual
kernel, which then read its residual before the conv producing it had finished. Captured graphs
now make every such edge a full dependency. Run kernel by kernel, the same early start made the
FP32 block 1e-2 off on some calls when the file ran alone (the plans a fresh timing cache picks);
a direct cuDNN launch now has an empty kernel in front of it. This test runs the block both ways,
FP16 and FP32, several times on two inputs, against eager FP32.
Skipped, with the reason, where Kiln has no CUDA device.
"""

from __future__ import annotations

import pytest
import torch

from kiln.testing import randomize_weights, relative_error

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "direct"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_resnet50_layer4_block_b32_replays_right(dtype: torch.dtype, graphs: bool) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    block = torchvision.models.resnet50().layer4[0]
    randomize_weights(block.eval())
    block = block.cuda()
    xs = [torch.randn(32, 1024, 14, 14, device="cuda") for _ in range(2)]
    with torch.no_grad():
        prev = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        refs = [block(x) for x in xs]
        torch.backends.cudnn.allow_tf32 = prev
        torch._dynamo.reset()
        compiled = torch.compile(block.to(dtype), backend="kiln",
                                 options={"enabled_precisions": {dtype}, "min_block_size": 1,
                                          "use_cuda_graphs": graphs})
        for _ in range(3):
            for x, ref in zip(xs, refs):
                err = relative_error(compiled(x.to(dtype)).float(), ref)
                assert err < 5e-3, f"relative error {err:.2e} against eager FP32"
