"""The failure kinds, defined once: what a check's failure says broke. The tiers raise ``CheckFailure(kind, ...)``
and classify what they catch into these words (mtpmatrix.core.failures), ``@pytest.mark.check(kind)`` declares one,
a known-upstream entry names the one its bug produces, and the report and bisect read them back.
"""

from __future__ import annotations

KINDS = (
    "install",  # the resolver refused the row (conflict, missing wheel, unreachable index)
    "import",  # a module of the MTP path does not import
    "abi",  # a native extension needs torch symbols / libraries / a CUDA major the installed torch does not provide
    "config",  # a config does not load or resolves to the wrong values
    "args",  # ServerArgs resolution broke or resolved to the wrong algorithm/values
    "weights",  # building the model classes or loading weights failed
    "launch",  # the server did not become ready
    "crash",  # the server died or errored while serving
    "mismatch",  # outputs with MTP differ from outputs without it
    "accuracy",  # GSM8K score under threshold
    "acceptance",  # accept length under threshold or absent
    "accounting",  # speculative metric fields disagree with each other, the tokens served or /server_info
    # this project: an exception raised in its own code, or a check that could not set up what it must exercise.
    # Decided for "never batched N requests" (test_topk_batch_served_together): harness, not a kind of its own.
    # sglang promises no batch shape; the tier's own experiment did not happen, and a run whose only failures are
    # harness is what bisect and the mutant runner already read as untestable (a new kind would read as a break).
    "harness",
)


class CheckFailure(AssertionError):
    """Raised by tier checks that know what kind of failure they found."""

    def __init__(self, kind: str, message: str):
        if kind not in KINDS:
            raise ValueError(f"unknown failure kind {kind!r}")
        super().__init__(message)
        self.kind = kind
