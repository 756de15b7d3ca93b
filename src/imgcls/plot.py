"""PNG charts of one or more runs from their report.json, without W&B.

    python -m imgcls.plot RUN_DIR [RUN_DIR ...] [--out DIR]

Writes loss.png (train and val, on a log scale), accuracy.png (val top-1 and top-5) and throughput.png (train and
val img/s) per epoch, and lr.png at every step the run logged its LR (RUN_DIR/csv/metrics.csv), so that a warm-up
shows; every run overlaid in its own colour. Default output: RUN_DIR/plots for one run, ./plots for several.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from imgcls.callbacks.charts import plot_runs
from imgcls.errors import DataError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m imgcls.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--out", type=Path, default=None, help="output dir (default: RUN_DIR/plots or ./plots)")
    args = parser.parse_args(argv)
    out = args.out or (args.run_dirs[0] / "plots" if len(args.run_dirs) == 1 else Path("plots"))
    try:
        written = plot_runs(args.run_dirs, out)
    except (FileNotFoundError, json.JSONDecodeError, DataError) as exc:
        print(f"imgcls: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
