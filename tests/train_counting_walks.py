"""`IMGCLS_TEST_WALKS=OUT python tests/train_counting_walks.py OVERRIDE...`: train.py that records, per rank, every walk
of a split (data/file_list.FileList) into OUT/walks-rank{R}.txt. A script, not a fixture: Lightning's launcher starts
ranks >= 1 by running this same command again (sys.argv as it is; hence OUT in the environment), so each rank counts
its own walks, as tests/count_host_syncs.py counts syncs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import imgcls.data.file_list  # noqa: E402
from imgcls.cli import train_main  # noqa: E402

out = Path(os.environ["IMGCLS_TEST_WALKS"])
real_init = imgcls.data.file_list.FileList.__init__


def counted_init(self: Any, root: Any, *args: Any, **kwargs: Any) -> None:
    with (out / f"walks-rank{os.environ.get('LOCAL_RANK', '0')}.txt").open("a") as log:
        log.write(f"{root}\n")
    real_init(self, root, *args, **kwargs)


imgcls.data.file_list.FileList.__init__ = counted_init
train_main()
