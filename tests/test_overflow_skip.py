"""SkipsOverflowedSteps (issue 39 item 4): RMSprop under a GradScaler skips an overflowed step on the device, with
lists built once and flat buffers, not a walk over the parameters and their state every step. Against timm's
RMSpropTF stepped as GradScaler steps it (unscale_, a host read of the flag, no step on an overflow): the same
weights and state, bitwise, on channels_last weights too; and a fixed number of tensor ops a step, whatever the
number of parameters."""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
import timm
import torch
from timm.optim import RMSpropTF
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from imgcls.training.optimizer import SkipsOverflowedSteps, skips_overflowed_steps

HYPER = {"lr": 0.05, "alpha": 0.9, "eps": 1e-3, "momentum": 0.9, "weight_decay": 1e-5}


class Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not str(func).startswith("profiler."):  # Optimizer.step's record_function marks: no tensor work
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def network(channels_last: bool) -> nn.Module:
    torch.manual_seed(0)
    net = timm.create_model("test_efficientnet", num_classes=5)
    return net.to(memory_format=torch.channels_last) if channels_last else net


def gradients(net: nn.Module, steps: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        [torch.randn(p.shape, generator=generator).to(memory_format=_format(p)) * 1e-2 for p in net.parameters()]
        for _ in range(steps)
    ]


def _format(p: torch.Tensor) -> torch.memory_format:
    if p.dim() == 4 and not p.is_contiguous() and p.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def scaled_step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, unscale: bool) -> None:
    """One step as imgcls's precision plugin takes it (unscale_ first) or as a bare GradScaler.step does."""
    if unscale:
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()


def state_of(optimizer: torch.optim.Optimizer, net: nn.Module) -> list[torch.Tensor]:
    return [
        v.clone() for p in net.parameters() for k, v in sorted(optimizer.state[p].items()) if k != "step"
    ]  # fmt: skip


@pytest.mark.parametrize("unscale", [True, False], ids=["unscaled-first", "scaled"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("overflow_at", [None, 0, 1, 3])
def test_skipping_on_the_device_equals_the_host_skip(
    overflow_at: int | None, channels_last: bool, unscale: bool
) -> None:
    """Every step's weights and state equal timm's RMSpropTF under a bare GradScaler, bitwise, where the overflowed
    step is skipped on the host. At the very first step there is no state to go back to: the weights stay and the
    state is the one a zero gradient makes (as before this change), from which the later steps differ a little."""
    ours_net, theirs_net = network(channels_last), network(channels_last)
    ours = skips_overflowed_steps(RMSpropTF)(ours_net.parameters(), **HYPER)
    theirs = RMSpropTF(theirs_net.parameters(), **HYPER)
    scalers = [torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=3) for _ in range(2)]
    steps = gradients(ours_net, 6)
    for step, grads in enumerate(steps):
        for net, scaler in zip((ours_net, theirs_net), scalers, strict=True):
            scale = float(scaler.scale(torch.ones(())))
            for p, g in zip(net.parameters(), grads, strict=True):
                p.grad = g * scale
            if step == overflow_at:
                next(net.parameters()).grad[(0,) * 4] = math.inf
        before = [p.detach().clone() for p in ours_net.parameters()]
        scaled_step(scalers[0], ours, unscale)
        scaled_step(scalers[1], theirs, unscale=False)
        assert scalers[0].get_scale() == scalers[1].get_scale()
        if step == overflow_at:
            assert all(torch.equal(a, b) for a, b in zip(before, ours_net.parameters(), strict=True))
        if overflow_at == 0:
            assert all(torch.isfinite(t).all() for t in [*ours_net.parameters(), *state_of(ours, ours_net)])
            continue
        assert all(torch.equal(a, b) for a, b in zip(ours_net.parameters(), theirs_net.parameters(), strict=True))
        mine, timms = state_of(ours, ours_net), state_of(theirs, theirs_net)
        assert len(mine) == len(timms) and all(torch.equal(a, b) for a, b in zip(mine, timms, strict=True))
    assert any(not p.is_contiguous() for p in ours_net.parameters()) is channels_last
    # the state's flat views keep the weights' strides (the layout the optimizer made them in)
    assert all(v.stride() == p.stride() for p in ours_net.parameters() for k, v in ours.state[p].items() if k != "step")


def chain(layers: int) -> nn.Module:
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])


def ops_a_step(layers: int) -> tuple[list[str], list[str]]:
    """The tensor ops of the third scaled step (its lists are built by then) of imgcls's optimizer (unscale_, step,
    update, as its precision plugin runs them) and of timm's under a bare GradScaler, over `layers` linear layers."""
    counted = []
    for kind, unscale in ((skips_overflowed_steps(RMSpropTF), True), (RMSpropTF, False)):
        net = chain(layers)
        optimizer = kind(net.parameters(), **HYPER)
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
        for _ in range(3):
            scaler.scale(torch.ones(()))
            for p in net.parameters():
                p.grad = torch.ones_like(p)
            with Ops() as mode:
                scaled_step(scaler, optimizer, unscale)
        counted.append(mode.ops)
    return counted[0], counted[1]


def test_the_overflow_skip_costs_a_fixed_number_of_ops_whatever_the_parameter_count() -> None:
    """The skip's own work is a handful of ops per device and dtype (foreach copies out and back, two flat wheres,
    one flat copy), over and above timm's step: the same for 8 parameters as for 64. The walk it replaced
    concatenated and split every parameter and state tensor each step: hundreds of ops at 64 parameters."""
    extra = {}
    for layers in (4, 32):
        ours, theirs = ops_a_step(layers)
        extra[layers] = len(ours) - len(theirs)
    assert extra[4] == extra[32] and 0 < extra[4] <= 12, extra


class Walked(list):
    """A parameter group's list that counts the walks over it."""

    walks = 0

    def __iter__(self) -> Any:
        Walked.walks += 1
        return super().__iter__()


def test_a_step_after_the_first_two_walks_no_parameter_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Around timm's own step (its loop is the bare loop's too), the skip reads no parameter list once its lists
    are built: not the parameters, not their gradients, not their state."""
    net = chain(8)
    optimizer = skips_overflowed_steps(RMSpropTF)(net.parameters(), **HYPER)
    for group in optimizer.param_groups:
        group["params"] = Walked(group["params"])
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    real_step = RMSpropTF.step
    inner: list[int] = []

    def timm_step(self: Any, closure: Any = None) -> Any:
        start = Walked.walks
        result = real_step(self, closure)
        inner.append(Walked.walks - start)
        return result

    monkeypatch.setattr(RMSpropTF, "step", timm_step)
    walks = []
    for _ in range(4):
        scaler.scale(torch.ones(()))
        for p in net.parameters():
            p.grad = torch.ones_like(p)
        scaler.unscale_(optimizer)  # GradScaler's walk, in the bare loop too
        Walked.walks, inner[:] = 0, []
        scaler.step(optimizer)
        walks.append(Walked.walks - sum(inner))
        scaler.update()
    assert walks[2:] == [0, 0], walks  # steps 0 and 1 build the lists (no state yet, then the new state)


def test_a_state_dict_round_trip_goes_on_bitwise_and_the_lists_follow_a_load() -> None:
    """The state tensors live in a flat buffer as views: a checkpoint of them loads into a fresh optimizer, which goes
    on as the uninterrupted one does, bitwise; and load_state_dict replaces the state the lists point to, so the
    next step lists the loaded tensors (an overflow then still leaves them as they were)."""
    nets = [network(False) for _ in range(2)]
    grads = gradients(nets[0], 6)
    optimizers = [skips_overflowed_steps(RMSpropTF)(net.parameters(), **HYPER) for net in nets]
    scalers = [torch.amp.GradScaler("cpu", init_scale=64.0) for _ in range(2)]

    def step(i: int, step: int, overflow: bool = False) -> None:
        scale = float(scalers[i].scale(torch.ones(())))
        for p, g in zip(nets[i].parameters(), grads[step], strict=True):
            p.grad = g * scale
        if overflow:
            next(nets[i].parameters()).grad[(0,) * 4] = math.nan
        scaled_step(scalers[i], optimizers[i], unscale=True)

    for s in range(3):
        step(0, s)
        step(1, s)
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizers[0].state_dict(), "scaler": scalers[0].state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    nets[1].load_state_dict(nets[0].state_dict())
    optimizers[1] = skips_overflowed_steps(RMSpropTF)(nets[1].parameters(), **HYPER)
    optimizers[1].load_state_dict(saved["optimizer"])
    scalers[1].load_state_dict(saved["scaler"])
    step(1, 3)  # the fresh optimizer's first step lists the loaded state
    before = state_of(optimizers[1], nets[1]), [p.detach().clone() for p in nets[1].parameters()]
    step(1, 4, overflow=True)
    after = state_of(optimizers[1], nets[1]), [p.detach().clone() for p in nets[1].parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before[0] + before[1], after[0] + after[1], strict=True))
    step(0, 3)
    step(0, 4, overflow=True)
    for s in (4, 5):  # the first after the overflow repeats 4 (GradScaler halves, the steps go on)
        step(0, s)
        step(1, s)
    assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(state_of(optimizers[0], nets[0]), state_of(optimizers[1], nets[1])))
    # the in-process load into a running optimizer: its old lists no longer fit
    optimizers[0].load_state_dict(optimizers[1].state_dict())
    assert isinstance(optimizers[0], SkipsOverflowedSteps)
    assert optimizers[0]._overflow_undo is not None and not optimizers[0]._overflow_undo.fits(optimizers[0])
