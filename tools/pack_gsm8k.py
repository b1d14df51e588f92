"""Rebuild the GSM8K test split shipped in the package (src/mtpmatrix/tiers/gsm8k_data/test.jsonl.gz) from a plain
test.jsonl, and print the SHA-256 of its decompressed bytes:

    PYTHONPATH=src python3 tools/pack_gsm8k.py path/to/test.jsonl [--out FILE]

gsm8k_eval.pack writes no time stamp or file name, so running this again on the same file leaves the shipped copy
byte-identical. A source whose checksum is not settings.GSM8K_SHA256["test"] is still written, and the exit status is 1: the
loader refuses it until that constant is changed on purpose (and with it every record's data checksum).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from mtpmatrix.core.atomic import atomic_write_bytes
from mtpmatrix.tiers import gsm8k_eval


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="a plain test.jsonl")
    p.add_argument("--out", type=Path, default=gsm8k_eval.shipped_file("test"), help="default: the shipped copy")
    a = p.parse_args(argv)
    data = a.source.read_bytes()
    packed = gsm8k_eval.pack(data)
    atomic_write_bytes(a.out, packed)
    got, lines = hashlib.sha256(data).hexdigest(), data.count(b"\n")
    print(f"{got}  {a.out} ({len(packed)} bytes, {lines} lines)")
    if got != gsm8k_eval.data_sha256():
        print(
            f"not the checksum the loader expects ({gsm8k_eval.data_sha256()}): update settings.GSM8K_SHA256['test'] if this "
            f"data set is meant",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
