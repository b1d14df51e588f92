"""The smoke servers' command lines as each sglang release spells them (compat.RENAMED_FLAGS)."""

from __future__ import annotations

from mtpmatrix.tiers.compat import sglang_compat as compat

ARGV = ["--model-path", "m", "--cuda-graph-max-bs", "8", "--disable-overlap-schedule", "--cuda-graph-max-bs", "2"]


def test_releases_before_the_split_keep_the_flag():
    assert compat.spelled_for_release(ARGV, "0.5.17") == ARGV
    assert compat.spelled_for_release(ARGV, "not-a-version") == ARGV  # unknown: left as written


def test_0_5_23_gets_the_decode_spelling_every_time_the_flag_appears():
    out = compat.spelled_for_release(ARGV, "0.5.23")
    assert out.count("--cuda-graph-max-bs-decode") == 2 and "--cuda-graph-max-bs" not in out
    assert out[3] == "8" and out[-1] == "2" and "--disable-overlap-schedule" in out  # values and others untouched
    assert compat.spelled_for_release(ARGV, "0.5.24.post1") == out
    assert compat.spelled_for_release(ARGV, "0.5.23rc1") == out == compat.spelled_for_release(ARGV, "0.5.23.dev4")
    assert compat.spelled_for_release(["--cuda-graph-max-bs=2"], "0.5.23") == ["--cuda-graph-max-bs-decode=2"]
    assert compat.spelled_for_release(["--cuda-graph-max-bs-prefill", "4"], "0.5.23") == [
        "--cuda-graph-max-bs-prefill",
        "4",
    ]


def test_flag_fields_reads_values_and_switches():
    assert compat.flag_fields(["--disable-overlap-schedule", "--cuda-graph-max-bs", "2", "--load-format", "dummy"]) == {
        "disable_overlap_schedule": True,
        "cuda_graph_max_bs": 2,
        "load_format": "dummy",
    }
