"""A tiny pair's folder: ``root/<name>[-<variant>]/{target,assistant}`` plus ``.mtpmatrix-tiny.json`` (the marker,
with a hash of the templates, the code version and the construction's source). Builds go to a temp dir that is
renamed into place, so a finished folder is reused as is and an interrupted build is never mistaken for a finished
one. Weights are random (transformers' own init, seeded) with the variant's construction written over them
(``checkpoint``); when the model classes are missing the folder still gets configs + tokenizer and the marker says
``"weights": false`` with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mtpmatrix.core.settings import TINY_PAIR_NAMES as PAIR_NAMES
from mtpmatrix.pairs.tiny.checkpoint import save_weights
from mtpmatrix.pairs.tiny.configs import (
    DTYPE,
    assistant_template,
    generation_config,
    target_template,
    variant_name,
    write_json,
)
from mtpmatrix.pairs.tiny.vocab import SPECIAL_TOKENS, make_tokenizer, save_processor
from mtpmatrix.pairs.witness.phase import phase_of_variant

CODE_VERSION = "tiny-v3"  # v2: MoE experts share weights; v3: two physical layers per type, witness variant
MARKER = ".mtpmatrix-tiny.json"

# The source files a constructed variant's weights come from (relative to mtpmatrix/pairs/): a pair is rebuilt
# whenever its construction changes. random and constructed hash none (CODE_VERSION is theirs).
_WITNESS_SOURCES = (
    "witness/weights.py",
    "witness/layout.py",
    "witness/codes.py",
    "witness/positions.py",
    "weights.py",
)
_SOURCES = {
    "witness": _WITNESS_SOURCES,
    "decoy": (*_WITNESS_SOURCES, "decoy.py"),
    "sampled": ("sampled/ring.py", "sampled/bonus.py", "sampled/weights.py", "weights.py"),
    "long": ("long_witness.py", "long_witness_weights.py", *_WITNESS_SOURCES),
}


@dataclass(frozen=True)
class PairPaths:
    name: str
    target: Path
    assistant: Path
    constructed: bool
    variant: str = "random"


def pair_hash(name: str, variant: str | bool, seed: int) -> str:
    variant = variant_name(variant)
    sources = _SOURCES.get(variant.split("-")[0], ())
    witness_src = b"".join((Path(__file__).parents[1] / f).read_bytes() for f in sources)
    phase = phase_of_variant(variant) if sources and variant != "sampled" else None  # follows the installed sglang
    blob = json.dumps(
        {
            "code": CODE_VERSION,
            "variant": variant,
            "witness": hashlib.sha256(witness_src).hexdigest(),
            "phase": phase,
            "target": target_template(name, variant),
            "assistant": assistant_template(name, variant),
            "seed": seed,
            "tokenizer": SPECIAL_TOKENS,
            "generation": generation_config(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _usable(folder: Path, digest: str) -> bool:
    m = read_marker(folder)
    if not m or m.get("hash") != digest:
        return False
    if m.get("weights"):
        return True
    # No weights last time (e.g. a transformers without Gemma 4): retry if this one may have the classes.
    return not _has_model_classes()


def _has_model_classes() -> bool:
    try:
        from transformers import Gemma4AssistantForCausalLM, Gemma4ForConditionalGeneration  # noqa: F401
    except Exception:
        return False
    return True


def build_pair(
    name: str, root: Path, *, variant: str | bool = "random", constructed: bool | None = None, seed: int = 0
) -> PairPaths:
    """Build (or reuse) the tiny pair ``name`` under ``root``; see the module docstring."""
    if name not in PAIR_NAMES:
        raise ValueError(f"unknown tiny pair {name!r}; known: {', '.join(PAIR_NAMES)}")
    root = Path(root)
    variant = variant_name(constructed if constructed is not None else variant)
    dest = root / (name + ("" if variant == "random" else f"-{variant}"))
    paths = PairPaths(
        name=name,
        target=dest / "target",
        assistant=dest / "assistant",
        constructed=variant == "constructed",
        variant=variant,
    )
    digest = pair_hash(name, variant, seed)
    if _usable(dest, digest):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{dest.name}-", dir=root))
    try:
        marker = _build_into(tmp, name, variant, seed)
        marker["hash"] = digest
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        if dest.exists():
            if _usable(dest, digest):  # a concurrent build finished first
                return paths
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(tmp, dest)
        except OSError:
            if not _usable(dest, digest):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


def _build_into(folder: Path, name: str, variant: str, seed: int) -> dict:
    t_dir, a_dir = folder / "target", folder / "assistant"
    t_cfg, a_cfg = target_template(name, variant), assistant_template(name, variant)
    marker: dict = {
        "name": name,
        "variant": variant,
        "constructed": variant == "constructed",
        "seed": seed,
        "code_version": CODE_VERSION,
        "dtype": DTYPE,
        "weights": False,
        "weights_error": None,
        "processor": False,
        "processor_error": None,
    }
    try:
        import transformers

        marker["transformers"] = transformers.__version__
    except Exception as exc:  # noqa: BLE001
        marker["transformers"] = None
        marker["weights_error"] = f"transformers does not import: {exc}"

    tokenizer = make_tokenizer()
    for d in (t_dir, a_dir):
        tokenizer.save_pretrained(d)
        write_json(d / "generation_config.json", generation_config())
    try:
        save_processor(tokenizer, t_dir)
        marker["processor"] = True
    except Exception as exc:  # noqa: BLE001 - recorded; the folder is still shape-true for text-only serving
        marker["processor_error"] = f"{type(exc).__name__}: {exc}"[:300]

    if marker["transformers"] is not None:
        try:
            marker.update(save_weights(t_cfg, a_cfg, t_dir, a_dir, variant, seed))
            marker["weights"] = True
        except Exception as exc:  # noqa: BLE001 - a transformers that cannot build the classes: files stay
            marker["weights_error"] = f"{type(exc).__name__}: {exc}"[:300]
    # config.json always comes from the templates (written last: save_pretrained must not overwrite it).
    write_json(t_dir / "config.json", t_cfg)
    write_json(a_dir / "config.json", a_cfg)
    return marker
