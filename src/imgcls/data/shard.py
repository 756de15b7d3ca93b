"""`python -m imgcls.data.shard SRC DST format=webdataset|tfrecord shard_size=N [seed=0]`: an ImageFolder into
shards (the work is in imgcls.data.shards.convert; docs/shards.md)."""

from __future__ import annotations

import sys

from imgcls.errors import ConfigError, UserError

USAGE = "python -m imgcls.data.shard SRC DST format=webdataset|tfrecord shard_size=N [seed=0]"
KEYS = ("format", "shard_size", "seed")


def _integer(key: str, value: str, low: int, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if number < low:
        raise ConfigError(f"{key}={value} is not allowed; {what} (usage: {USAGE})")
    return number


def parse(argv: list[str]) -> dict:
    """SRC, DST and the key=value arguments, each mistake one ConfigError line."""
    positional = [a for a in argv if "=" not in a]
    pairs = [a.partition("=") for a in argv if "=" in a]
    if len(positional) != 2:
        raise ConfigError(f"expected SRC and DST, got {len(positional)} path(s) {positional}; usage: {USAGE}")
    args: dict = {"src": positional[0], "dst": positional[1], "seed": 0}
    for key, _, value in pairs:
        if key not in KEYS:
            raise ConfigError(f"unknown argument {key}={value}; allowed: {', '.join(KEYS)} (usage: {USAGE})")
        if key == "format":
            if value not in ("webdataset", "tfrecord"):
                raise ConfigError(f"format={value} is not allowed; allowed: webdataset, tfrecord")
            args["format"] = value
        elif key == "shard_size":
            args["shard_size"] = _integer(key, value, 1, "a positive integer (images per shard, e.g. 1250)")
        else:
            args["seed"] = _integer(key, value, 0, "an integer >= 0")
    for key in ("format", "shard_size"):
        if key not in args:
            raise ConfigError(f"{key} is not set; usage: {USAGE}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        from imgcls.data.shards.convert import convert  # after the arguments: torchvision takes seconds to import

        path = convert(args["src"], args["dst"], args["format"], args["shard_size"], args["seed"])
    except UserError as exc:
        # The line imgcls.cli.fail prints; importing imgcls.cli (Hydra, Lightning: seconds) to print it would
        # make every mistake slow.
        print(f"imgcls: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
