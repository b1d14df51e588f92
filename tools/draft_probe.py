"""Draft probe: dump what sglang's Frozen-KV MTP draft forward is handed and computes, and read a witness pair's
dumps back as the draft phase sglang drafts at (mtpmatrix.pairs.witness.phase). A diagnostic, not a check.

The probe is served the way fault injection serves a mutant (mtpmatrix.faults): ``payload`` writes a hook payload
whose patched ``frozen_kv_mtp_worker_v2`` is the installed one plus a wrapper of
``FrozenKVMTPDraftWorker.draft_forward`` (it changes nothing else), and ``faults/mutant_hook`` serves it to every
sglang process; the installed files are never edited, and an sglang that changed since the payload was made is
left alone with a ``NOT applied`` line. For its first MTPMATRIX_PROBE_LIMIT (40) calls each process writes one
``draft-<pid>-<n>.pt``: seq_lens, positions, req_pool_indices, the seed (bonus tokens, target hidden states), the
physical layer map, each request's KV slots and every target layer's K/V at those slots, each assistant layer's
attention input/output and its query after RoPE (RadixAttention's q), the draft tokens and the draft attention
metadata. sglang >= 0.5.17 (the spec-v2 worker; 0.5.13 drafts on the non-overlap worker). The draft forward runs
eagerly only: serve with ``--disable-cuda-graph`` (and ``--disable-hybrid-swa-memory`` so the K/V buffers need no
index translation; on 0.5.17 that flag crashes the e-series pair, whose sliding and full head dims differ).

    python tools/draft_probe.py payload /tmp/probe.json           # with the python that runs the server
    MTPMATRIX_MUTANT=/tmp/probe.json MTPMATRIX_PROBE_DIR=/tmp/probe \
        PYTHONPATH=src/mtpmatrix/faults/mutant_hook:$PYTHONPATH python -m sglang.launch_server ...
    python tools/draft_probe.py read /tmp/probe --pair TINY_DIR/dense-31b-witness [--calls 3]

``read``: a witness pair's keys and queries are position-only in their rotating dims (every pair
(i, i + head_dim/2) holds its amplitude on the first component before RoPE), so the RoPE position a vector was
rotated by is the angle that rotates it back to an empty second component. Per dumped draft call and assistant
layer it prints the query's position, the positions of the first and last frozen keys of request 0, the slot the
query scores highest and the draft phase (query position minus the last accepted key's position; transformers: +1).
Found with it (H200, sglang 0.5.17): the target writes keys at position + 1, the draft query sits at seq_lens - 1.
Needs torch (an sglang or transformers environment).
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

WORKER = "sglang.srt.speculative.frozen_kv_mtp_worker_v2"
# The probe goes in after FrozenKVMTPDraftWorker's definition, before the next class.
ANCHOR = "class FrozenKVMTPWorkerV2(EAGLEWorkerV2):"
# Runs in the worker module's namespace: one function, all its names local, called once at import.
PROBE_SOURCE = 'def _mtpmatrix_draft_probe(W):\n    import os\n    import sys\n\n    import torch\n\n    DIR = os.environ.get("MTPMATRIX_PROBE_DIR")\n    LIMIT = int(os.environ.get("MTPMATRIX_PROBE_LIMIT", "40"))\n    if not DIR:\n        return\n\n    def cpu(x):\n        if isinstance(x, torch.Tensor):\n            return x.detach().clone().cpu()\n        if isinstance(x, (list, tuple)):\n            return [cpu(y) for y in x]\n        return x\n\n    orig = W.draft_forward\n    count = [0]\n\n    def draft_forward(self, forward_batch):\n        n = count[0]\n        count[0] += 1\n        if n >= LIMIT:\n            return orig(self, forward_batch)\n        rec = {"n": n, "topk": self.topk}\n        si = forward_batch.spec_info\n        for k in ("seq_lens", "positions", "req_pool_indices", "input_ids"):\n            rec[k] = cpu(getattr(forward_batch, k, None))\n        rec["bonus"] = cpu(si.bonus_tokens)\n        rec["hidden"] = cpu(si.hidden_states).float()\n        ctx = self.kv_context\n        rec["physical_layer_ids"] = dict(ctx.physical_layer_ids)\n        pool = ctx.target_token_to_kv_pool\n        rec["pool_type"] = type(pool).__name__\n        r2t = self.req_to_token_pool.req_to_token\n        idx = []\n        for i in range(len(forward_batch.seq_lens)):\n            L = int(forward_batch.seq_lens[i])\n            idx.append(r2t[int(forward_batch.req_pool_indices[i]), :L].clone())\n        rec["kv_idx"] = cpu(idx)\n        kv = {}\n        for layer in range(64):\n            try:\n                kb, vb = pool.get_key_buffer(layer), pool.get_value_buffer(layer)\n            except Exception as exc:\n                kv[layer] = repr(exc)[:200]\n                if layer > 12:\n                    break\n                continue\n            kv[layer] = ([kb[j.long()].float().cpu() for j in idx], [vb[j.long()].float().cpu() for j in idx])\n        rec["kv"] = kv\n        calls = []\n        hooks = []\n        model = self.draft_model_runner.model\n        for li, layer in enumerate(model.model.layers):\n            def h_attn(m, args, kwargs, out, li=li):\n                calls.append(("self_attn", li, cpu(kwargs.get("positions")), cpu(kwargs.get("hidden_states")), cpu(out)))\n            def h_radix(m, args, kwargs, out, li=li):\n                q = args[0] if args else kwargs.get("q")\n                calls.append(("radix", li, int(m.layer_id), cpu(q).float(), cpu(out).float()))\n            hooks.append(layer.self_attn.register_forward_hook(h_attn, with_kwargs=True))\n            hooks.append(layer.self_attn.attn.register_forward_hook(h_radix, with_kwargs=True))\n        def h_model(m, args, kwargs, out):\n            calls.append(("model", cpu(kwargs.get("input_ids", args[0] if args else None)),\n                          cpu(kwargs.get("positions", args[1] if len(args) > 1 else None)),\n                          cpu(forward_batch.spec_info.hidden_states).float(),\n                          cpu(out.next_token_logits).float().topk(3, dim=-1),\n                          cpu(out.hidden_states).float() if out.hidden_states is not None else None))\n        hooks.append(model.register_forward_hook(h_model, with_kwargs=True))\n        try:\n            out = orig(self, forward_batch)\n        finally:\n            for h in hooks:\n                h.remove()\n        rec["calls"] = calls\n        rec["out"] = cpu(list(out))\n        md = getattr(self.draft_attn_backend, "forward_metadata", None)\n        if md is not None:\n            rec["metadata"] = {k: cpu(v) for k, v in vars(md).items() if isinstance(v, torch.Tensor)}\n            rec["metadata_other"] = {k: repr(v)[:200] for k, v in vars(md).items() if not isinstance(v, torch.Tensor)}\n        rec["backend"] = type(self.draft_attn_backend).__name__\n        rec["backend_window"] = getattr(self.draft_attn_backend, "sliding_window_size", None)\n        os.makedirs(DIR, exist_ok=True)\n        torch.save(rec, os.path.join(DIR, f"draft-{os.getpid()}-{n:04d}.pt"))\n        return out\n\n    W.draft_forward = draft_forward\n    sys.stderr.write(f"mtpmatrix-probe: patched {W.__name__}.draft_forward (pid {os.getpid()})\\n")\n\n\n_mtpmatrix_draft_probe(FrozenKVMTPDraftWorker)\n\n\n'


def write_payload(out: Path) -> int:
    from mtpmatrix.core.atomic import atomic_write_json
    from mtpmatrix.faults.mutation import ENV_MUTANT, HOOK_DIR, Mutant, Site, apply, find_sglang, hook_payload

    pkg = find_sglang()
    if pkg is None:
        raise SystemExit("error: no sglang importable by this python (run with the python that runs the server)")
    probe = Mutant(
        "draft-probe",
        "probe",
        "dumps each draft forward's inputs; changes nothing",
        (Site(WORKER, ANCHOR, PROBE_SOURCE + ANCHOR),),
    )
    app = apply(probe, pkg)
    if not app.applicable or app.error:
        raise SystemExit(f"error: the probe does not apply to {pkg}: {app.error or app.reason()}")
    atomic_write_json(out, hook_payload(app))
    print(f"{out}: serve with\n  {ENV_MUTANT}={out} MTPMATRIX_PROBE_DIR=DIR PYTHONPATH={HOOK_DIR}:$PYTHONPATH")
    return 0


def rope_position(vec, inv_freq, max_pos: int) -> int:
    """The RoPE position ``vec`` (one head, neox pairs (i, i + head_dim/2)) was rotated by, for a vector whose
    rotating pairs start on their first component; -1 when none fits."""
    import torch

    half, n = vec.shape[-1] // 2, len(inv_freq)
    x1, x2 = vec[:n].double(), vec[half : half + n].double()
    pos = torch.arange(max_pos + 1, dtype=torch.float64)[:, None]
    ang = pos * inv_freq.double()[None, :]
    # rotating back by p: second component = x2 cos(p w) - x1 sin(p w); it vanishes at the true position
    resid = (x2[None, :] * torch.cos(ang) - x1[None, :] * torch.sin(ang)).norm(dim=-1)
    best = int(resid.argmin())
    return best if resid[best] < 0.05 * max(float(vec.double().norm()), 1e-9) else -1


def read_dumps(dumps: Path, pair: Path, calls: int) -> int:
    import torch

    from mtpmatrix.pairs.witness.positions import rope_inv_freq

    cfg = json.loads((pair / "target" / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    files = sorted(glob.glob(str(dumps / "draft-*.pt")))
    if not files:
        raise SystemExit(f"no draft-*.pt in {dumps}")
    for f in files[:calls]:
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
            print(
                f"  assistant layer {logical} ({ltype}, target layer {phys}): query at {q_pos}, keys of slots 0 / "
                f"{seq - 1} at {first} / {last}, query scores slot {top} highest, draft phase "
                f"{phase if phase is None else f'{phase:+d}'}"
            )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pay = sub.add_parser("payload", help="write the hook payload that serves the probe to sglang")
    pay.add_argument("out", type=Path)
    rd = sub.add_parser("read", help="read a witness pair's dumps back as the draft phase")
    rd.add_argument("dumps", type=Path)
    rd.add_argument("--pair", type=Path, required=True, help="the witness pair folder (holds target/config.json)")
    rd.add_argument("--calls", type=int, default=3, help="dumped draft calls to read (default 3)")
    a = p.parse_args(argv)
    return write_payload(a.out) if a.cmd == "payload" else read_dumps(a.dumps, a.pair, a.calls)


if __name__ == "__main__":
    sys.exit(main())
