"""How dali_cpu's (and dali_gpu's) batches reach a CUDA training device (issue 39 item 1): from pinned memory,
ahead of their step, off the compute stream (data/dali/settings.py Delivery). Where DALI resizes (its fn.resize,
the augment policies, small images, validation) the pipeline ends in `.gpu()` as NVIDIA's dali-cpu pipeline; the
torch resize writes pinned batches and the loader's producer thread stages their copy on a side stream
(data/device_prefetch.py CudaCopies). On CPU: the decision for a CUDA device, the pipeline graph it builds, and
the staging order and positions with a CPU stand-in for the copier; the rest runs only on a GPU (marked gpu)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from imgcls.data.backends import make_backend
from imgcls.data.protocol import LoaderSpec
from tests.conftest import compose_config, make_image_folder, tiny_overrides

pytest.importorskip("nvidia.dali")

from imgcls.data.dali.pipelines import FolderSource  # noqa: E402 - after the importorskip
from imgcls.data.dali.settings import Delivery  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA1 = torch.device("cuda", 1)  # a device object needs no GPU: the decisions below are made for it on CPU


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 24 train images: 6 batches of 4; 9 val images: a partial last batch.
    return make_image_folder(tmp_path_factory.mktemp("dali"), classes=3, train_per_class=8, val_per_class=3)


def data_cfg(root: Path, *extra: str) -> Any:
    return compose_config(tiny_overrides(root, "data.backend=dali_cpu", *extra)).data


class RecordingCopier:
    """A CPU stand-in for device_prefetch.CudaCopies: stage() copies the batch (clone, where the real one queues a
    copy to the device) and records which batch it staged in which thread; hand_over() records the order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []
        self.staged = 0
        self._lock = threading.Lock()

    def stage(self, batch: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], int]:
        with self._lock:
            self.staged += 1
            number = self.staged
            self.events.append(("stage", number, threading.current_thread().name))
        return tuple(t.clone() for t in batch), number

    def hand_over(self, staged: tuple[tuple[torch.Tensor, ...], int]) -> tuple[torch.Tensor, ...]:
        batch, number = staged
        self.events.append(("hand over", number, threading.current_thread().name))
        return batch


def kept(batches: Any) -> list[tuple[torch.Tensor, ...]]:
    """Every batch, cloned as it comes: the torch resize rewrites its ring of buffers once the consumer moved on."""
    return [tuple(t.clone() for t in batch) for batch in batches]


def same(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q))


# --- the decision, for a CUDA device, made on CPU ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("split", "extra", "expected"),
    [
        # The torch resize (dali_cpu's default from 128 px): no CUDA in the pipeline, pinned batches, side stream.
        ("train", ("data.dali_train_resize=torch", "data.pin_memory=true"), Delivery(None, False, True, True)),
        ("train", ("data.dali_train_resize=torch", "data.pin_memory=false"), Delivery(None, False, False, True)),
        # Every path where DALI resizes: the pipeline ends in .gpu() on the training device.
        ("train", ("data.dali_train_resize=dali",), Delivery(1, True, False, True)),
        ("train", ("data.augment=randaugment", "data.interpolation=bicubic"), Delivery(1, True, False, True)),
        ("train", ("data.augment=autoaugment",), Delivery(1, True, False, True)),
        ("train", (), Delivery(1, True, False, True)),  # auto below 128 px (debug=tiny: 32 px)
        ("val", ("data.dali_train_resize=torch", "data.pin_memory=true"), Delivery(1, True, False, True)),
    ],
)
def test_every_dali_cpu_path_reaches_a_cuda_device_pinned_and_off_the_compute_stream(
    folder: Path, split: str, extra: tuple[str, ...], expected: Delivery
) -> None:
    backend = make_backend(data_cfg(folder, *extra))
    assert backend.delivery(LoaderSpec(split, 4, device=CUDA1)) == expected
    # On the CPU (a CPU run, evaluate's own loop, tests) dali_cpu leaves CUDA alone, as before.
    for device in (None, torch.device("cpu")):
        assert backend.delivery(LoaderSpec(split, 4, device=device)) == Delivery(None, False, False, False)


def test_dali_gpu_batches_copy_the_rest_on_a_side_stream(folder: Path) -> None:
    """dali_gpu's images are made on the GPU; its labels (train and val) go by the side stream too, on the spec's
    device rather than whichever is current."""
    from dataclasses import replace

    settings = replace(make_backend(data_cfg(folder)).settings, gpu=True)
    assert settings.delivery(CUDA1, host_resize=False) == Delivery(1, False, False, True)


@pytest.mark.parametrize(
    ("split", "extra", "on_gpu"),
    [
        ("train", ("data.dali_train_resize=dali",), True),
        ("train", ("data.augment=randaugment", "data.interpolation=bicubic"), True),
        ("val", (), True),
        ("train", ("data.dali_train_resize=torch",), False),
    ],
)
def test_the_pipeline_for_a_cuda_device_ends_in_dalis_own_copy(
    folder: Path, tmp_path: Path, split: str, extra: tuple[str, ...], on_gpu: bool
) -> None:
    """The graph the backend builds for a CUDA device, defined (not built: building needs the GPU): the images
    leave through DALI's .gpu() and the layout/flip (crop_mirror_normalize) runs on the GPU; the keys and flags stay
    on the host. The torch resize's pipeline keeps every output on the host (the loader pins and copies)."""
    backend = make_backend(data_cfg(folder, *extra))
    listing = tmp_path / "list.txt"
    listing.write_text("")
    source = FolderSource(str(listing), str(folder / split))
    for device, expect_gpu in ((torch.device("cuda", 0), on_gpu), (torch.device("cpu"), False)):
        make = backend.pipeline_maker(LoaderSpec(split, 4, device=device), (0, 1))
        pipe = make(source=source, seed=0, checkpoint=None)
        images, *rest = pipe._graph_out  # the outputs as defined; the DALI API exposes them only after build()
        assert images.device == ("gpu" if expect_gpu else "cpu"), (device, images)
        assert all(node.device == "cpu" for node in rest)
        if expect_gpu:
            assert "CropMirrorNormalize" in images.name and pipe.device_id == 0
        elif device.type == "cpu":
            assert pipe.device_id is None  # dali_cpu on a CPU run never touches CUDA


# --- the staging, with a CPU stand-in for the copier -------------------------------------------------------------

PATHS = [
    # (split, overrides, the thread that makes and stages the batches)
    ("train", ("data.dali_train_resize=torch",), "imgcls-dali-host"),
    ("train", ("data.dali_train_resize=dali",), "MainThread"),
    ("val", (), "MainThread"),
]


@pytest.mark.parametrize(("split", "extra", "stager"), PATHS)
def test_each_batch_is_staged_where_it_is_made_and_handed_over_in_order(
    folder: Path, split: str, extra: tuple[str, ...], stager: str
) -> None:
    """Every batch staged once, in the thread that made it (the producer's with the torch resize, so its copy runs
    while the step before does), then handed over in the consumer's thread, in order; the batches and the positions
    a checkpoint would record are those of the loader without a copier."""
    cfg = data_cfg(folder, *extra)
    plain = make_backend(cfg).loader(LoaderSpec(split, 4, seed=3))
    staged = make_backend(cfg).loader(LoaderSpec(split, 4, seed=3))
    staged.copier = copier = RecordingCopier()
    expected, positions = [], []
    for batch in plain:
        expected.append(tuple(t.clone() for t in batch))
        positions.append(plain.position())
    got = []
    for batch in staged:
        got.append(tuple(t.clone() for t in batch))
        assert staged.position() == positions[len(got) - 1]
    assert same(got, expected) and len(got) == len(staged)
    stages = [(n, thread) for kind, n, thread in copier.events if kind == "stage"]
    handed = [(n, thread) for kind, n, thread in copier.events if kind == "hand over"]
    assert [n for n, _ in handed] == list(range(1, len(got) + 1))
    assert {thread for _, thread in stages} == {stager} and {thread for _, thread in handed} == {"MainThread"}
    for number in range(1, len(got) + 1):
        assert copier.events.index(("stage", number, stager)) < copier.events.index(("hand over", number, "MainThread"))


def test_the_torch_resize_stages_the_next_batch_while_the_consumer_holds_one(folder: Path) -> None:
    """Structural, not timed: while the consumer holds batch 1 without asking for more, batch 2's copy is staged
    by the producer thread: it is ahead of its step, not queued when the step starts."""
    loader = make_backend(data_cfg(folder, "data.dali_train_resize=torch")).loader(LoaderSpec("train", 4))
    loader.copier = copier = RecordingCopier()
    iterator = iter(loader)
    next(iterator)
    deadline = time.monotonic() + 30  # bounds a hang only
    while copier.staged < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert copier.staged >= 2 and [e[:2] for e in copier.events if e[0] == "hand over"] == [("hand over", 1)]
    assert len(list(iterator)) == len(loader) - 1


@pytest.mark.parametrize(("split", "extra", "stager"), [p for p in PATHS if p[0] == "train"])
def test_a_checkpoint_with_a_batch_staged_ahead_resumes_at_the_batch_the_trainer_has(
    folder: Path, split: str, extra: tuple[str, ...], stager: str
) -> None:
    """A checkpoint after step 3, taken while batch 4 (and with the torch resize, the ones after it) was already
    made and staged: the resumed loader gives batches 4.. of the uninterrupted epoch, bitwise, and the epoch
    after it too."""
    cfg = data_cfg(folder, *extra)
    whole = make_backend(cfg).loader(LoaderSpec(split, 4, seed=5))
    reference = kept(whole) + kept(whole)  # two epochs
    loader = make_backend(cfg).loader(LoaderSpec(split, 4, seed=5))
    loader.copier = copier = RecordingCopier()
    iterator = iter(loader)
    first = kept(next(iterator) for _ in range(3))
    if stager != "MainThread":  # the producer has taken batch 4 from DALI and staged it
        deadline = time.monotonic() + 30
        while copier.staged < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert copier.staged >= 4
    state = loader.state_dict()
    assert state["positions"][0]["steps"] == 3
    resumed = make_backend(cfg).loader(LoaderSpec(split, 4, seed=5, resume=state))
    resumed.copier = RecordingCopier()
    rest = kept(resumed) + kept(resumed)
    assert same(first + rest, reference)


# --- on a GPU -----------------------------------------------------------------------------------------------------


GPU_PATHS = [
    ("train", ("data.dali_train_resize=torch", "data.pin_memory=true")),
    ("train", ("data.dali_train_resize=dali",)),
    ("train", ("data.augment=randaugment", "data.interpolation=bicubic")),
    ("train", ("model.channels_last=true",)),
    ("val", ()),
]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("split", "extra"), GPU_PATHS)
def test_dali_cpu_batches_arrive_on_the_gpu_equal_to_the_cpu_ones(folder: Path, split: str, extra: tuple) -> None:
    """Every path on a CUDA device: images and labels are on the device when the loader hands them over (nothing
    left for Lightning's copy on the compute stream), bitwise the CPU run's pixels and labels; the torch resize
    writes pinned batches, DALI's paths copy with the pipeline's .gpu()."""
    from imgcls.data.device_prefetch import CudaCopies

    cfg = data_cfg(folder, *extra)
    device = torch.device("cuda", torch.cuda.current_device())
    cpu = kept(make_backend(cfg).loader(LoaderSpec(split, 4, seed=7)))
    loader = make_backend(cfg).loader(LoaderSpec(split, 4, seed=7, device=device))
    assert isinstance(loader.copier, CudaCopies)
    if loader.host_resize is not None:
        assert loader.host_resize.pin_memory and loader._pipes[0].device_id is None
    else:
        assert loader._pipes[0].device_id == device.index
    gpu = []
    for batch in loader:
        assert all(t.device == device for t in batch)
        gpu.append(tuple(t.cpu() for t in batch))
    assert same(gpu, cpu)
    torch.cuda.synchronize()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    "extra", [("data.dali_train_resize=torch", "data.pin_memory=true"), ("data.dali_train_resize=dali",)]
)
def test_a_gpu_loader_resumes_at_the_batch_the_trainer_has(folder: Path, extra: tuple) -> None:
    cfg = data_cfg(folder, *extra)
    device = torch.device("cuda", torch.cuda.current_device())
    reference = kept(make_backend(cfg).loader(LoaderSpec("train", 4, seed=5, device=device)))
    loader = make_backend(cfg).loader(LoaderSpec("train", 4, seed=5, device=device))
    iterator = iter(loader)
    first = kept(next(iterator) for _ in range(3))
    resumed = make_backend(cfg).loader(LoaderSpec("train", 4, seed=5, device=device, resume=loader.state_dict()))
    assert same(first + kept(resumed), reference)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("split", ["train", "val"])
def test_dali_gpu_labels_arrive_on_the_device_too(folder: Path, split: str) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    loader = make_backend(data_cfg(folder, "data.backend=dali_gpu")).loader(LoaderSpec(split, 4, device=device))
    for images, labels in loader:
        assert images.device == labels.device == device
