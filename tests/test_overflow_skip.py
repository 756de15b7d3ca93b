"""Skipping an overflowed fp16 step on the device (issue 39): imgcls's RMSprop and RMSpropTF gate their own
arithmetic by the found-inf flag. Against torch's RMSprop and timm's RMSpropTF stepped as GradScaler steps them
(unscale_, a host read of the flag, no step on an overflow): the same weights and state, bitwise, on channels_last
weights too; a fixed number of tensor ops a step, whatever the number of parameters; about as much memory written a
step as their own update writes."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pytest
import timm
import torch
from timm.optim import RMSpropTF as TimmRMSpropTF
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from imgcls.run.train import run
from imgcls.training.optimizer import build_optimizer
from imgcls.training.rmsprop import RMSprop, RMSpropTF
from tests.conftest import compose_config, tiny_overrides

HYPER = {"lr": 0.05, "alpha": 0.9, "eps": 1e-3, "momentum": 0.9, "weight_decay": 1e-5}


class Ops(TorchDispatchMode):
    """The tensor ops run, and the elements each writes (the tensors it mutates, or those it returns)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.written = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if str(func).startswith("profiler."):  # Optimizer.step's record_function marks: no tensor work
            return result
        self.ops.append(str(func))
        values = dict(zip((a.name for a in func._schema.arguments), args, strict=False)) | kwargs
        mutated = [values.get(a.name) for a in func._schema.arguments if a.alias_info and a.alias_info.is_write]
        self.written += sum(_numel(t) for t in (mutated if mutated else [result]))
        return result


def _numel(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple)):
        return sum(_numel(v) for v in value)
    return 0


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


def bitwise(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Equal values and equal bits: torch.equal alone takes -0 for +0."""
    return len(a) == len(b) and all(
        torch.equal(x, y) and torch.equal(torch.signbit(x), torch.signbit(y)) for x, y in zip(a, b, strict=True)
    )


KINDS = {
    "rmsprop_tf": (RMSpropTF, TimmRMSpropTF),
    "rmsprop": (RMSprop, torch.optim.RMSprop),
}


@pytest.mark.parametrize("unscale", [True, False], ids=["unscaled-first", "scaled"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("overflow_at", [None, 0, 1, 3])
@pytest.mark.parametrize("kind", list(KINDS))
def test_skipping_on_the_device_equals_the_host_skip(
    kind: str, overflow_at: int | None, channels_last: bool, unscale: bool
) -> None:
    """Every step's weights and state equal those of the user's optimizer under a bare GradScaler, bitwise, where the
    overflowed step is skipped on the host; at the very first step too: the state is the initial one, as the user's
    is when its first step is the next one. (The copy-and-select skip this replaced had no state to go back to
    there: it left the state a zero gradient makes.)"""
    ours_kind, theirs_kind = KINDS[kind]
    ours_net, theirs_net = network(channels_last), network(channels_last)
    ours = ours_kind(ours_net.parameters(), **HYPER)
    theirs = theirs_kind(theirs_net.parameters(), **HYPER)
    scalers = [torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=3) for _ in range(2)]
    steps = gradients(ours_net, 6)
    for step, grads in enumerate(steps):
        for net, scaler in zip((ours_net, theirs_net), scalers, strict=True):
            scale = float(scaler.scale(torch.ones(())))
            for p, g in zip(net.parameters(), grads, strict=True):
                p.grad = g * scale
            if step == overflow_at:
                next(net.parameters()).grad[(0,) * 4] = math.inf
                list(net.parameters())[-1].grad[0] = math.nan
        before = [p.detach().clone() for p in ours_net.parameters()]
        scaled_step(scalers[0], ours, unscale)
        scaled_step(scalers[1], theirs, unscale=False)
        assert scalers[0].get_scale() == scalers[1].get_scale()
        if step == overflow_at:
            assert bitwise(before, [p.detach() for p in ours_net.parameters()])
        assert bitwise([p.detach() for p in ours_net.parameters()], [p.detach() for p in theirs_net.parameters()])
        if step != overflow_at or overflow_at != 0:  # timm makes no state on a skipped first step
            assert bitwise(state_of(ours, ours_net), state_of(theirs, theirs_net))
    assert any(not p.is_contiguous() for p in ours_net.parameters()) is channels_last
    # the state's flat views keep the weights' strides (the layout the optimizer made them in)
    assert all(v.stride() == p.stride() for p in ours_net.parameters() for k, v in ours.state[p].items() if k != "step")


OPTIONS = {
    "rmsprop_tf": [
        {},
        {"centered": True},
        {"lr_in_momentum": False},
        {"momentum": 0.0},
        {"momentum": 0.0, "centered": True},
        {"decoupled_decay": True},
        {"decoupled_decay": True, "corrected_weight_decay": True},
        {"weight_decay": 0.0},
    ],
    "rmsprop": [{}, {"centered": True}, {"momentum": 0.0}, {"momentum": 0.0, "centered": True}, {"maximize": True}],
}


@pytest.mark.parametrize(
    ("kind", "options"), [(kind, options) for kind, each in OPTIONS.items() for options in each], ids=repr
)
def test_every_option_is_the_users_update_and_an_overflow_changes_no_bit(kind: str, options: dict[str, Any]) -> None:
    """Without a loss scaler (fp32, bf16) the step is torch's or timm's, bitwise, for every option of their update;
    with one, an overflowed step leaves weights and state bitwise as they were (a -0 momentum and weight too)."""
    ours_kind, theirs_kind = KINDS[kind]
    hyper = HYPER | {"weight_decay": 1e-2} | options
    nets = [network(False), network(False)]
    with torch.no_grad():  # signed zeros, which a careless zero update flips
        next(nets[0].parameters())[0].zero_().neg_()
        next(nets[1].parameters())[0].zero_().neg_()
    ours, theirs = ours_kind(nets[0].parameters(), **hyper), theirs_kind(nets[1].parameters(), **hyper)
    for grads in gradients(nets[0], 4):
        for net, optimizer in zip(nets, (ours, theirs), strict=True):
            for p, g in zip(net.parameters(), grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
        assert bitwise([p.detach() for p in nets[0].parameters()], [p.detach() for p in nets[1].parameters()])
        assert bitwise(state_of(ours, nets[0]), state_of(theirs, nets[1]))
    if hyper["momentum"]:
        ours.state[next(nets[0].parameters())]["momentum_buffer"][0] = -0.0
    before = [p.detach().clone() for p in nets[0].parameters()], state_of(ours, nets[0])
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.ones(()))
    for p, g in zip(nets[0].parameters(), gradients(nets[0], 1)[0], strict=True):
        p.grad = g * 8.0
    next(nets[0].parameters()).grad.view(-1)[-1] = -math.inf
    scaled_step(scaler, ours, unscale=True)
    assert bitwise(before[0], [p.detach() for p in nets[0].parameters()])
    assert bitwise(before[1], state_of(ours, nets[0]))
    assert scaler.get_scale() == 4.0


def chain(layers: int) -> nn.Module:
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])


def ops_a_step(
    ours_kind: type[torch.optim.Optimizer], theirs_kind: type[torch.optim.Optimizer], net: nn.Module
) -> tuple[Ops, Ops]:
    """The tensor ops of the third scaled step (the lists are built by then) of imgcls's optimizer (unscale_, step,
    update, as its precision plugin runs them) and of the user's under a bare GradScaler."""
    counted = []
    for kind, unscale in ((ours_kind, True), (theirs_kind, False)):
        torch.manual_seed(0)
        optimizer = kind(net.parameters(), **HYPER)
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
        for _ in range(3):
            scaler.scale(torch.ones(()))
            for p in net.parameters():
                p.grad = torch.ones_like(p)
            with Ops() as mode:
                scaled_step(scaler, optimizer, unscale)
        counted.append(mode)
    return counted[0], counted[1]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_step_is_a_fixed_number_of_ops_whatever_the_parameter_count(kind: str) -> None:
    """A whole step, the overflow skip and the scaler's check and update included, is a fixed number of ops (the
    arithmetic flat, the walks over the parameters foreach ops): the same for 8 parameters as for 64, and fewer
    than the user's optimizer runs for 8 (on a CPU torch's and timm's step are a loop over the parameters)."""
    ours_kind, theirs_kind = KINDS[kind]
    counted = {layers: ops_a_step(ours_kind, theirs_kind, chain(layers)) for layers in (4, 32)}
    count = {layers: len(ours.ops) for layers, (ours, _) in counted.items()}
    assert count[4] == count[32] <= 32 < len(counted[4][1].ops), counted[4][0].ops


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_overflow_skip_writes_about_what_the_users_step_writes(kind: str) -> None:
    """The elements a step writes (what the memory traffic of an update this size is made of), in units of the
    parameters' count: build_optimizer's RMSprop (the scaler's check and unscale, the step, the scaler's update)
    writes at most 3 parameter counts more than the user's optimizer under a bare GradScaler (the gradient's copy
    into the flat buffer, its zero for an overflow and the gated update: 12 against torch's 9; against timm's 11,
    whose temporaries it spares), where the copy-and-select skip it replaced copied 3x the parameters out and
    selected them back (17 against torch's 9, 19 against timm's 11)."""
    net = network(False)
    recipe = type("Recipe", (), {"optimizer": kind, "rmsprop_alpha": 0.9, "rmsprop_eps": 1e-3, "momentum": 0.9})
    built = build_optimizer([{"params": list(net.parameters()), "weight_decay": 1e-5}], recipe, 0.05)
    assert isinstance(built, KINDS[kind][0])
    ours, theirs = ops_a_step(lambda params, **_: built, KINDS[kind][1], net)  # type: ignore[arg-type,return-value]
    count = sum(p.numel() for p in net.parameters())
    assert ours.written <= theirs.written + 3.2 * count, (ours.written / count, theirs.written / count)


class Walked(list):
    """A parameter group's list that counts the walks over it."""

    walks = 0

    def __iter__(self) -> Any:
        Walked.walks += 1
        return super().__iter__()


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_step_after_the_first_walks_no_parameter_list(kind: str) -> None:
    """Once its lists are built (the first step), a step reads no parameter group's list: not the parameters, not
    their gradients, not their state."""
    net = chain(8)
    optimizer = KINDS[kind][0](net.parameters(), **HYPER)
    for group in optimizer.param_groups:
        group["params"] = Walked(group["params"])
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    walks = []
    for _ in range(4):
        scaler.scale(torch.ones(()))
        for p in net.parameters():
            p.grad = torch.ones_like(p)
        scaler.unscale_(optimizer)  # GradScaler's walk, in the bare loop too
        Walked.walks = 0
        scaler.step(optimizer)
        walks.append(Walked.walks)
        scaler.update()
    assert walks[0] > 0 and walks[1:] == [0, 0, 0], walks


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_state_dict_round_trip_goes_on_bitwise_and_the_lists_follow_a_load(kind: str) -> None:
    """The state tensors live in a flat buffer as views: a checkpoint of them loads into a fresh optimizer, which goes
    on as the uninterrupted one does, bitwise; and load_state_dict replaces the state the lists point to, so the
    next step lists the loaded tensors (an overflow then still leaves them as they were)."""
    ours_kind, _ = KINDS[kind]
    nets = [network(False) for _ in range(2)]
    grads = gradients(nets[0], 6)
    optimizers = [ours_kind(net.parameters(), **HYPER) for net in nets]
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
    optimizers[1] = ours_kind(nets[1].parameters(), **HYPER)
    optimizers[1].load_state_dict(saved["optimizer"])
    scalers[1].load_state_dict(saved["scaler"])
    step(1, 3)  # the fresh optimizer's first step lists the loaded state
    before = state_of(optimizers[1], nets[1]), [p.detach().clone() for p in nets[1].parameters()]
    step(1, 4, overflow=True)
    after = state_of(optimizers[1], nets[1]), [p.detach().clone() for p in nets[1].parameters()]
    assert bitwise(before[0] + before[1], after[0] + after[1])
    step(0, 3)
    step(0, 4, overflow=True)
    for s in (4, 5):  # the first after the overflow repeats 4 (GradScaler halves, the steps go on)
        step(0, s)
        step(1, s)
    assert bitwise([p.detach() for p in nets[0].parameters()], [p.detach() for p in nets[1].parameters()])
    assert bitwise(state_of(optimizers[0], nets[0]), state_of(optimizers[1], nets[1]))
    # the in-process load into a running optimizer: its old lists no longer fit
    optimizers[0].load_state_dict(optimizers[1].state_dict())
    assert optimizers[0]._plan is not None and not optimizers[0]._plan.fits(optimizers[0])


@pytest.mark.parametrize("kind", list(KINDS))
def test_state_dicts_are_the_users_optimizers(kind: str) -> None:
    """A checkpoint's optimizer state goes both ways between imgcls's RMSprop(TF) and torch's (timm's) (a resume from
    a run before this optimizer, or a user's own loop from an imgcls checkpoint), and training goes on bitwise."""
    ours_kind, theirs_kind = KINDS[kind]
    nets = [network(False) for _ in range(3)]
    grads = gradients(nets[0], 5)
    ours, theirs = ours_kind(nets[0].parameters(), **HYPER), theirs_kind(nets[1].parameters(), **HYPER)

    def step(net: nn.Module, optimizer: torch.optim.Optimizer, s: int) -> None:
        for p, g in zip(net.parameters(), grads[s], strict=True):
            p.grad = g.clone()
        optimizer.step()

    for s in range(2):
        step(nets[0], ours, s)
        step(nets[1], theirs, s)
    buffer = io.BytesIO()
    torch.save(ours.state_dict(), buffer)
    buffer.seek(0)
    nets[2].load_state_dict(nets[0].state_dict())
    timms = theirs_kind(nets[2].parameters(), **HYPER)
    timms.load_state_dict(torch.load(buffer, weights_only=True))
    ours.load_state_dict(theirs.state_dict())  # the user's tensors, now moved into imgcls's flat buffers
    for s in range(2, 5):
        step(nets[0], ours, s)
        step(nets[1], theirs, s)
        step(nets[2], timms, s)
    for net, optimizer in ((nets[1], theirs), (nets[2], timms)):
        assert bitwise([p.detach() for p in nets[0].parameters()], [p.detach() for p in net.parameters()])
        assert bitwise(state_of(ours, nets[0]), state_of(optimizer, net))
    assert [float(ours.state[p]["step"]) for p in nets[0].parameters()] == [5.0] * len(grads[0])


@pytest.mark.parametrize("kind", list(KINDS))
def test_parameters_without_gradients_are_skipped_as_the_users_optimizer_skips_them(kind: str) -> None:
    """torch's and timm's steps leave a parameter without a gradient alone (no update, no state); imgcls's lists
    follow the parameters that have gradients, step by step."""
    nets = [chain(3), chain(3)]
    nets[1].load_state_dict(nets[0].state_dict())
    ours, theirs = KINDS[kind][0](nets[0].parameters(), **HYPER), KINDS[kind][1](nets[1].parameters(), **HYPER)
    generator = torch.Generator().manual_seed(2)
    for absent in ({1}, {1}, set(), {0, 5}, set()):
        grads = [torch.randn(p.shape, generator=generator) for p in nets[0].parameters()]
        for net, optimizer in zip(nets, (ours, theirs), strict=True):
            for i, (p, g) in enumerate(zip(net.parameters(), grads, strict=True)):
                p.grad = None if i in absent else g.clone()
            optimizer.step()
        assert bitwise([p.detach() for p in nets[0].parameters()], [p.detach() for p in nets[1].parameters()])
        made = [len(ours.state[p]) for p in nets[0].parameters()]
        assert made == [len(theirs.state[p]) for p in nets[1].parameters()]
        assert bitwise(state_of(ours, nets[0]), state_of(theirs, nets[1]))


def test_what_the_flat_update_cannot_do_is_refused() -> None:
    with pytest.raises(ValueError, match="caution"):
        RMSpropTF(chain(1).parameters(), caution=True)
    with pytest.raises(ValueError, match="capturable"):
        RMSprop(chain(1).parameters(), capturable=True)
    for kind in (RMSprop, RMSpropTF):
        with pytest.raises(TypeError, match="float lr"):
            kind(chain(1).parameters(), lr=torch.tensor(0.1))


@pytest.mark.slow
def test_an_fp16_rmsprop_tf_run_resumed_from_its_checkpoint_ends_as_the_uninterrupted_one(
    image_folder: Path, tmp_path: Path
) -> None:
    """The real Trainer, fp16 loss scaling on the CPU, TF's RMSprop: stopped after epoch 1 and resumed with
    ckpt_path=last (the optimizer state loads from the checkpoint into new flat buffers), the weights and the
    optimizer state at the end are the uninterrupted run's, bitwise."""
    argv = tiny_overrides(image_folder, "recipe.epochs=2", "precision=amp", "precision.cpu_fp16=true",
                          "model.channels_last=false", "recipe.optimizer=rmsprop_tf", "recipe.rmsprop_alpha=0.9",
                          "recipe.rmsprop_eps=0.001")  # fmt: skip
    run(compose_config(argv, run_dir=tmp_path / "ref"))
    run(compose_config([*argv, "trainer.max_epochs=1"], run_dir=tmp_path / "resumed"))
    run(compose_config([*argv, "ckpt_path=last"], run_dir=tmp_path / "resumed"))
    a, b = (
        torch.load(tmp_path / name / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        for name in ("ref", "resumed")
    )
    assert a["global_step"] == b["global_step"] > 0
    assert bitwise(list(a["state_dict"].values()), list(b["state_dict"].values()))
    states = [[v for s in ckpt["optimizer_states"][0]["state"].values() for v in s.values()] for ckpt in (a, b)]
    assert len(states[0]) > 0 and bitwise(*states)
