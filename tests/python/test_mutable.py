"""kiln.MutableModule: lazy compilation, refit on weight changes, recompilation on shape or
structure changes, and saving.

Every test compares with the wrapped model run eagerly on random inputs, and reads the
module's ``builds`` / ``refits`` counters (and the process-wide build counter) to tell a refit
from a rebuild.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from kiln.cached_build import cache_stats, reset_cache_stats
from kiln.mutable import MutableModule
from kiln.testing import randomize_weights

TOL = dict(atol=1e-4, rtol=1e-4)


class Net(nn.Module):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, hidden, 3, padding=1)
        self.bn = nn.BatchNorm2d(hidden)
        self.fc = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def net(seed: int, hidden: int = 8) -> nn.Module:
    torch.manual_seed(seed)
    return randomize_weights(Net(hidden).eval(), seed=seed)


@pytest.fixture
def x() -> torch.Tensor:
    torch.manual_seed(7)
    return torch.randn(2, 3, 12, 12)


def check(mm: MutableModule, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    y = mm(x)
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), **TOL)
    return y


def test_compiles_on_first_call_only(x: torch.Tensor) -> None:
    model = net(0)
    mm = MutableModule(model, min_block_size=1)
    assert mm.compiled is None and mm.builds == 0
    check(mm, model, x)
    check(mm, model, x)
    assert mm.builds == 1 and mm.refits == 0
    assert len(mm.compiled.engines()) == 1


def test_load_state_dict_refits_without_rebuilding(x: torch.Tensor) -> None:
    model = net(0)
    mm = MutableModule(model, min_block_size=1)
    before = check(mm, model, x)
    reset_cache_stats()
    mm.load_state_dict(net(1).state_dict())
    after = check(mm, net(1), x)
    assert mm.builds == 1 and mm.refits == 1 and cache_stats()["builds"] == 0
    assert not torch.allclose(before, after, atol=1e-2)
    model.load_state_dict(net(2).state_dict())  # through the wrapped model works the same
    check(mm, net(2), x)
    assert mm.builds == 1 and mm.refits == 2


def test_in_place_update_refits(x: torch.Tensor) -> None:
    model = net(0)
    mm = MutableModule(model, min_block_size=1)
    check(mm, model, x)
    with torch.no_grad():
        model.conv.weight.mul_(-0.5)
        model.bn.running_var.add_(0.25)
    check(mm, model, x)
    assert mm.builds == 1 and mm.refits == 1


def test_new_parameter_object_refits(x: torch.Tensor) -> None:
    model = net(0)
    mm = MutableModule(model, min_block_size=1)
    check(mm, model, x)
    model.fc.weight = nn.Parameter(torch.randn_like(model.fc.weight))
    check(mm, model, x)
    assert mm.builds == 1 and mm.refits == 1


def test_input_shape_or_dtype_change_recompiles(x: torch.Tensor) -> None:
    model = net(0)
    mm = MutableModule(model, min_block_size=1)
    check(mm, model, x)
    check(mm, model, torch.randn(1, 3, 10, 10))
    assert mm.builds == 2
    model.double()
    check(mm, model, torch.randn(1, 3, 10, 10, dtype=torch.float64))
    assert mm.builds == 3 and mm.refits == 0


def test_architecture_change_recompiles(x: torch.Tensor) -> None:
    model = net(0)
    mm = MutableModule(model, min_block_size=1)
    check(mm, model, x)
    model.fc = nn.Linear(8, 6)
    y = check(mm, model, x)
    assert y.shape == (2, 6) and mm.builds == 2 and mm.refits == 0


def test_failed_refit_falls_back_to_a_rebuild(x: torch.Tensor) -> None:
    model = net(0)
    mm = MutableModule(model, min_block_size=1, immutable_weights=True)  # engines cannot be refitted
    check(mm, model, x)
    model.load_state_dict(net(1).state_dict())
    with pytest.warns(RuntimeWarning, match="could not refit"):
        check(mm, model, x)
    assert mm.builds == 2


def test_save_and_load(x: torch.Tensor, tmp_path: Path) -> None:
    model = net(0)
    mm = MutableModule(model, min_block_size=1)
    expected = check(mm, model, x)
    mm.save(tmp_path / "mm.pt")
    loaded = MutableModule.load(tmp_path / "mm.pt")
    reset_cache_stats()
    torch.testing.assert_close(loaded(x), expected, atol=0, rtol=0)
    assert loaded.builds == 1 and loaded.refits == 0 and cache_stats()["builds"] == 0
    loaded.load_state_dict(net(3).state_dict())
    check(loaded, net(3), x)
    assert loaded.builds == 1 and loaded.refits == 1


def test_saved_with_unapplied_weight_changes_refits_after_load(x: torch.Tensor, tmp_path: Path) -> None:
    model = net(0)
    mm = MutableModule(model, min_block_size=1)
    check(mm, model, x)
    mm.load_state_dict(net(4).state_dict())  # not yet seen by a call
    mm.save(tmp_path / "mm.pt")
    loaded = MutableModule.load(tmp_path / "mm.pt")
    check(loaded, net(4), x)
    assert loaded.builds == 1 and loaded.refits == 1


def test_attributes_and_state_dict_are_the_models() -> None:
    model = net(0)
    mm = MutableModule(model, min_block_size=1)
    assert mm.fc is model.fc
    assert list(mm.state_dict()) == list(model.state_dict())
    with pytest.raises(ValueError, match="unknown Kiln option"):
        MutableModule(model, min_blok_size=1)
