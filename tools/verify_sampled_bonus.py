"""CPU check of the sampled pair's second region (pairs.sampled.bonus) with transformers, bf16 and fp32:

  1. the ring and every existing prompt of the sampled servers: target logits (pre- and post-softcap) and drafter
     logits identical to a pair built before the region existed (BASE);
  2. region 2: the target's pre-softcap logits exactly as designed (bf16: bit for bit), at one token and along
     whole region-2 sequences; the spread law from its softcapped logits against the closed form; the chain
     successor's probability at T 1.5;
  3. the drafter, fed the target's hidden state and KV as sglang's Frozen-KV MTP feeds it: from every chain start,
     five greedy drafts = the chain and the spread token.

    PYTHONPATH=src .nox/gemma4_mtp-sglang-0-5-17/bin/python tools/verify_sampled_bonus.py BASE NEW

BASE, NEW: roots holding e-series-sampled/ (tiny.build.build_pair("e-series", root, variant="sampled")), BASE built from a
checkout before the region (e.g. a git worktree of the commit before it), NEW from this one.
"""

import math
import sys

import torch
from transformers import Gemma4AssistantForCausalLM, Gemma4ForConditionalGeneration

from mtpmatrix.pairs.sampled import bonus as pb
from mtpmatrix.pairs.sampled import ring
from mtpmatrix.pairs.tiny.configs import target_template
from mtpmatrix.pairs.tiny.vocab import VOCAB
from mtpmatrix.pairs.witness.harness import _assist, target_states
from mtpmatrix.pairs.witness.layout import physical_kv_layers
from mtpmatrix.tiers import smoke
from mtpmatrix.tiers.surface import bonus, mixed_sampling

V = VOCAB
PHYS = physical_kv_layers(target_template("e-series", "sampled")["text_config"])


def load(root, dtype):
    t = Gemma4ForConditionalGeneration.from_pretrained(f"{root}/e-series-sampled/target", dtype=dtype).eval()
    a = Gemma4AssistantForCausalLM.from_pretrained(f"{root}/e-series-sampled/assistant", dtype=dtype).eval()
    return t, a


def prelogits(t, ids):
    """Pre-softcap logits at every position (final normed hidden @ lm_head, in the model's dtype) and the model's
    own softcapped logits."""
    hidden, _ = target_states(t, ids)
    with torch.inference_mode():
        return hidden @ t.lm_head.weight.T, t(input_ids=ids).logits


def kvs(layer_kv, n):
    """The last physical sliding and full layer's KV over the first n positions (what the drafter reads)."""
    return {typ: (layer_kv[i[-1]][0][:, :, :n], layer_kv[i[-1]][1][:, :, :n]) for typ, i in PHYS.items()}


def designed_row(token: int):
    row = torch.full((V,), ring.OTHER_LOGIT)
    for t, s, lg in pb.successor_logits():
        if t == token:
            row[s] = lg
    return row


def main(base: str, new: str) -> int:
    ok_all = True
    ring_prompts = [list(r.prompt) for r in ring.request_plan()[:16]] + [
        list(p.prompt) for p in mixed_sampling.plan()[:8]
    ]
    ring_prompts += [p[:12] for p in smoke.id_prompts(V)]
    for dtype in (torch.bfloat16, torch.float32):
        tb, ab = load(base, dtype)
        tn, an = load(new, dtype)
        emb_b, emb_n = tb.get_input_embeddings(), tn.get_input_embeddings()
        # 1. existing prompts: identical to the pair built before the region
        ids = torch.tensor(ring_prompts)
        (pre_b, post_b), (pre_n, post_n) = prelogits(tb, ids), prelogits(tn, ids)
        hb, kvb = target_states(tb, ids)
        hn, kvn = target_states(tn, ids)
        last = ids.shape[1] - 1
        pos = torch.full((ids.shape[0], 1), last, dtype=torch.long)
        with torch.inference_mode():
            da, _ = _assist(ab, emb_b, ids[:, last:], hb[:, last - 1 : last], kvs(kvb, last), pos)
            dn, _ = _assist(an, emb_n, ids[:, last:], hn[:, last - 1 : last], kvs(kvn, last), pos)
        same = torch.equal(pre_b, pre_n) and torch.equal(post_b, post_n) and torch.equal(da, dn)
        ok_all &= same
        print(f"{dtype}: existing prompts, target logits (pre/post softcap) and drafter logits identical: {same}")
        # 2. region 2: logits as designed, at one token and along region-2 sequences
        toks = list(range(pb.R2_START, pb.R2_START + pb.R2_SIZE))
        pre1, post1 = prelogits(tn, torch.tensor([[t] for t in toks]))
        want = torch.stack([designed_row(t) for t in toks])
        seqs = []
        for p in bonus.plan()[:8]:
            s = list(p.prompt)
            for k in range(3):
                s += list(pb.CHAINS[(len(s) + k) % pb.N_STARTS]) + [pb.SPREAD]
            seqs.append(s)
        ids3 = torch.tensor(seqs)
        pre3, _ = prelogits(tn, ids3)
        want3 = torch.stack([torch.stack([designed_row(t) for t in s]) for s in seqs])
        err1 = float((pre1[:, 0].float() - want).abs().max())
        err3 = float((pre3.float() - want3).abs().max())
        exact = err1 == 0 and err3 == 0
        if dtype == torch.bfloat16:
            ok_all &= exact
        print(
            f"{dtype}: region 2 pre-softcap logits exactly as designed: {exact} (max error {max(err1, err3):.3g}); "
            f"softcapped vs softcap(designed): max error "
            f"{float((post1[:, 0].float() - 30 * torch.tanh(want / 30)).abs().max()):.3g}"
        )
        spread_row = post1[toks.index(pb.SPREAD), 0].double()
        for g in pb.GROUPS:
            pr = torch.softmax(spread_row / g.temperature, -1)[list(pb.STARTS)]
            pr = torch.where(torch.arange(pb.N_STARTS) < g.top_k, pr, torch.zeros(pb.N_STARTS))
            print(
                f"{dtype}: {g.name}: law from the logits {[round(float(x), 5) for x in pr / pr.sum()]}, "
                f"closed form {[round(x, 5) for x in pb.spread_law(V, g)]}"
            )
        chain = torch.softmax(post1[toks.index(pb.STARTS[0]), 0].double() / pb.MAX_TEMPERATURE, -1)
        print(f"{dtype}: chain successor's probability at T {pb.MAX_TEMPERATURE}: {float(chain[pb.CHAINS[0][1]])!r}")
        # 3. the drafter from every chain start: five greedy drafts = the chain, then SPREAD
        hidden, layer_kv = target_states(tn, ids3)
        good = total = 0
        margin = math.inf
        with torch.inference_mode():
            for P in range(1, ids3.shape[1] - pb.STEPS):
                rows = [b for b, s in enumerate(seqs) if s[P] in pb.STARTS]
                if not rows:
                    continue
                bi = torch.tensor(rows)
                token, state = ids3[bi, P : P + 1], hidden[bi, P - 1 : P]
                kv = {typ: (k[bi], v[bi]) for typ, (k, v) in kvs(layer_kv, P).items()}
                pos = torch.full((len(rows), 1), P, dtype=torch.long)
                drafts = []
                for _ in range(pb.STEPS):
                    logits, state = _assist(an, emb_n, token, state, kv, pos)
                    top2 = logits[:, 0].float().topk(2, -1).values
                    margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
                    token = logits.argmax(-1)
                    drafts.append(token[:, 0])
                drafts = torch.stack(drafts, 1)
                for r, b in enumerate(rows):
                    total += 1
                    good += drafts[r].tolist() == list(pb.CHAINS[pb.START_INDEX[seqs[b][P]]][1:]) + [pb.SPREAD]
        ok_all &= good == total > 0
        print(
            f"{dtype}: drafter: {good}/{total} rounds from a chain start drafted the whole chain; worst top-1 "
            f"margin {margin:.2f} logits"
        )
    print("OK" if ok_all else "FAILED")
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
