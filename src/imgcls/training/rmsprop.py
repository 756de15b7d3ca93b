"""RMSprop, torch's and TF's (timm's RMSpropTF: every TF2 EfficientNet recipe), that skip an overflowed fp16 step on
the device, in the update's own arithmetic, over flat buffers that hold their state and temporaries."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from timm.optim import RMSpropTF as TimmRMSpropTF

STATE_KEYS = ("square_avg", "momentum_buffer", "grad_avg")


class SkipsOverflowedSteps(torch.optim.Optimizer):
    """An RMSprop (torch's or TF's: RMSprop, RMSpropTF below) with its own update's arithmetic (the same as torch's or
    timm's, bitwise on the CPU), stepped in a fixed handful of kernels per parameter group, device and dtype, that
    skips an overflowed fp16 step on the device.

    GradScaler.step reads its found-inf flag on the host (a sync every step on a GPU) unless the optimizer declares
    `_step_supports_amp_scaling`; then it hands the flag (`found_inf`) and, where the gradients are still scaled,
    the scale (`grad_scale`) as device tensors. torch's fused kernels that skip by the flag exist for SGD and Adam
    only, and a zero gradient still moves RMSprop's square average and momentum, so the flag gates the update
    arithmetically: the gradient (weight decay added) is replaced by a zero where the flag is set (one select, so
    that an inf never meets a multiplication), the averages move by a weight of 0 (TF: the lerp sa + (1 - rho)
    (g^2 - sa)) or by a factor of 1 and a zero (torch: rho sa + (1 - rho) g^2), the momentum is multiplied by 1 and
    the weights move by a zero update. Each leaves a value bitwise as it was: x + (-0) is x, and the zero's sign is
    chosen so that the momentum and the weights get a -0. On a step without overflow the same ops compute what
    torch's and timm's do, element by element.

    A parameter's state tensors and the step's temporaries live in flat buffers, one per parameter group, device and
    dtype (_Chunk), as views with the parameter's strides: the arithmetic is one kernel per buffer; only copying the
    gradients in, the weight decay and the weights' update walk the parameters, as torch's foreach ops (one op each,
    no Python per parameter). The lists are made on the first step and again when the parameter groups, the state
    (load_state_dict), the parameters that have gradients, or momentum/centered change. The step counters also live
    in one flat tensor (one add a step); they count a skipped step too (neither update reads them). Temporaries: two
    buffers the size of the parameters, kept. A tensor learning rate is not taken (its value would be read on the
    host)."""

    _step_supports_amp_scaling = True
    _plan: _Plan | None = None
    _initial_square_avg = 0.0  # torch's; TF1's slot starts at 1 (timm)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plan = self._plan
        grads = plan.grads() if plan is not None and plan.fits(self) else None
        if plan is None or grads is None:
            plan = self._plan = _Plan(self, self._initial_square_avg)
            grads = plan.grads()
            assert grads is not None  # the new lists hold exactly the parameters that have gradients
        found_inf: torch.Tensor | None = getattr(self, "found_inf", None)
        scale: torch.Tensor | None = getattr(self, "grad_scale", None)
        # GradScaler.unscale_'s own reciprocal, so that a scaled gradient is unscaled bitwise as unscale_ does it
        inv_scale = None if scale is None else scale.double().reciprocal().float()
        gates: dict[tuple[torch.device, torch.dtype], _Gate] = {}
        for chunk, chunk_grads in zip(plan.chunks, grads, strict=True):
            gate = None
            if found_inf is not None:
                gate = gates.get(chunk.kind)
                if gate is None:
                    gate = gates[chunk.kind] = _Gate(found_inf, *chunk.kind)
            group = self.param_groups[chunk.group]
            if isinstance(group["lr"], torch.Tensor):
                raise TypeError(f"imgcls's {type(self).__name__} takes a float lr, not a tensor")
            chunk.load(chunk_grads, None if inv_scale is None else inv_scale.to(chunk.kind[0]))
            self._update(chunk, group, gate)
        if plan.steps is not None:
            plan.steps.add_(1)
        return loss

    def _update(self, chunk: _Chunk, group: dict[str, Any], gate: _Gate | None) -> None:
        raise NotImplementedError


class RMSpropTF(SkipsOverflowedSteps, TimmRMSpropTF):
    """timm's RMSpropTF (TF's update: eps inside the root, the LR inside the momentum, the square average from 1;
    the same arguments, parameter groups and state dict) as SkipsOverflowedSteps steps it. `caution` (timm's
    per-element mask) is not taken."""

    _initial_square_avg = 1.0

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        alpha: float = 0.9,
        eps: float = 1e-10,
        weight_decay: float = 0,
        momentum: float = 0.0,
        centered: bool = False,
        decoupled_decay: bool = False,
        corrected_weight_decay: bool = False,
        lr_in_momentum: bool = True,
        caution: bool = False,
        foreach: bool | None = None,
    ) -> None:
        if caution:
            raise ValueError("imgcls's RMSpropTF has no cautious variant (caution=True): use timm's RMSpropTF")
        if isinstance(lr, torch.Tensor):
            raise TypeError("imgcls's RMSpropTF takes a float lr, not a tensor")
        super().__init__(
            params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered,
            decoupled_decay=decoupled_decay, corrected_weight_decay=corrected_weight_decay,
            lr_in_momentum=lr_in_momentum, caution=caution, foreach=foreach,
        )  # fmt: skip

    def _update(self, chunk: _Chunk, group: dict[str, Any], gate: _Gate | None) -> None:
        """timm's _multi_tensor_rmsprop_tf, its lists flat, gated by the found-inf flag where there is one."""
        if group.get("caution"):
            raise ValueError("imgcls's RMSpropTF has no cautious variant (caution=True): use timm's RMSpropTF")
        lr, weight_decay, momentum, eps = group["lr"], group["weight_decay"], group["momentum"], group["eps"]
        params, g, t = chunk.params, chunk.g, chunk.t
        square_avg = chunk.flat["square_avg"]
        if weight_decay != 0 and group["decoupled_decay"]:
            wd_scale = lr if not group["corrected_weight_decay"] else lr**2 / group["max_lr_snapshot"]
            factor = 1.0 - wd_scale * weight_decay
            torch._foreach_mul_(params, factor if gate is None else gate.or_one(factor))
        if weight_decay != 0 and not group["decoupled_decay"]:
            torch._foreach_add_(chunk.g_views, params, alpha=weight_decay)
        if gate is not None:
            # A zero whose sign makes x + lr * g / avg leave x bitwise: -0 where the momentum adds it, +0 where the
            # weights subtract it (momentum 0). Also where the gradient holds infs or NaNs: nothing multiplies them.
            g.masked_fill_(gate.found, -0.0 if momentum > 0 else 0.0)
        weight = 1.0 - group["alpha"]
        weight_or_0 = weight if gate is None else gate.kept(weight)
        torch.mul(g, g, out=t)
        square_avg.lerp_(t, weight_or_0)  # sa + (1 - rho)(g^2 - sa), TF's order, timm's rounding
        if group["centered"]:
            grad_avg = chunk.flat["grad_avg"]
            grad_avg.lerp_(g, weight_or_0)
            torch.addcmul(square_avg, grad_avg, grad_avg, value=-1, out=t)
            t.add_(eps)
        else:
            torch.add(square_avg, eps, out=t)
        t.sqrt_()  # eps inside the root (TF)
        if momentum > 0:
            chunk.momentum(momentum, lr if group["lr_in_momentum"] else 1.0, gate)
            update = chunk.update(gate)
            if group["lr_in_momentum"]:  # TF: the LR inside the momentum
                torch._foreach_sub_(params, update)
            else:
                torch._foreach_add_(params, update, alpha=-lr)
        else:
            torch._foreach_addcdiv_(params, chunk.g_views, chunk.t_views, value=-lr)


class RMSprop(SkipsOverflowedSteps, torch.optim.RMSprop):
    """torch's RMSprop (eps outside the root, the square average from 0; the same arguments, parameter groups and
    state dict) as SkipsOverflowedSteps steps it. `capturable`, `differentiable` and complex parameters are not
    taken."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        if capturable or differentiable:
            raise ValueError("imgcls's RMSprop is neither capturable nor differentiable: use torch's RMSprop")
        if isinstance(lr, torch.Tensor):
            raise TypeError("imgcls's RMSprop takes a float lr, not a tensor")
        super().__init__(
            params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered,
            foreach=foreach, maximize=maximize,
        )  # fmt: skip

    def _update(self, chunk: _Chunk, group: dict[str, Any], gate: _Gate | None) -> None:
        """torch's _multi_tensor_rmsprop, its lists flat, gated by the found-inf flag where there is one."""
        if group.get("capturable") or group.get("differentiable") or chunk.kind[1].is_complex:
            raise ValueError("imgcls's RMSprop takes no capturable, differentiable or complex groups")
        lr, weight_decay, momentum, eps, alpha = (group[k] for k in ("lr", "weight_decay", "momentum", "eps", "alpha"))
        params, g, t = chunk.params, chunk.g, chunk.t
        square_avg = chunk.flat["square_avg"]
        if group["maximize"]:
            g.neg_()
        if weight_decay != 0:
            torch._foreach_add_(chunk.g_views, params, alpha=weight_decay)
        if gate is not None:  # as RMSpropTF's: a zero that leaves the momentum (-0) or the weights (+0) bitwise
            g.masked_fill_(gate.found, -0.0 if momentum > 0 else 0.0)
        square_avg.mul_(alpha if gate is None else gate.or_one(alpha))
        square_avg.addcmul_(g, g, value=1 - alpha)  # + (1 - rho) * (+0) on an overflow: unchanged
        if group["centered"]:
            grad_avg = chunk.flat["grad_avg"]
            grad_avg.lerp_(g, 1 - alpha if gate is None else gate.kept(1 - alpha))
            torch.addcmul(square_avg, grad_avg, grad_avg, value=-1, out=t)
            t.sqrt_()
        else:
            torch.sqrt(square_avg, out=t)
        t.add_(eps)  # eps outside the root (torch)
        if momentum > 0:
            chunk.momentum(momentum, 1.0, gate)
            torch._foreach_add_(params, chunk.update(gate), alpha=-lr)
        else:
            torch._foreach_addcdiv_(params, chunk.g_views, chunk.t_views, value=-lr)


class _Gate:
    """The found-inf flag on one device, and the gated scalars made from it (0-d tensors of the chunk's dtype)."""

    def __init__(self, found_inf: torch.Tensor, device: torch.device, dtype: torch.dtype) -> None:
        self.found = found_inf.to(device) != 0
        self.dtype = dtype
        self.zero = torch.zeros((), dtype=dtype, device=device)

    def kept(self, value: float) -> torch.Tensor:
        """value, or 0 on an overflow: a lerp weight that leaves the average as it was."""
        return torch.where(self.found, 0.0, value).to(self.dtype)

    def or_one(self, value: float) -> torch.Tensor:
        """value, or 1 on an overflow: a factor that leaves a tensor as it was."""
        return torch.where(self.found, 1.0, value).to(self.dtype)


def initial_state(param: torch.Tensor, group: dict[str, Any], square_avg: float) -> dict[str, torch.Tensor]:
    """A parameter's RMSprop state before its first step, as torch's and timm's steps make it, the square average
    started at `square_avg` (torch: 0, timm's RMSpropTF: 1)."""
    state = {"step": torch.tensor(0.0, dtype=_scalar_dtype()), "square_avg": torch.full_like(param, square_avg)}
    if group["momentum"] > 0:
        state["momentum_buffer"] = torch.zeros_like(param)
    if group["centered"]:
        state["grad_avg"] = torch.zeros_like(param)
    return state


class _Plan:
    """The optimizer's chunks (the parameters that have gradients, by group, device and dtype), the parameters that
    have none (torch's and timm's steps skip them: no update, no state), and the step counters' flat tensor. Made
    after the state that their step would initialise on this step has been initialised as they do."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_square_avg: float) -> None:
        self.state, self.param_groups = optimizer.state, optimizer.param_groups
        self.shape = _group_shape(optimizer.param_groups)
        self.idle: list[torch.Tensor] = []
        self.chunks: list[_Chunk] = []
        with_grads: list[torch.Tensor] = []
        for index, group in enumerate(optimizer.param_groups):
            kinds: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is None:
                    self.idle.append(p)
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("RMSprop does not support sparse gradients")
                state = optimizer.state[p]
                if len(state) == 0:
                    state.update(initial_state(p, group, initial_square_avg))
                kinds[(p.device, p.dtype)].append(p)
                with_grads.append(p)
            for kind, params in kinds.items():
                keys = [k for k in STATE_KEYS if k in optimizer.state[params[0]]]
                self.chunks.append(_Chunk(index, kind, params, optimizer.state, keys))
        self.steps = _flat_steps(optimizer.state, with_grads)
        self.first = self.chunks[0].entry(0) if self.chunks else None

    def fits(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the lists still hold: the same state and groups (load_state_dict replaces both), of the same
        shape, and the first state tensor still the view (not moved to another device, say)."""
        return (
            optimizer.state is self.state
            and optimizer.param_groups is self.param_groups
            and _group_shape(optimizer.param_groups) == self.shape
            and (self.first is None or self.state[self.first[0]].get(self.first[1]) is self.first[2])
        )

    def grads(self) -> list[list[torch.Tensor]] | None:
        """Each chunk's gradients; None where the parameters that have gradients are not the chunks' any more."""
        if any(p.grad is not None for p in self.idle):
            return None
        grads = []
        for chunk in self.chunks:
            chunk_grads = [p.grad for p in chunk.params]
            if any(g is None for g in chunk_grads):
                return None
            grads.append(chunk_grads)
        return grads  # type: ignore[return-value]  # no None left


def _group_shape(groups: list[dict[str, Any]]) -> tuple[tuple[int, bool, bool], ...]:
    return tuple((len(g["params"]), g["momentum"] > 0, bool(g["centered"])) for g in groups)


def _scalar_dtype() -> torch.dtype:
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # torch's, timm's


def _flat_steps(state: dict, params: list[torch.Tensor]) -> torch.Tensor | None:
    """The step counters of params as 0-d views of one CPU tensor (torch's and timm's live on the CPU)."""
    if not params:
        return None
    values = [state[p]["step"] for p in params]
    # a stack, not float(v): no value is read on the host (timm's are CPU tensors, or numbers in old checkpoints)
    flat = torch.stack([torch.as_tensor(v).to("cpu", _scalar_dtype()).reshape(()) for v in values])
    for i, p in enumerate(params):
        state[p]["step"] = flat[i]
    return flat


class _Chunk:
    """The parameters of one group, device and dtype that have gradients: their state tensors moved into flat
    buffers (the optimizer's state dicts hold views of them from now on), and two flat temporaries, the gradient
    (`g`) and the square/root (`t`), each with views like the parameters."""

    def __init__(
        self, group: int, kind: tuple[torch.device, torch.dtype], params: list[torch.Tensor], state: dict,
        keys: list[str],
    ) -> None:  # fmt: skip
        self.group, self.kind, self.params, self.keys = group, kind, params, keys
        self.flat: dict[str, torch.Tensor] = {}
        self.views: dict[str, list[torch.Tensor]] = {}
        for key in keys:
            values = [state[p][key] for p in params]
            self.flat[key], self.views[key] = flat_views(params)
            for p, view, value in zip(params, self.views[key], values, strict=True):
                view.copy_(value)
                state[p][key] = view
        self.g, self.g_views = flat_views(params)
        self.t, self.t_views = flat_views(params)

    def entry(self, index: int) -> tuple[torch.Tensor, str, torch.Tensor]:
        return self.params[index], "square_avg", self.views["square_avg"][index]

    def load(self, grads: list[torch.Tensor], inv_scale: torch.Tensor | None) -> None:
        """The gradients into `g` (unscaled where GradScaler.step left them scaled)."""
        torch._foreach_copy_(self.g_views, grads)
        if inv_scale is not None:
            self.g.mul_(inv_scale)

    def momentum(self, momentum: float, scale: float, gate: _Gate | None) -> None:
        """buf = momentum * buf + scale * g / t; on an overflow buf * 1 + (-0)."""
        buf = self.flat["momentum_buffer"]
        buf.mul_(momentum if gate is None else gate.or_one(momentum))
        buf.addcdiv_(self.g, self.t, value=scale)

    def update(self, gate: _Gate | None) -> list[torch.Tensor]:
        """The momentum's views; on an overflow, `g`'s, holding the momentum or, where the flag is set, +0."""
        if gate is None:
            return self.views["momentum_buffer"]
        torch.where(gate.found, gate.zero, self.flat["momentum_buffer"], out=self.g)
        return self.g_views


def flat_views(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A zeroed flat buffer with room for each tensor (each start 64-byte aligned) and a view like each: its shape,
    and its strides where it is dense (channels_last weights too), so that foreach ops between the views and the
    tensors keep to torch's multi-tensor kernels. The gaps stay zero: the flat arithmetic over them makes no NaN."""
    align = max(1, 64 // tensors[0].element_size())
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.numel() // align) * align
    flat = torch.zeros(total, dtype=tensors[0].dtype, device=tensors[0].device)
    return flat, [_view_like(flat, t, o) for t, o in zip(tensors, offsets, strict=True)]


def _view_like(flat: torch.Tensor, t: torch.Tensor, offset: int) -> torch.Tensor:
    if _dense(t):
        return flat.as_strided(t.shape, t.stride(), offset)
    return flat[offset : offset + t.numel()].view(t.shape)


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill numel() consecutive places of its storage, in some order of its dimensions."""
    expected = 1
    for stride, size in sorted((s, n) for n, s in zip(t.shape, t.stride(), strict=True) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True
