"""Draft probe: dump what sglang's Frozen-KV MTP draft forward is handed and computes (a diagnostic, not a check).

Put this folder first on PYTHONPATH for an sglang server and set MTPMATRIX_PROBE_DIR; every process that imports
sglang's Frozen-KV MTP worker wraps ``FrozenKVMTPDraftWorker.draft_forward`` and writes, for its first
MTPMATRIX_PROBE_LIMIT (40) calls, one ``draft-<pid>-<n>.pt`` with: seq_lens, positions, req_pool_indices, the seed
(bonus tokens, target hidden states), the physical layer map, each request's KV slots and every target layer's K/V
at those slots, each assistant layer's attention input/output and its query after RoPE (RadixAttention's q), the
draft tokens and the draft attention metadata. The draft forward runs eagerly only: serve with
``--disable-cuda-graph`` (and ``--disable-hybrid-swa-memory`` so the K/V buffers need no index translation; on
0.5.17 that flag crashes the e-series pair, whose sliding and full head dims differ).
``python tools/draft_phase.py DUMP_DIR --pair PAIR_DIR`` reads the dumps of a witness pair back.
Found with it (H200, sglang 0.5.17): the target writes keys at position + 1, the draft query sits at seq_lens - 1.
"""
import importlib.abc, importlib.machinery, importlib.util, os, sys
DIR = os.environ.get("MTPMATRIX_PROBE_DIR")
LIMIT = int(os.environ.get("MTPMATRIX_PROBE_LIMIT", "40"))
TARGET = "sglang.srt.speculative.frozen_kv_mtp_worker_v2"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _cpu(x):
    import torch
    if isinstance(x, torch.Tensor):
        return x.detach().clone().cpu()
    if isinstance(x, (list, tuple)):
        return [_cpu(y) for y in x]
    return x


def _patch(mod):
    import torch
    W = mod.FrozenKVMTPDraftWorker
    orig = W.draft_forward
    count = [0]

    def draft_forward(self, forward_batch):
        n = count[0]
        count[0] += 1
        if n >= LIMIT:
            return orig(self, forward_batch)
        rec = {"n": n, "topk": self.topk}
        si = forward_batch.spec_info
        for k in ("seq_lens", "positions", "req_pool_indices", "input_ids"):
            rec[k] = _cpu(getattr(forward_batch, k, None))
        rec["bonus"] = _cpu(si.bonus_tokens)
        rec["hidden"] = _cpu(si.hidden_states).float()
        ctx = self.kv_context
        rec["physical_layer_ids"] = dict(ctx.physical_layer_ids)
        pool = ctx.target_token_to_kv_pool
        rec["pool_type"] = type(pool).__name__
        r2t = self.req_to_token_pool.req_to_token
        idx = []
        for i in range(len(forward_batch.seq_lens)):
            L = int(forward_batch.seq_lens[i])
            idx.append(r2t[int(forward_batch.req_pool_indices[i]), :L].clone())
        rec["kv_idx"] = _cpu(idx)
        kv = {}
        for layer in range(64):
            try:
                kb, vb = pool.get_key_buffer(layer), pool.get_value_buffer(layer)
            except Exception as exc:
                kv[layer] = repr(exc)[:200]
                if layer > 12:
                    break
                continue
            kv[layer] = ([kb[j.long()].float().cpu() for j in idx], [vb[j.long()].float().cpu() for j in idx])
        rec["kv"] = kv
        calls = []
        hooks = []
        model = self.draft_model_runner.model
        for li, layer in enumerate(model.model.layers):
            def h_attn(m, args, kwargs, out, li=li):
                calls.append(("self_attn", li, _cpu(kwargs.get("positions")), _cpu(kwargs.get("hidden_states")), _cpu(out)))
            def h_radix(m, args, kwargs, out, li=li):
                q = args[0] if args else kwargs.get("q")
                calls.append(("radix", li, int(m.layer_id), _cpu(q).float(), _cpu(out).float()))
            hooks.append(layer.self_attn.register_forward_hook(h_attn, with_kwargs=True))
            hooks.append(layer.self_attn.attn.register_forward_hook(h_radix, with_kwargs=True))
        def h_model(m, args, kwargs, out):
            calls.append(("model", _cpu(kwargs.get("input_ids", args[0] if args else None)),
                          _cpu(kwargs.get("positions", args[1] if len(args) > 1 else None)),
                          _cpu(forward_batch.spec_info.hidden_states).float(),
                          _cpu(out.next_token_logits).float().topk(3, dim=-1),
                          _cpu(out.hidden_states).float() if out.hidden_states is not None else None))
        hooks.append(model.register_forward_hook(h_model, with_kwargs=True))
        try:
            out = orig(self, forward_batch)
        finally:
            for h in hooks:
                h.remove()
        rec["calls"] = calls
        rec["out"] = _cpu(list(out))
        md = getattr(self.draft_attn_backend, "forward_metadata", None)
        if md is not None:
            rec["metadata"] = {k: _cpu(v) for k, v in vars(md).items() if isinstance(v, torch.Tensor)}
            rec["metadata_other"] = {k: repr(v)[:200] for k, v in vars(md).items() if not isinstance(v, torch.Tensor)}
        rec["backend"] = type(self.draft_attn_backend).__name__
        rec["backend_window"] = getattr(self.draft_attn_backend, "sliding_window_size", None)
        os.makedirs(DIR, exist_ok=True)
        torch.save(rec, os.path.join(DIR, f"draft-{os.getpid()}-{n:04d}.pt"))
        return out

    W.draft_forward = draft_forward
    sys.stderr.write(f"mtpmatrix-probe: patched {W.__name__}.draft_forward (pid {os.getpid()})\n")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            try:
                _patch(module)
            except Exception as exc:
                sys.stderr.write(f"mtpmatrix-probe: patch failed {exc!r}\n")
        loader.exec_module = exec_module
        return spec


if DIR:
    sys.meta_path.insert(0, _Finder())


def _chain():
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or not spec.origin or os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _chain()
except Exception as exc:
    sys.stderr.write(f"mtpmatrix-probe: chain failed {exc!r}\n")
