"""`python -m imgcls.bench.bare_loop --data ROOT [...]`: one epoch of a plain PyTorch training loop over a folder of
JPEGs, the yardstick gpu-check's cifar_bare_loop row holds imgcls's cifar_end_to_end epoch against.

It is what a user would write from the PyTorch examples, and nothing of imgcls: torchvision's ImageFolder with
uint8 crop and flip transforms, a pinned DataLoader, normalization on the device, torch.autocast fp16 with a
GradScaler, SGD, a timm network. Its clock runs as imgcls's train timer does (training/timing.py): from the epoch's
start (before the loader's workers start) to the device's end of the last step, so the two wall times compare.
It prints one line, `bare_loop: {json}` with samples, steps, wall_s and ips.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch


def loader(root: str, image_size: int, batch: int, workers: int, prefetch: int) -> torch.utils.data.DataLoader:
    """The train split's loader: uint8 CHW crops (normalized later, on the device), shuffled, whole batches."""
    from torchvision import datasets
    from torchvision.transforms import v2

    transform = v2.Compose(
        [
            v2.RandomResizedCrop(image_size, scale=(0.08, 1.0), antialias=True),  # on the PIL image
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
        ]
    )
    dataset = datasets.ImageFolder(f"{root}/train", transform=transform)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),  # pinned for the copies ahead to the GPU; no GPU, nothing to pin
        drop_last=True,
        prefetch_factor=prefetch if workers > 0 else None,
        persistent_workers=workers > 0,
    )


def train_epoch(args: argparse.Namespace) -> dict[str, Any]:
    """One epoch; on a CPU (the tests) the same loop without autocast's fp16 and the scaler."""
    import timm

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    # What imgcls's Trainer switches on (run/trainer.py): without it the bare loop would run slower kernels.
    torch.backends.cudnn.benchmark = True
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    data = loader(args.data, args.image_size, args.batch, args.workers, args.prefetch)
    classes = args.num_classes or len(data.dataset.classes)  # type: ignore[attr-defined]
    net = timm.create_model(args.arch, num_classes=classes, pretrained=False)
    net = net.to(device).to(memory_format=memory_format)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()  # imgcls's timer starts at the epoch's start, before its workers start too
    samples = steps = 0
    for images, labels in data:
        images = images.to(device, non_blocking=True).to(memory_format=memory_format)
        labels = labels.to(device, non_blocking=True)
        images = (images.float() - mean) / std
        with torch.autocast(device.type, dtype=torch.float16 if cuda else torch.bfloat16, enabled=cuda):
            loss = criterion(net(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        samples += len(labels)
        steps += 1
        if args.max_steps and steps >= args.max_steps:
            break
    if cuda:
        torch.cuda.synchronize()  # the device's end of the last step, as imgcls's timer reads it
    wall = time.perf_counter() - started
    return {"samples": samples, "steps": steps, "wall_s": wall, "ips": samples / max(wall, 1e-9)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m imgcls.bench.bare_loop", description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="ROOT with train/ class folders of JPEGs")
    p.add_argument("--arch", default="resnet18", help="timm model name")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=0, help="0: the number of class folders")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=4, help="batches each worker loads ahead")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.875)
    p.add_argument("--weight-decay", type=float, default=5e-5)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--max-steps", type=int, default=0, help="stop the epoch after this many steps (0: the whole epoch)")
    return p


def parse_result(text: str) -> dict[str, float]:
    """The figures of the `bare_loop: {json}` line in `text` (its output); ValueError without one."""
    for line in reversed(text.splitlines()):
        if line.startswith("bare_loop: "):
            figures = json.loads(line.removeprefix("bare_loop: "))
            return {key: float(figures[key]) for key in ("samples", "steps", "wall_s", "ips")}
    raise ValueError("no 'bare_loop: {...}' line in bench.bare_loop's output")


def main(argv: list[str] | None = None) -> int:
    result = train_epoch(parser().parse_args(argv))
    print("bare_loop: " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
