"""A fake world for canary and culprit tests: release lists, a row, a canary's resolution, and probes whose
answers follow a first bad release per package (nothing installed)."""

from __future__ import annotations

from mtpmatrix.core.rows import parse_row
from mtpmatrix.runner import bisect as bs
from mtpmatrix.runner.canary import Canary, Resolution

TRANSFORMERS = ["5.12.1", "5.13.0", "5.14.0", "5.15.0", "5.16.0", "5.17.0", "5.18.0", "5.19.0", "5.20.0", "5.24.0"]
TORCH = ["2.11.0", "2.12.0", "2.13.0", "2.14.1", "2.15.0"]


def canary_row(tmp_path):
    """The 0.5.17 row as a canary floats from it (a file of its own under tmp_path)."""
    f = tmp_path / "sglang-0.5.17.txt"
    f.write_text("# python: 3.11\n# torch-backend: pypi\nsglang==0.5.17\ntransformers==5.12.1\ntorch==2.11.0\n")
    return parse_row(f)


def resolution(row, moved: dict[str, str]) -> Resolution:
    c = Canary("c", row.path, row, "canary-override", {p: "" for p in moved})
    return Resolution(c, dict(moved), {p: (row.pins.get(p), v) for p, v in moved.items()})


def world(first_bad: dict[str, str], together: tuple[str, ...] = ()):
    """Probes over a fake world: ``package`` is bad from ``first_bad[package]`` on; ``together`` break only when all
    of them are at their newest release. Records every probe made as (package, version, also)."""
    order = {"transformers": TRANSFORMERS, "torch": TORCH}
    calls = []

    def probe_for(package, also):
        def probe(version):
            calls.append((package, version, tuple(also)))
            bad = package in first_bad and order[package].index(version) >= order[package].index(first_bad[package])
            moved_now = {package} | {a.split("==")[0] for a in also}
            if together and set(together) <= moved_now:
                bad = True
            if bad:
                return bs.Probe(
                    version,
                    bs.BAD,
                    "1 check(s) failed [import]",
                    {"kind": "import", "message": f"{package} {version} breaks the import"},
                )
            return bs.Probe(version, bs.GOOD)

        return probe

    def candidates(package, good, bad):
        vs = order[package]
        return vs[vs.index(good) : vs.index(bad) + 1]

    return probe_for, candidates, calls
