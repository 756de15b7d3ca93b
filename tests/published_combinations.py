"""`python tests/published_combinations.py CASES.json OUT`: each case (a list of train.py overrides) trained on
this DDP rank for 2 optimizer steps (one epoch, validated, last.ckpt), then resumed with ckpt_path=last for 2
more; rank 0 writes OUT/results.json. One process pair runs every case: Lightning's launcher starts rank 1 by
running this script again, and the later fits reuse the ranks and their process group (a launch per case
would cost ~10 s each). tests/test_published_combinations.py makes the cases from conf/experiment/.

Each rank also writes OUT/probe_rank{R}.json: what every fit did on that rank, seen from a callback appended to the
trainer's (Probe): the precision plugin, the logits' dtype, the data backend, the mixup and label smoothing in
effect (batches whose network input differs from the loaded images; the smoothing implied by the loss), every EMA
update's observed decay, and SHA-256 hashes of the network's and the EMA copy's parameters at the end of the fit.
CASES.json's "uninterrupted" cases train 2 epochs in one fit (run dir NAME.uninterrupted), for the resumed run's
weights to be compared with."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import imgcls.run.train  # noqa: E402
from tests.conftest import compose_config  # noqa: E402


def params_hash(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, p in module.named_parameters():
        digest.update(name.encode())
        digest.update(p.detach().cpu().numpy().tobytes())  # C order, whatever the strides
    return digest.hexdigest()


def params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().double().clone() for p in module.parameters()]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


class Probe(L.Callback):
    """Records one fit on this rank (see the module docstring). Callbacks' on_train_batch_end runs before the
    module's, which updates the EMA: the EMA and network there are the update's inputs, and its output is read at
    the next batch's start, at validation or at the end of training."""

    def __init__(self, initial: dict[str, list[torch.Tensor]]) -> None:
        self.initial = initial  # the case's initial weights, kept from its first fit
        self.facts: dict[str, Any] = {"batches": 0, "mixed_batches": 0, "dtypes": [], "ema_updates": [],
                                      "implied_smoothing": [], "soft_targets": []}  # fmt: skip
        self._images: torch.Tensor | None = None
        self._ema_inputs: tuple[int, list[torch.Tensor], list[torch.Tensor]] | None = None

    def on_train_start(self, trainer: L.Trainer, module: Any) -> None:
        self.initial.setdefault("net", params(module.net))
        self.facts.update(
            precision_plugin=type(trainer.precision_plugin).__name__,
            scaler=getattr(trainer.precision_plugin, "scaler", None) is not None,
            backend=type(trainer.datamodule.backend).__name__,
            dali_gpu=getattr(trainer.datamodule.backend, "gpu", None),
            mixup=None if module.mixup is None else {
                "mode": module.mixup.mode, "mixup_alpha": module.mixup.mixup_alpha,
                "cutmix_alpha": module.mixup.cutmix_alpha, "label_smoothing": module.mixup.label_smoothing},
            ema_decay=None if module.ema is None else module.ema.decay,
        )  # fmt: skip
        self._hooks = [
            module.net.register_forward_pre_hook(self._net_input),
            module.net.register_forward_hook(self._net_output),
            module.train_criterion.register_forward_hook(self._loss),
        ]

    def _net_input(self, net: torch.nn.Module, args: tuple) -> None:
        if net.training and self._images is not None:
            self.facts["batches"] += 1
            self.facts["mixed_batches"] += int(not torch.equal(args[0], self._images))
            self._images = None

    def _net_output(self, net: torch.nn.Module, args: tuple, logits: torch.Tensor) -> None:
        if net.training and str(logits.dtype) not in self.facts["dtypes"]:
            self.facts["dtypes"].append(str(logits.dtype))

    def _loss(self, criterion: torch.nn.Module, args: tuple, loss: torch.Tensor) -> None:
        logits, targets = (a.detach().float() for a in args)
        self.facts["soft_targets"].append(targets.dim() == 2)
        if targets.dim() == 1:  # smoothing s: loss = (1 - s) * CE + s * mean over classes of -log p
            plain = F.cross_entropy(logits, targets.long())
            uniform = -F.log_softmax(logits, 1).mean()
            self.facts["implied_smoothing"].append(float((loss.float() - plain) / (uniform - plain)))

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
        self._settle_ema(module)
        self._images = batch[0].detach().clone()  # mixup mixes the batch in place

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if module.ema is not None and trainer.global_step != getattr(self, "_stepped", None):
            self._stepped = trainer.global_step
            self._ema_inputs = (trainer.global_step, params(module.ema.module), params(module.net))

    def on_validation_start(self, trainer: L.Trainer, module: Any) -> None:
        self._settle_ema(module)

    def _settle_ema(self, module: Any) -> None:
        """The update's observed decay d (least squares over every parameter: ema_after - net = d (ema_before -
        net)) and the largest residual of that fit: a lerp toward the network by the decay the test expects. None when
        the network equals the EMA's input (step 1: warmup's LR 0; a step GradScaler skipped): the residual is then
        ema_after - net."""
        if self._ema_inputs is None:
            return
        step, before, net = self._ema_inputs
        after = params(module.ema.module)
        self._ema_inputs = None
        a = torch.cat([(x - n).flatten() for x, n in zip(after, net)])
        b = torch.cat([(x - n).flatten() for x, n in zip(before, net)])
        if not (b @ b):  # the network did not move: any decay fits, none is observed
            self.facts["ema_updates"].append([step, None, float(a.abs().max())])
            return
        decay = float(a @ b / (b @ b))
        self.facts["ema_updates"].append([step, decay, float((a - decay * b).abs().max())])

    def on_train_end(self, trainer: L.Trainer, module: Any) -> None:
        self._settle_ema(module)
        for hook in self._hooks:
            hook.remove()
        net = params(module.net)
        self.facts.update(net_hash=params_hash(module.net), net_moved=max_diff(net, self.initial["net"]))
        if module.ema is not None:
            ema = params(module.ema.module)
            self.facts.update(ema_hash=params_hash(module.ema.module), ema_vs_net=max_diff(ema, net),
                              ema_vs_initial=max_diff(ema, self.initial["net"]))  # fmt: skip


def fit(overrides: list[str], run_dir: Path, initial: dict[str, list[torch.Tensor]]) -> tuple[dict, dict]:
    probe = Probe(initial)

    def with_probe(cfg: Any, plan: Any, callbacks: list, loggers: list) -> L.Trainer:
        return build_trainer(cfg, plan, [*callbacks, probe], loggers)

    imgcls.run.train.build_trainer = with_probe
    try:
        summary = imgcls.run.train.run(compose_config(overrides, run_dir=run_dir))
    finally:
        imgcls.run.train.build_trainer = build_trainer
    return summary, probe.facts


build_trainer = imgcls.run.train.build_trainer
spec, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
rank = int(os.environ.get("LOCAL_RANK", 0))
results, probes = {}, {}
for name, overrides in spec["cases"].items():
    run_dir, initial = out / name, {}
    print(f"rank {rank}: case {name}", flush=True)
    first, probes[name] = fit([*overrides, "trainer.max_epochs=1"], run_dir, initial)
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    resumed, probes[f"{name}.resumed"] = fit([*overrides, "trainer.max_epochs=2", "ckpt_path=last"], run_dir, initial)
    final = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    rows = json.loads((run_dir / "report.json").read_text())["epochs"]
    results[name] = {
        "steps": [saved["global_step"], final["global_step"]],
        "validated_epochs": [row.get("epoch") for row in rows if "val.top1" in row],
        "finite": all(math.isfinite(float(s.get("train.loss", math.nan))) for s in (first, resumed)),
        "ema_in_checkpoint": any(k.startswith("ema.") for k in final["state_dict"]),
        "scaler_in_checkpoint": "MixedPrecision" in final,  # Lightning's key for the GradScaler state
        "charts": (run_dir / "plots").exists(),
    }
for name, overrides in spec["uninterrupted"].items():
    print(f"rank {rank}: case {name}, uninterrupted", flush=True)
    _, probes[f"{name}.uninterrupted"] = fit([*overrides, "trainer.max_epochs=2"], out / f"{name}.uninterrupted", {})
(out / f"probe_rank{rank}.json").write_text(json.dumps(probes, indent=1))
if rank == 0:
    (out / "results.json").write_text(json.dumps(results, indent=1))
