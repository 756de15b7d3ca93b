"""WebDataset tar shards: samples KEY.jpg (encoded image) + KEY.cls (label, an ASCII integer), via stdlib tarfile.

A sample's members are consecutive in the tar and share KEY; the extension starts at the first dot after the
last '/' (webdataset's and DALI's fn.readers.webdataset's split), so keys may hold folders (class/name) but no
dot in the file name: `key_of` replaces those.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from imgcls.errors import DataError

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp")  # webdataset's image keys, in order of preference
LABEL_EXTENSION = "cls"


def split_name(member: str) -> tuple[str, str]:
    """(key, extension) of a member name, split as DALI's wds2idx.split_name does."""
    dot = member.find(".", member.rfind("/") + 1)
    return (member, "") if dot < 0 else (member[:dot], member[dot + 1 :])


def key_of(relative_path: str) -> str:
    """The sample key of an image's path relative to its split: the path without its extension, with the
    stem's other dots replaced (n01440764/a.b.JPEG -> n01440764/a_b) so KEY.ext splits one way only."""
    path = PurePosixPath(relative_path)
    return str(path.with_name(path.stem.replace(".", "_")))


def _member(name: str, data: bytes) -> tarfile.TarInfo:
    # Fixed metadata: the same images give byte-identical shards (no mtime, owner or host in the tar).
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class ShardWriter:
    """Writes samples to one open tar file object."""

    def __init__(self, out: BinaryIO) -> None:
        self._tar = tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT)

    def write(self, key: str, image: bytes, label: int, image_ext: str = "jpg") -> None:
        for ext, data in ((image_ext, image), (LABEL_EXTENSION, str(int(label)).encode())):
            info = _member(f"{key}.{ext}", data)
            # ustar headers (tarfile's PAX_FORMAT gives the same bytes with a per-member pax check that took
            # half of the conversion time), and GNU's long-name header for a name ustar cannot hold: DALI's
            # webdataset reader (2.4) takes a pax header for a member and fails on the sample ("Underful
            # sample"), and reads GNU long names.
            self._tar.format = tarfile.USTAR_FORMAT
            try:
                self._tar.addfile(info, io.BytesIO(data))
            except ValueError:  # raised by the header encoding, before anything is written
                self._tar.format = tarfile.GNU_FORMAT
                self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        self._tar.close()


def iter_samples(data: bytes, where: str = "") -> Iterator[tuple[bytes, int, str]]:
    """(image bytes, stored label, key) of each sample of a whole tar shard in memory, in file order."""
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    except tarfile.TarError as exc:
        raise DataError(f"{where}: not a tar file ({exc})") from None
    key: str | None = None
    members: dict[str, bytes] = {}
    try:
        for info in tar:
            if not info.isfile():
                continue
            member_key, ext = split_name(info.name)
            if member_key != key:
                if key is not None:
                    yield _sample(key, members, where)
                key, members = member_key, {}
            # A slice of the shard's bytes at the member's data offset: extractfile() builds a file object per
            # member, which made reading 3x slower.
            members[ext.lower()] = data[info.offset_data : info.offset_data + info.size]
    except tarfile.TarError as exc:
        raise DataError(f"{where}: truncated or corrupt tar ({exc})") from None
    if key is not None:
        yield _sample(key, members, where)


def _sample(key: str, members: dict[str, bytes], where: str) -> tuple[bytes, int, str]:
    image = next((members[ext] for ext in IMAGE_EXTENSIONS if ext in members), None)
    if image is None:
        raise DataError(f"{where}: sample '{key}' has no image member ({', '.join('.' + e for e in IMAGE_EXTENSIONS)})")
    if LABEL_EXTENSION not in members:
        raise DataError(f"{where}: sample '{key}' has no .{LABEL_EXTENSION} member (its label)")
    try:
        label = int(members[LABEL_EXTENSION].decode().strip())
    except ValueError:
        raise DataError(
            f"{where}: sample '{key}': .{LABEL_EXTENSION} is not an integer ({members[LABEL_EXTENSION][:20]!r})"
        ) from None
    return image, label, key


def count_samples(path: str | Path) -> int:
    """The number of samples (distinct consecutive keys) of a tar file, reading only its headers
    (tarfile seeks past member data)."""
    keys, last = 0, None
    try:
        with tarfile.open(path, mode="r:") as tar:
            for info in tar:
                if info.isfile():
                    key = split_name(info.name)[0]
                    keys += key != last
                    last = key
    except tarfile.TarError as exc:
        raise DataError(f"{path}: not a tar file or truncated ({exc})") from None
    return keys
