"""A tiny pair reused from a persistent folder is served only while its files are the ones a session built there
(mtpmatrix.tiers.pair_cache; docs/runs/2026-12-04-cpu-hostile-review.md case 34). The builder here reuses a folder by
its marker as pairs.tiny.build_pair does, and writes bytes that say which build made them (a real build needs
torch; the CPU measurement with the 0.5.17 row's venv is in docs/evidence.md)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from mtpmatrix.pairs.tiny.build import MARKER
from mtpmatrix.tiers import pair_cache


@dataclass(frozen=True)
class Paths:
    target: Path
    assistant: Path


class Builder:
    """pairs.tiny.build_pair's reuse rule: a folder whose marker carries the recipe hash is returned as it is."""

    def __init__(self) -> None:
        self.builds = 0

    def __call__(self, name: str, root: Path, *, variant: str) -> Paths:
        dest = Path(root) / f"{name}-{variant}"
        marker = {"hash": f"recipe-of-{name}-{variant}"}
        if not (dest / MARKER).is_file() or json.loads((dest / MARKER).read_text()) != marker:
            self.builds += 1
            for part in ("target", "assistant"):
                (dest / part).mkdir(parents=True, exist_ok=True)
                (dest / part / "model.safetensors").write_text(f"{name}-{variant} {part} weights")
            (dest / MARKER).write_text(json.dumps(marker))
        return Paths(dest / "target", dest / "assistant")


def _weights(paths: Paths) -> str:
    return (paths.target / "model.safetensors").read_text()


def test_a_pair_this_suite_built_is_reused_by_the_next_session(tmp_path):
    build = Builder()
    first = pair_cache.served_pair(build, "e-series", "random", tmp_path / "tiny", tmp_path / "own1")
    assert (first.target.parent / pair_cache.FILES).is_file()
    again = pair_cache.served_pair(build, "e-series", "random", tmp_path / "tiny", tmp_path / "own2")
    assert again == first and build.builds == 1 and not (tmp_path / "own2").exists()


def test_a_folder_seeded_with_other_weights_and_a_copied_marker_is_not_served(tmp_path):
    build = Builder()
    genuine = pair_cache.served_pair(build, "e-series", "random", tmp_path / "genuine", tmp_path / "own0")
    other = pair_cache.served_pair(build, "e-series", "witness", tmp_path / "genuine", tmp_path / "own0")
    seeded = tmp_path / "tiny" / "e-series-random"
    shutil.copytree(other.target.parent, seeded)  # the witness pair's weights ...
    for name in (MARKER, pair_cache.FILES):  # ... under the random pair's marker and file list
        shutil.copy(genuine.target.parent / name, seeded / name)
    got = pair_cache.served_pair(build, "e-series", "random", tmp_path / "tiny", tmp_path / "own")
    assert got.target.is_relative_to(tmp_path / "own") and _weights(got) == "e-series-random target weights"
    assert _weights(Paths(seeded / "target", seeded / "assistant")) == "e-series-witness target weights"  # kept


def test_a_reused_folder_without_the_file_list_is_built_again_in_the_session_s_own_folder(tmp_path):
    build = Builder()
    build("e-series", tmp_path / "tiny", variant="random")  # a folder from before the list was kept
    got = pair_cache.served_pair(build, "e-series", "random", tmp_path / "tiny", tmp_path / "own")
    assert got.target.is_relative_to(tmp_path / "own") and build.builds == 2


def _dangling_second_shard(folder: Path) -> None:
    (folder / "target" / "model-00002-of-00002.safetensors").symlink_to(folder.parent / "not-there-yet.safetensors")


def _weights_through_a_link_to_the_same_bytes(folder: Path) -> None:
    outside = folder.parent / "outside.safetensors"
    shutil.copy(folder / "target" / "model.safetensors", outside)
    (folder / "target" / "model.safetensors").unlink()
    (folder / "target" / "model.safetensors").symlink_to(outside)


def _a_second_list_below(folder: Path) -> None:
    (folder / "target" / pair_cache.FILES).write_text("{}")


@pytest.mark.parametrize(
    "edit", [_dangling_second_shard, _weights_through_a_link_to_the_same_bytes, _a_second_list_below]
)
def test_a_folder_holding_a_link_or_a_file_the_list_skips_is_not_served(tmp_path, edit):
    """A link in a pair folder points where the session's check does not hold: a dangling second shard (skipped by
    the digests, then created before the server globs *.safetensors) or weights linked to bytes outside it were
    served; so was a file named like the list below the top, which the digests skipped at any depth."""
    build = Builder()
    first = pair_cache.served_pair(build, "e-series", "random", tmp_path / "tiny", tmp_path / "own1")
    edit(first.target.parent)
    again = pair_cache.served_pair(build, "e-series", "random", tmp_path / "tiny", tmp_path / "own2")
    assert again.target.parent == tmp_path / "own2" / "e-series-random" and build.builds == 2
