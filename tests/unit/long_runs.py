"""The long family against the fake sglang, as the unit tests need it (fake_long.LongWitnessShapes): the long
servers, their exchanges sent as the smoke tier sends them, SmokeRuns for the tier's checks, and which known-upstream
entry a check's failure matches."""

from __future__ import annotations

import pytest
from fake_long import LongWitnessShapes
from fake_sglang import FakeSglang

from mtpmatrix.core import smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving import client
from mtpmatrix.tiers import surface
from mtpmatrix.tiers.surface import long_context

SPECS = {s.name: s for s in smoke_servers.SMOKE_SERVERS if s.name in smoke_servers.LONG_SERVERS}
MTP_NAMES = [n for n, s in SPECS.items() if s.topk]
NOMTP = SPECS["long-witness-nomtp"]
TOPK3 = SPECS["long-witness-mtp-topk3-paged"]
DECODE_ENTRY = "sglang-triton-swa-decode-window-one-short"


def collect(
    spec, broken: str = "", retract_after: int | None = None, queued_victim: bool = False
) -> list[surface.Exchange]:
    """The family's requests for ``spec`` as mtpmatrix.tiers.smoke.collect sends them, against a fake."""
    labelled, alone = surface.split_alone(
        [(long_context.NAME, label, p) for label, p in long_context.requests(spec, 512)]
    )
    shapes = LongWitnessShapes(spec.topk, smoke_servers.page_size(spec), broken, retract_after, queued_victim)
    with FakeSglang(shapes=shapes) as fake:
        results = client.run_batch(fake.base_url, [p for _f, _l, p in labelled], parallel=16)
        results += client.run_batch(fake.base_url, [p for _f, _l, p in alone], parallel=1)
    return surface.collate(labelled + alone, results)[long_context.NAME]


def tier_module():
    """tests/tiers/test_smoke_long.py, whose check functions the unit tests call on fake SmokeRuns."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tests" / "tiers" / "test_smoke_long.py"
    spec = importlib.util.spec_from_file_location("test_smoke_long", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_runs(tmp_path, broken: str = "", log: str = "", twin: str = "", specs: dict | None = None) -> dict:
    """SmokeRuns of the long servers (``specs``, default the default ones) on the fake: the MTP ones ``broken``, the
    no-MTP ones ``twin``."""
    from mtpmatrix.tiers.smoke import SmokeRun

    return {
        name: SmokeRun(
            spec=spec,
            log_path=tmp_path / f"server-{name}.log",
            vocab_size=512,
            surface={long_context.NAME: collect(spec, broken if spec.topk else twin)},
            log_text=log,
        )
        for name, spec in (SPECS if specs is None else specs).items()
    }


def failure_of(check, runs: dict, name: str) -> tuple[CheckFailure, str | None]:
    """The failure a tier check of test_smoke_long raises on ``runs[name]`` (pytest fails the test if it raises none),
    and the known-upstream entry that failure matches (``known_id``), or None."""
    with pytest.raises(CheckFailure) as failed:
        check(runs, name, lambda *_: None)
    return failed.value, known_id(f"tests/tiers/test_smoke_long.py::{check.__name__}[{name}]", failed.value)


def known_id(check_id: str, failure: CheckFailure) -> str | None:
    """The known-upstream entry (of every entry) that matches this failure of ``check_id``, or None."""
    from mtpmatrix.core import known_upstream

    record = {
        "id": check_id,
        "outcome": "failed",
        "failure": {"kind": failure.kind, "type": "CheckFailure", "message": str(failure)},
    }
    return next((k.id for k in known_upstream.load() if k.matches(record)), None)
