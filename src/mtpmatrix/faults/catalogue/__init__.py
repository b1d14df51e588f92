"""The fault-injection catalogue: small source mutations of the installed sglang's MTP path, one deliberate bug each
of the kind the smoke tier exists to catch, as data (``witness``, ``decoy_and_sampled``, ``request_surface``, ``long_context``:
by the servers that see them). What a mutant is and how it is applied: ``mtpmatrix.faults.mutation``.
"""

from __future__ import annotations

from mtpmatrix.core.schema import comma_list
from mtpmatrix.faults.catalogue.decoy_and_sampled import DECOY_AND_SAMPLED_MUTANTS
from mtpmatrix.faults.catalogue.long_context import LONG_CONTEXT_MUTANTS
from mtpmatrix.faults.catalogue.request_surface import REQUEST_SURFACE_MUTANTS
from mtpmatrix.faults.catalogue.witness import WITNESS_MUTANTS
from mtpmatrix.faults.mutation import Mutant, MutantsError

CATALOGUE: tuple[Mutant, ...] = (
    WITNESS_MUTANTS + DECOY_AND_SAMPLED_MUTANTS + REQUEST_SURFACE_MUTANTS + LONG_CONTEXT_MUTANTS
)


def catalogue_by_id() -> dict[str, Mutant]:
    return {m.id: m for m in CATALOGUE}


def select(ids: str | None, catalogue: tuple[Mutant, ...] = CATALOGUE) -> list[Mutant]:
    """The mutants named in ``ids`` ("a,b"), in catalogue order; all when empty. MutantsError on unknown ids."""
    if not ids or not ids.strip():
        return list(catalogue)
    wanted = comma_list(ids)
    known = [m.id for m in catalogue]
    unknown = [t for t in wanted if t not in known]
    if unknown:
        raise MutantsError(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [m for m in catalogue if m.id in wanted]
