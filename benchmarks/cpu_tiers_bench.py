"""Seconds per step of the CPU tiers' tiny pairs: build (cold, warm), load, reference generate with/without MTP.

    python benchmarks/cpu_tiers_bench.py [--root DIR] [--pairs e-series,dense-31b] [--new-tokens 24] [--keep]

Cold builds go to a fresh temp dir (or --root, emptied first unless --keep); the warm build is the same call again
(it must reuse the folder). Needs transformers (+ torch, tokenizers, safetensors); never imports sglang.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mtpmatrix.pairs.tiny.build import PAIR_NAMES, build_pair  # noqa: E402

PROMPTS = ("Hello world, count: 1 2 3", "def f(x):\n    return x", "The quick brown fox", "Q: 7*6=? A:")


def _t(label: str, fn, rows: list):
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    rows.append((label, dt))
    print(f"{label:<48} {dt:8.3f} s", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path)
    ap.add_argument("--pairs", default=",".join(PAIR_NAMES))
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--draft-tokens", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the tier uses 1)")
    ap.add_argument("--keep", action="store_true", help="do not empty --root first (cold numbers become warm)")
    args = ap.parse_args(argv)
    root = args.root or Path(tempfile.mkdtemp(prefix="tiny-bench-"))
    if args.root and not args.keep and root.exists():
        shutil.rmtree(root)
    rows: list = []

    _t("import torch + transformers", lambda: __import__("transformers.models.gemma4_assistant"), rows)
    import torch
    from transformers import AutoTokenizer, Gemma4AssistantForCausalLM, Gemma4ForConditionalGeneration

    torch.set_num_threads(args.threads)
    import transformers

    print(f"transformers {transformers.__version__}, torch {torch.__version__}, root {root}", flush=True)
    for name in args.pairs.split(","):
        for constructed in (False, True):
            tag = name + ("-constructed" if constructed else "")
            _t(f"{tag}: build (cold)", lambda: build_pair(name, root, constructed=constructed), rows)
            paths = _t(f"{tag}: build (warm)", lambda: build_pair(name, root, constructed=constructed), rows)

            def load():
                t = Gemma4ForConditionalGeneration.from_pretrained(paths.target, dtype=torch.float32).eval()
                a = Gemma4AssistantForCausalLM.from_pretrained(paths.assistant, dtype=torch.float32).eval()
                return t, a, AutoTokenizer.from_pretrained(paths.target)

            target, assistant, tok = _t(f"{tag}: load target + assistant + tokenizer", load, rows)
            assistant.generation_config.num_assistant_tokens = args.draft_tokens
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            ids = [tok(p, return_tensors="pt").input_ids for p in PROMPTS]
            kw = dict(max_new_tokens=args.new_tokens, do_sample=False)

            def gen(assist):
                with torch.no_grad():
                    return [
                        target.generate(
                            i, attention_mask=torch.ones_like(i), assistant_model=assistant if assist else None, **kw
                        )
                        for i in ids
                    ]

            plain = _t(f"{tag}: generate x{len(PROMPTS)} without assistant", lambda: gen(False), rows)
            try:
                assisted = _t(f"{tag}: generate x{len(PROMPTS)} with assistant", lambda: gen(True), rows)
                same = all(torch.equal(a, b) for a, b in zip(plain, assisted))
                print(f"{'':<48} outputs equal: {same}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not judge
                print(f"{tag}: generate with assistant failed: {type(exc).__name__}: {exc}"[:300], flush=True)
    print(f"{'total':<48} {sum(dt for _, dt in rows):8.3f} s")
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
