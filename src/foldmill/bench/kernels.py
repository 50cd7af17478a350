"""`foldmill bench kernels`: re-measure the kernel crossover table on this GPU (foldmill.bench._kernel_table).

Writes crossover_<arch>.json to --out; `FOLDMILL_CROSSOVER_DIR=<out>` makes foldmill use it,
copying it into src/foldmill/kernels/ makes it the shipped table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from foldmill.bench._out_dir import writes_only_its_own
from foldmill.errors import FoldmillError
from foldmill.io.atomic import write_text_atomic


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "kernels", help="time each kernel backend per op and size; write the crossover table (GPU)"
    )
    parser.add_argument("--sizes", default="128,256,384,512,768,1024", help="token counts")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="results/bench/kernels", help="output directory")
    parser.set_defaults(handler=writes_only_its_own(run))


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise FoldmillError("foldmill bench kernels needs a CUDA GPU")
    from foldmill.bench._kernel_table import measure

    sizes = tuple(int(size) for size in args.sizes.split(",") if size)
    table = measure(sizes, args.repeats)
    path = Path(args.out) / f"crossover_{table['arch'].replace('_', '')}.json"
    write_text_atomic(path, json.dumps(table, indent=1) + "\n")
    print(json.dumps(table["ops"], indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    from foldmill.bench._standalone import main

    raise SystemExit(main(register))
