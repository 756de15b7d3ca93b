"""`python tests/published_combinations.py CASES.json OUT`: each case (a list of train.py overrides) trained on
this DDP rank for 2 optimizer steps (one epoch, validated, last.ckpt), then resumed with ckpt_path=last for 2
more; rank 0 writes OUT/results.json. One process pair runs every case: Lightning's launcher starts rank 1 by
running this script again, and the later fits reuse the ranks and their process group (a launch per case
would cost ~10 s each). tests/test_published_combinations.py makes the cases from conf/experiment/."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import imgcls.train  # noqa: E402
from tests.conftest import compose_config  # noqa: E402

cases, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
rank = int(os.environ.get("LOCAL_RANK", 0))
results = {}
for name, overrides in cases.items():
    run_dir = out / name
    print(f"rank {rank}: case {name}", flush=True)
    first = imgcls.train.run(compose_config([*overrides, "trainer.max_epochs=1"], run_dir=run_dir))
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    resumed = imgcls.train.run(compose_config([*overrides, "trainer.max_epochs=2", "ckpt_path=last"], run_dir=run_dir))
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
if rank == 0:
    (out / "results.json").write_text(json.dumps(results, indent=1))
