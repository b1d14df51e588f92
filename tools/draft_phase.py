"""Read draft-probe dumps of a witness pair back: where sglang puts the draft query and the frozen keys in RoPE
positions, and so the draft phase it drafts at (mtpmatrix.tiers.witness, "Draft phase").

A witness pair's keys and queries are position-only in their rotating dims (every pair (i, i + head_dim/2) holds its
amplitude on the first component before RoPE), so the RoPE position a vector was rotated by is the angle that
rotates it back to an empty second component. Per dumped draft call and assistant layer this prints the query's
position, the positions of the first and last frozen keys of request 0, the slot the query scores highest and the
draft phase (query position minus the last accepted key's position; transformers: +1).

    MTPMATRIX_PROBE_DIR=/tmp/probe PYTHONPATH=tools/draft_probe:$PYTHONPATH python -m sglang.launch_server ...
    python tools/draft_phase.py /tmp/probe --pair TINY_DIR/dense-31b-witness [--calls 3]

Needs torch (an sglang or transformers environment).
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def rope_position(vec, inv_freq, max_pos: int) -> int:
    """The RoPE position ``vec`` (one head, neox pairs (i, i + head_dim/2)) was rotated by, for a vector whose
    rotating pairs start on their first component; -1 when none fits."""
    import torch

    half, n = vec.shape[-1] // 2, len(inv_freq)
    x1, x2 = vec[:n].double(), vec[half:half + n].double()
    pos = torch.arange(max_pos + 1, dtype=torch.float64)[:, None]
    ang = pos * inv_freq.double()[None, :]
    # rotating back by p: second component = x2 cos(p w) - x1 sin(p w); it vanishes at the true position
    resid = (x2[None, :] * torch.cos(ang) - x1[None, :] * torch.sin(ang)).norm(dim=-1)
    best = int(resid.argmin())
    return best if resid[best] < 0.05 * max(float(vec.double().norm()), 1e-9) else -1


def main(argv=None) -> int:
    import torch

    from mtpmatrix.tiers.witness import rope_inv_freq

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dumps", type=Path)
    p.add_argument("--pair", type=Path, required=True, help="the witness pair folder (holds target/config.json)")
    p.add_argument("--calls", type=int, default=3, help="dumped draft calls to read (default 3)")
    a = p.parse_args(argv)
    cfg = json.loads((a.pair / "target" / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    files = sorted(glob.glob(str(a.dumps / "draft-*.pt")))
    if not files:
        raise SystemExit(f"no draft-*.pt in {a.dumps}")
    for f in files[:a.calls]:
        rec = torch.load(f, weights_only=False)
        seq = int(rec["seq_lens"][0])
        print(f"{Path(f).name}: seq_lens {rec['seq_lens'].tolist()} positions {rec['positions'].tolist()}")
        seen = set()
        for call in (c for c in rec["calls"] if c[0] == "radix"):
            _, logical, phys, q, _out = call
            if logical in seen:  # later draft steps sit at the same position (Frozen-KV MTP): the seed step says it
                continue
            seen.add(logical)
            ltype = text["layer_types"][phys]
            head_dim, inv = rope_inv_freq(text, ltype)
            keys = rec["kv"][phys][0][0].reshape(seq, -1, head_dim)[:, 0]  # request 0, first KV head
            q0 = q[0].reshape(-1, head_dim)[0]
            q_pos = rope_position(q0, inv, seq + 8)
            first, last = rope_position(keys[0], inv, seq + 8), rope_position(keys[-1], inv, seq + 8)
            top = int((keys.double() @ q0.double()).argmax())
            phase = q_pos - last if q_pos >= 0 and last >= 0 else None
            print(f"  assistant layer {logical} ({ltype}, target layer {phys}): query at {q_pos}, keys of slots 0 / "
                  f"{seq - 1} at {first} / {last}, query scores slot {top} highest, draft phase "
                  f"{phase if phase is None else f'{phase:+d}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
