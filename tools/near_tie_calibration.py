"""Print how far apart greedy candidates sit in the tiny random pairs' logits, to calibrate smoke.NEAR_TIE_NATS.

The smoke tier forgives a divergence between MTP and no-MTP greedy output only when the no-MTP server's own
logprobs show the two tokens within a bar of each other. This script shows what the bar must separate, on the
same tiny pairs and prompts the tier serves (CPU, float32, transformers only):

- top-1 minus top-2 along the greedy path: how often a genuine near-tie occurs;
- top-1 minus a uniformly drawn token: where a wrongly accepted draft token would land.

    python tools/near_tie_calibration.py [--root DIR] [--pairs e-series,moe-26b-a4b,dense-31b]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mtpmatrix.pairs.tiny.build import PAIR_NAMES, build_pair  # noqa: E402
from mtpmatrix.tiers import smoke


def quantiles(xs: list[float]) -> str:
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return f"p1 {pick(0.01):.4f}  p5 {pick(0.05):.4f}  p50 {pick(0.5):.4f}  (n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".cache/tiny/calibration")
    ap.add_argument("--pairs", default=",".join(PAIR_NAMES))
    ap.add_argument("--bars", default="0.05,0.25")
    args = ap.parse_args()

    import torch
    from transformers import Gemma4ForConditionalGeneration

    bars = [float(b) for b in args.bars.split(",")]
    gen = torch.Generator().manual_seed(0)
    for name in args.pairs.split(","):
        paths = build_pair(name, Path(args.root))
        model = Gemma4ForConditionalGeneration.from_pretrained(paths.target, dtype=torch.float32).eval()
        vocab = model.config.get_text_config().vocab_size
        top2, rand = [], []
        with torch.no_grad():
            for prompt in smoke.id_prompts(vocab):
                ids = torch.tensor([prompt])
                out = model.generate(
                    ids,
                    max_new_tokens=smoke.MAX_NEW_TOKENS,
                    do_sample=False,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
                for logits in out.logits:
                    lp = torch.log_softmax(logits[0].float(), -1)
                    best = lp.max()
                    top2.append(float(best - lp.topk(2).values[1]))
                    rand.append(float(best - lp[torch.randint(vocab, (1,), generator=gen)]))
        print(f"{name}: vocab {vocab}, {len(top2)} greedy positions")
        print(f"  top1 - top2      {quantiles(top2)}  mean {statistics.mean(top2):.4f}")
        print(f"  top1 - random    {quantiles(rand)}  mean {statistics.mean(rand):.4f}")
        for bar in bars:
            p_tie = sum(g <= bar for g in top2) / len(top2)
            p_rand = sum(g <= bar for g in rand) / len(rand)
            print(
                f"  bar {bar:.2f} nats: a genuine top-2 tie within it {p_tie:.1%} of positions; "
                f"a random token within it {p_rand:.1%}"
            )


if __name__ == "__main__":
    main()
