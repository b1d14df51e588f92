"""environment.py's nvidia-smi parsing (free memory per visible GPU)."""

from __future__ import annotations

import pytest

from mtpmatrix.serving.environment import least_free_mib

SMI = "0, 142000\n1, 97000\n2, 143100\n"


@pytest.mark.parametrize(
    "visible,want",
    [
        (None, 97000),
        ("", 97000),
        ("0", 142000),
        ("0,2", 142000),
        ("2, 1", 97000),
        ("7", None),
        ("GPU-3f2a", None),
        ("MIG-1/2/0", None),
    ],
)
def test_least_free_mib_honours_visible_devices(visible, want):
    assert least_free_mib(SMI, visible) == want


def test_least_free_mib_ignores_unparseable_rows():
    assert least_free_mib("0, [N/A]\n1, 5000\n", None) == 5000
    assert least_free_mib("", None) is None
