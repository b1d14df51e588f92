"""The reference tier's model loading (tests/tiers): the tiny pairs in fp32 on one intra-op thread, each loaded once
per session, shared by every reference test file (tests/tiers/conftest.py ``load_pair``)."""

from __future__ import annotations

import contextlib
import functools
import hashlib

from mtpmatrix.core.kinds import CheckFailure


def one_thread_torch():
    import torch

    # One intra-op thread: the tiny models gain nothing from more, and on a small shared CPU box (2 cores, other
    # processes busy) torch's spinning OpenMP barriers made 2 threads 20-30x slower than 1 (measured).
    torch.set_num_threads(1)
    # The checks run the models under torch.inference_mode, not no_grad: no autograd bookkeeping at all (version
    # counters, view tracking), ~5 % less CPU a generate on these tiny models, the same numbers (issue #21)
    return torch


def memo(fn):
    """lru_cache that also remembers a failure, so each failing pair is run (and reported) once per session."""
    done: dict = {}

    @functools.wraps(fn)
    def inner(*args):
        if args not in done:
            try:
                done[args] = (True, fn(*args))
            except Exception as exc:  # noqa: BLE001 - re-raised below, for every test that needs it
                done[args] = (False, exc)
        ok, value = done[args]
        if not ok:
            raise value
        return value

    return inner


def folder_digest(folder) -> str:
    """sha256 over the names and bytes of every file in ``folder`` (a tiny pair's model folder: a few MiB)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def pair_loader(build_tiny_pair):
    """``(name, variant) -> (target, assistant, tokenizer)`` in fp32, loaded once per session and pair (a bool
    variant, the older spelling of constructed, is the same pair as its name). A model folder whose files are byte
    for byte those of one already loaded is that model: the witness and decoy pairs built for sglang's draft phase
    differ from the reference-phase ones in the assistant only (pairs.witness: the phase turns the draft query), so
    their targets are loaded once (issue #31)."""
    from mtpmatrix.pairs.tiny.build import read_marker
    from mtpmatrix.pairs.tiny.configs import variant_name

    loaded: dict[tuple[str, str], object] = {}  # (class, folder_digest) -> the model, loaded without a complaint

    @memo
    def _load(name: str, constructed):
        paths = build_tiny_pair(name, constructed)
        torch = one_thread_torch()
        try:
            from transformers import AutoTokenizer, Gemma4AssistantForCausalLM, Gemma4ForConditionalGeneration
        except ImportError as exc:
            raise CheckFailure("import", f"transformers has no Gemma 4 model classes: {exc}") from exc
        marker = read_marker(paths.target.parent) or {}
        if not marker.get("weights"):
            raise CheckFailure("weights", f"{name}: no weights were generated: {marker.get('weights_error')}")
        models = []
        for cls, folder in (
            (Gemma4ForConditionalGeneration, paths.target),
            (Gemma4AssistantForCausalLM, paths.assistant),
        ):
            key = (cls.__name__, folder_digest(folder))
            if key in loaded:
                models.append(loaded[key])
                continue
            try:
                model, info = cls.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
            except Exception as exc:
                raise CheckFailure(
                    "weights", f"{cls.__name__}.from_pretrained({folder.name}) failed: {type(exc).__name__}: {exc}"
                ) from exc
            bad = {
                k: sorted(v)[:5]
                for k, v in info.items()
                if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v
            }
            if bad:
                raise CheckFailure("weights", f"{cls.__name__} from {folder.name}: {bad}")
            loaded[key] = model.eval()
            models.append(model)
        tokenizer = AutoTokenizer.from_pretrained(paths.target)
        return models[0], models[1], tokenizer

    return lambda name, variant: _load(name, variant_name(variant))


@contextlib.contextmanager
def count_acceptance(stats: list):
    """Record (drafted, accepted, round) per verification step of transformers' Gemma 4 candidate generator; round
    counts the steps inside this context (one generate call), 0 = the first round after prefill."""
    from transformers.generation import candidate_generator as cg

    cls = cg.SinglePositionMultiTokenCandidateGenerator
    orig_get, orig_update = cls.get_candidates, cls.update_candidate_strategy
    pending: list[int] = []
    start = len(stats)

    def get_candidates(self, input_ids, *args, **kwargs):
        out = orig_get(self, input_ids, *args, **kwargs)
        pending.append(out[0].shape[1] - input_ids.shape[1])
        return out

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        drafted = pending.pop() if pending else 0
        if drafted:
            stats.append((drafted, int(num_matches), len(stats) - start))
        return orig_update(self, input_ids, scores, num_matches)

    cls.get_candidates, cls.update_candidate_strategy = get_candidates, update_candidate_strategy
    try:
        yield
    finally:
        cls.get_candidates, cls.update_candidate_strategy = orig_get, orig_update
