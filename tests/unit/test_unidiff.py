"""unidiff.py: a unified diff of sglang read, its paths mapped to the package, applied in memory; a hunk that does not
apply is named with its file and hunk."""

from __future__ import annotations

import pytest

from mtpmatrix.core import unidiff

SOURCE = "".join(f"line {i}\n" for i in range(1, 21))
PATCH = """Fix two lines.

Draft-Phase: +1

diff --git a/python/sglang/srt/x.py b/python/sglang/srt/x.py
index 1111111..2222222 100644
--- a/python/sglang/srt/x.py
+++ b/python/sglang/srt/x.py
@@ -2,3 +2,3 @@ def f():
 line 2
-line 3
+line three
 line 4
@@ -15,3 +15,4 @@ def g():
 line 15
 line 16
+line 16b
 line 17
"""


def only(text: str) -> unidiff.FilePatch:
    (fp,) = unidiff.parse(text)
    return fp


def test_applies_every_hunk():
    fp = only(PATCH)
    assert (fp.path, fp.kind, fp.module, len(fp.hunks)) == ("sglang/srt/x.py", "modify", "sglang.srt.x", 2)
    out = unidiff.apply(fp, SOURCE).splitlines()
    assert out[2] == "line three" and out[16] == "line 16b" and len(out) == 21


def test_a_hunk_moved_by_whole_lines_still_applies():
    moved = "".join(f"new {i}\n" for i in range(6)) + SOURCE  # the file grew 6 lines above both hunks
    out = unidiff.apply(only(PATCH), moved).splitlines()
    assert out[8] == "line three" and out[22] == "line 16b"


def test_a_mismatching_hunk_names_the_file_the_hunk_and_the_line():
    changed = SOURCE.replace("line 16\n", "line sixteen\n")
    with pytest.raises(unidiff.PatchError) as info:
        unidiff.apply(only(PATCH), changed)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("sglang/srt/x.py: hunk 2 (@@ -15,3 +15,4 @@ def g():) does not apply: ")
    assert "line 16 is 'line sixteen', the hunk expects 'line 16'" in msg


def test_an_applied_patch_says_so():
    fp = only(PATCH)
    with pytest.raises(unidiff.PatchError, match="hunk 1 .* its result is there already"):
        unidiff.apply(fp, unidiff.apply(fp, SOURCE))


@pytest.mark.parametrize(
    "old, new",
    [
        ("a/python/sglang/srt/x.py", "b/python/sglang/srt/x.py"),  # git diff in sglang's repository
        ("python/sglang/srt/x.py", "python/sglang/srt/x.py"),  # git diff --no-prefix
        ("a/sglang/srt/x.py", "b/sglang/srt/x.py"),  # relative to site-packages (the mutants' patch.diff)
        ("sglang/srt/x.py\t2026-12-01 10:00:00", "sglang/srt/x.py\t2026-12-02 10:00:00"),  # diff -u, timestamps
    ],
)
def test_path_forms_name_the_same_package_file(old, new):
    assert (
        only(
            PATCH.replace("a/python/sglang/srt/x.py\n", old + "\n", 1).replace(
                "b/python/sglang/srt/x.py\n", new + "\n", 1
            )
        ).path
        == "sglang/srt/x.py"
    )


@pytest.mark.parametrize("path", ["a/srt/x.py", "b/python/other/x.py", "sglang/../etc/passwd", "x.py"])
def test_other_paths_are_refused(path):
    with pytest.raises(unidiff.PatchError, match="not a file of sglang"):
        unidiff.package_path(path)


def test_created_and_deleted_files():
    create = "--- /dev/null\n+++ b/sglang/srt/new.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n"
    fp = only(create)
    assert fp.kind == "create" and unidiff.apply(fp, None) == "a = 1\nb = 2\n"
    with pytest.raises(unidiff.PatchError, match="creates it, but it exists"):
        unidiff.apply(fp, "x\n")
    delete = "--- a/sglang/srt/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a = 1\n-b = 2\n"
    assert unidiff.apply(only(delete), "a = 1\nb = 2\n") is None
    with pytest.raises(unidiff.PatchError, match="no such file"):
        unidiff.apply(only(PATCH), None)


def test_no_newline_at_end_of_file():
    text = "--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1 +1 @@\n-old\n\\ No newline at end of file\n+new\n"
    assert unidiff.apply(only(text), "old") == "new\n"


@pytest.mark.parametrize(
    "text, words",
    [
        ("just prose\n", "no file diffs"),
        ("--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1,2 +1,2 @@\n-old\n", "ends early"),
        ("--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ bad @@\n", "malformed header"),
        ("--- a/sglang/x.py\n+++ b/sglang/y.py\n@@ -1 +1 @@\n-a\n+b\n", "renames are not supported"),
        ("diff --git a/sglang/x.so b/sglang/x.so\nGIT binary patch\nliteral 1\n", "binary patches"),
        (PATCH + PATCH.split("\n\n", 2)[2], "appears twice"),
    ],
)
def test_malformed_patches_are_one_line(text, words):
    with pytest.raises(unidiff.PatchError, match=words) as info:
        unidiff.parse(text)
    assert "\n" not in str(info.value)


def test_trailers_come_from_the_header_only():
    assert unidiff.trailers(PATCH) == {"Draft-Phase": "+1"}
    # a later commit's header (a format-patch series) is no declaration of this patch's
    assert unidiff.trailers(PATCH + "\nDraft-Phase: -1\n") == {"Draft-Phase": "+1"}
    assert unidiff.trailers(PATCH.replace("Draft-Phase: +1\n", "")) == {}
