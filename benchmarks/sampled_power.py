"""Detection rates of the smoke tier's sampled check (mtpmatrix.pairs.sampled) against the CPU model of
sglang's verify (mtpmatrix.pairs.sampled.verify_model), correct and broken, at the smoke tier's sample size.

    PYTHONPATH=src python3 benchmarks/sampled_power.py [replicates]   (default 200; ~0.1 s per simulated run)
"""

from __future__ import annotations

import sys

from mtpmatrix.pairs.sampled import ring
from mtpmatrix.pairs.sampled import verify_model as model


def main(replicates: int = 200) -> None:
    n = ring.N_REQUESTS * ring.NEW_TOKENS
    print(
        f"closed form {ring.closed_form(model.VOCAB)}; n = {n} offsets per server; alpha {ring.ALPHA:g}; "
        f"detectable TV {ring.detectable_tv(n, model.VOCAB):.4f} at power {ring.POWER}"
    )
    print(f"{'server':10} {'verify':28} detected (of {replicates} simulated runs)")
    for topk in (None, 1, 3):
        for bug in model.BUGS if topk else ("none",):
            rate, _ = model.detection_rate(model.ServerModel(topk, bug), replicates, seed=2026)
            server = "no-MTP" if topk is None else f"topk {topk}"
            print(f"{server:10} {bug:28} {rate:6.1%}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
