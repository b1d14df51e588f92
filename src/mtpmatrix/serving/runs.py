"""What the server-launching tiers (smoke, gsm8k) share: a server run is collected once by a fixture, and every
check over it replays what the run left before asserting its own part."""

from __future__ import annotations

from pathlib import Path

from mtpmatrix.core.schema import LAUNCH_SECONDS, SERVER_LOG


def replay_run(run, record_property):
    """For checks over a server run collected once by a fixture (smoke, gsm8k): record its log and launch time on
    this check, then re-raise the run's own failure (already classified) so every dependent check reports it."""
    if getattr(run, "log_path", None):  # server logs sit at the top of the row folder: the name is the path there
        record_property(SERVER_LOG, Path(run.log_path).name)
    if getattr(run, "launch_seconds", None) is not None:
        record_property(LAUNCH_SECONDS, run.launch_seconds)
    if getattr(run, "first_attempt_error", None):  # failed beside other servers, then relaunched alone
        record_property("first_attempt_error", run.first_attempt_error)
    if getattr(run, "confirmed_alone_by", None):  # failed beside others as that server did, and it so alone too
        record_property("confirmed_alone_by", run.confirmed_alone_by)
    if getattr(run, "known_upstream_no_relaunch", None):  # failed as a known-upstream entry says: not relaunched
        record_property("known_upstream_no_relaunch", run.known_upstream_no_relaunch)
    if getattr(run, "error", None) is not None:
        raise run.error
    return run
