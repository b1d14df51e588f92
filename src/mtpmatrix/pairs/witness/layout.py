"""Where the witness construction (``witness.weights``) puts things: which dims of the target hidden state (the
backbone) and of the assistant hidden state hold what, and which target layers own the KV sglang binds."""

from __future__ import annotations

from dataclasses import dataclass

D_CODE = 14
D_NUISANCE = 14
D_ANCHOR = 8


def _consecutive(parts: list[tuple[str, int]], start: int = 1) -> dict[str, slice]:
    """Slices of consecutive dims, in order, after ``start`` leading dims (dim 0 holds the constant)."""
    out = {}
    for name, size in parts:
        out[name] = slice(start, start + size)
        start += size
    return out


@dataclass(frozen=True)
class Layout:
    """Which dims of the target hidden (backbone) and of the assistant hidden hold what. Dim 0 of each holds the
    constant (``b_const`` / ``a_const``); the named parts follow in this order."""

    backbone: int
    assistant: int
    centroids: int  # 0 without a centroid head
    extra_backbone: tuple = ()  # (name, size) parts a WitnessExtension adds after the witness's own
    extra_assistant: tuple = ()

    b_const = a_const = 0

    def __post_init__(self):
        backbone = _consecutive(
            [
                ("own", D_CODE),
                ("next", D_CODE),
                ("anchor_s", D_ANCHOR),
                ("anchor_f", D_ANCHOR),
                ("cluster", self.centroids),
                *self.extra_backbone,
            ]
        )
        assistant = _consecutive(
            [
                ("code", D_CODE),
                ("nuisance", D_NUISANCE),
                ("keep_s", D_ANCHOR),
                ("keep_f", D_ANCHOR),
                ("cluster", self.centroids),
                *self.extra_assistant,
            ]
        )
        for prefix, parts in (("b_", backbone), ("a_", assistant)):
            for name, sl in parts.items():
                object.__setattr__(self, prefix + name, sl)  # frozen: set once, here
        object.__setattr__(
            self, "_ends", (max(sl.stop for sl in backbone.values()), max(sl.stop for sl in assistant.values()))
        )

    def check(self) -> None:
        b_end, a_end = self._ends
        if b_end > self.backbone or a_end > self.assistant:
            raise ValueError(
                f"witness layout does not fit: backbone {b_end}/{self.backbone}, assistant {a_end}/{self.assistant}"
            )


def physical_kv_layers(text: dict) -> dict[str, list[int]]:
    """Non-KV-shared target layers by attention type, in order (the last of each is the one sglang binds)."""
    n = text["num_hidden_layers"]
    first_shared = n - (text.get("num_kv_shared_layers") or 0)
    out: dict[str, list[int]] = {}
    for i, t in enumerate(text["layer_types"][:first_shared]):
        out.setdefault(t, []).append(i)
    return out
