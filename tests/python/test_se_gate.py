"""A squeeze-excitation block (MobileNetV3's and EfficientNet's): x * gate(conv(relu(conv(mean(x))))).

The gate's activation, broadcast over the feature map it scales, stays out of the conv's
epilogue and is recomputed inside the multiply's fused kernel. Checked on the CPU and, where
Kiln has a CUDA device, on CUDA: the plan holds that fused multiply (on CUDA the two convs over
the pooled [N, 1, 1, C] are linears, the first with its relu), and the outputs match eager on
random weights and inputs.
"""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln.runtime import KilnEngineModule
from kiln.testing import randomize_weights, relative_error


class _Block(torch.nn.Module):
    def __init__(self, gate: torch.nn.Module) -> None:
        super().__init__()
        self.expand = torch.nn.Conv2d(8, 24, 3, padding=1)
        self.fc1 = torch.nn.Conv2d(24, 8, 1)
        self.fc2 = torch.nn.Conv2d(8, 24, 1)
        self.gate = gate
        self.project = torch.nn.Conv2d(24, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.hardswish(self.expand(x))
        s = self.gate(self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
        return self.project(y * s) + x


@pytest.mark.parametrize("gate", [torch.nn.Hardsigmoid, torch.nn.Sigmoid], ids=["hardsigmoid", "sigmoid"])
@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.cuda),
])
@pytest.mark.parametrize("batch", [1, 3])
def test_gate_is_recomputed_inside_the_multiply(device: str, gate: type[torch.nn.Module], batch: int) -> None:
    torch.manual_seed(0)
    block = _Block(gate()).eval()
    randomize_weights(block)
    dtype = torch.half if device == "cuda" else torch.float32
    x = torch.randn(batch, 8, 10, 10)
    with torch.no_grad():
        ref = block(x)
        block = block.to(device, dtype)
        xd = x.to(device, dtype)
        compiled = kiln.compile(block, [xd], enabled_precisions={dtype}, min_block_size=1)
        out = compiled(xd).float().cpu()
    err = relative_error(out, ref)
    assert err < (1e-2 if dtype == torch.half else 1e-4), f"relative error {err:.2e} against eager FP32"
    engines = [m for m in compiled.modules() if isinstance(m, KilnEngineModule)]
    assert len(engines) == 1
    plan = engines[0].engine.graph_text
    name = gate.__name__.lower()
    assert f'activation="{name}"' not in plan, plan  # not in the conv's epilogue...
    fused = [line for line in plan.splitlines() if f"= {name}(" in line]
    assert fused and all(line.startswith("    ") for line in fused), plan  # ...but in a fused body
    if device == "cuda":  # channels last, the convs over the pooled [N, 1, 1, C] run as GEMMs
        linears = [line for line in plan.splitlines() if "= linear(" in line]
        assert len(linears) == 2 and 'activation="relu"' in linears[0], plan
