"""`python tests/count_host_syncs.py OUT OVERRIDE...`: one training run (imgcls.run.train.run) with every blocking
call counted per micro-batch (training and validation) as tests/test_host_sync.py counts them; each rank writes
OUT/syncs-rank{R}.json.

A script, not a test: under DDP the count must be made inside every rank, and Lightning's launcher starts
ranks >= 1 by running this same script again."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402

import imgcls.run.train  # noqa: E402
from tests.conftest import compose_config  # noqa: E402
from tests.test_host_sync import SyncCounter, count_syncs  # noqa: E402

out, overrides = Path(sys.argv[1]), sys.argv[2:]
counter = SyncCounter()
with pytest.MonkeyPatch.context() as patch:
    count_syncs(patch, counter)
    imgcls.run.train.run(compose_config(overrides, run_dir=out / "run"))
rank = int(os.environ.get("LOCAL_RANK", 0))
counts = {"started": counter.started, "calls": counter.calls, "val_started": counter.val_started}
counts |= {"val_calls": counter.val_calls, "deferred": counter.deferred}
(out / f"syncs-rank{rank}.json").write_text(json.dumps(counts))
