"""The request surface: request families real users send, each through the live MTP path of the smoke servers.

The smoke tier's own requests are greedy with ``ignore_eos`` (and the sampled pair's plan); a family adds requests
that ask for what those never do (stops and EOS inside an accepted run, logprobs, sampling features, mixed
sampling parameters, seeds). Each family is a module of this package with

    NAME: str                                   the family's name, the key of SmokeRun.surface
    def requests(spec, vocab_size) -> list[tuple[str, dict | client.Call]]
                                                (label, /generate payload) for the server ``spec`` (a
                                                smoke_servers.SmokeServerSpec); [] where the family does not apply;
                                                a client.Call for another endpoint (OpenAI-compatible), a streamed
                                                answer or a list answer (``n`` > 1)

and is listed in FAMILIES. The smoke tier sends every family's requests in the same batch as its own (so request
kinds are in flight together), and the checks read them back with ``SmokeRun.exchanges(NAME)``. A family may also
name labels in

    ALONE: frozenset[str]                       requests whose answer on an intact server depends on which other
                                                requests' batches run beside them: sent after that batch, one at
                                                a time with nothing else in flight (``split_alone``)

so that the MTP and no-MTP servers answer them on the same schedule and the comparison sees MTP, not timing. And a
family may say

    LAST: bool                                  its requests can kill a release's server (a measured crash, named
                                                where the family sets it): all of them are sent in a batch of their
                                                own after every other request and after the tier's own last read of
                                                the server (/server_info), so a crash costs only this family's
                                                checks (``split_last``); its
    LAST_FIRST: frozenset[str]                  labels go first, in a batch of their own, the rest after it
                                                (``last_batches``): what the crash needs is then told apart from
                                                what it does not
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from mtpmatrix.core.kinds import CheckFailure

# module names under mtpmatrix.tiers.surface, in the order their requests are sent
FAMILIES: tuple[str, ...] = (
    "stops",
    "logprobs",
    "features",
    "mixed_sampling",
    "bonus",
    # the request shapes applications send besides plain /generate (issue #38 item 3)
    "structured",
    "hidden_states",
    "stop_regex",
    "token_ids_logprob",
    "streaming",
    "parallel_n",
    # the long-and-tight servers: chunked prompts past the window, radix hits, the context limit, an abort (#38 item 2)
    "long_context",
)


@dataclass(frozen=True)
class Exchange:
    """One request of a family and what came back: the response ({} when the request failed) or the error."""

    label: str
    payload: dict
    response: dict
    error: str | None = None

    @property
    def output_ids(self) -> list[int]:
        return list(self.response.get("output_ids") or [])

    @property
    def meta(self) -> dict:
        return self.response.get("meta_info") or {}

    @property
    def metas(self) -> list[dict]:
        """The meta_info of every answer this request got: one, one per sample (``n`` > 1), none (an OpenAI
        endpoint's answer carries no meta_info)."""
        if "outputs" in self.response:
            return [o.get("meta_info") or {} for o in self.response["outputs"] if isinstance(o, dict)]
        return [self.meta] if "meta_info" in self.response else []

    @property
    def sampling_params(self) -> dict:
        body = getattr(self.payload, "body", self.payload)
        return body.get("sampling_params") or {k: v for k, v in body.items() if k not in ("prompt", "messages")}


def families():
    return [importlib.import_module(f"{__name__}.{name}") for name in FAMILIES]


def requests_for(spec, vocab_size: int) -> list[tuple[str, str, dict]]:
    """(family, label, payload) of every family's requests for the server ``spec``."""
    out = []
    for family in families():
        out += [(family.NAME, label, payload) for label, payload in family.requests(spec, vocab_size)]
    return out


def split_last(labelled: list[tuple[str, str, dict]]) -> tuple[list, list]:
    """(rest, last): ``requests_for``'s requests split by whether their family is LAST, each part in order."""
    last = {family.NAME for family in families() if getattr(family, "LAST", False)}
    return [x for x in labelled if x[0] not in last], [x for x in labelled if x[0] in last]


def last_batches(last: list[tuple[str, str, dict]]) -> list[list[tuple[str, str, dict]]]:
    """``split_last``'s LAST requests as the batches they are sent in, in order: per family, its LAST_FIRST labels,
    then the rest (empty batches left out)."""
    first = {family.NAME: getattr(family, "LAST_FIRST", frozenset()) for family in families()}
    out = []
    for name in dict.fromkeys(f for f, _l, _p in last):
        mine = [x for x in last if x[0] == name]
        out += [
            b for b in ([x for x in mine if x[1] in first[name]], [x for x in mine if x[1] not in first[name]]) if b
        ]
    return out


def split_alone(labelled: list[tuple[str, str, dict]]) -> tuple[list, list]:
    """(shared, alone): ``requests_for``'s requests split by their families' ALONE labels, each part in order."""
    alone = {family.NAME: getattr(family, "ALONE", frozenset()) for family in families()}
    shared = [x for x in labelled if x[1] not in alone[x[0]]]
    return shared, [x for x in labelled if x[1] in alone[x[0]]]


def collate(labelled: list[tuple[str, str, dict]], results: list) -> dict[str, list[Exchange]]:
    """The results (client.Result, same order) of ``requests_for``'s requests, by family."""
    out: dict[str, list[Exchange]] = {}
    for (family, label, payload), result in zip(labelled, results, strict=True):
        out.setdefault(family, []).append(Exchange(label, payload, result.response or {}, result.error))
    return out


def both_answered(exchanges: list[Exchange], reference: list[Exchange]):
    """(exchange, the reference's exchange of the same label) wherever both answered: what an MTP-equals-no-MTP check
    compares (a failed request is the family's own checks' finding; one the reference did not answer,
    ``reference_gaps``')."""
    ref = {x.label: x for x in reference}
    for x in exchanges:
        r = ref.get(x.label)
        if not x.error and r is not None and not r.error:
            yield x, r


def reference_gaps(exchanges: list[Exchange], reference: list[Exchange]) -> list[str]:
    """A problem for each request answered here that the no-MTP reference did not answer (failed, or not sent): an
    MTP-equals-no-MTP check that compared nothing for it must not pass."""
    ref = {x.label: x for x in reference}
    out = []
    for x in exchanges:
        r = ref.get(x.label)
        if not x.error and (r is None or r.error):
            why = r.error if r is not None else "not sent"
            out.append(f"{x.label}: the no-MTP reference has no answer ({why}): nothing to compare it with")
    return out


def answered(run, family: str, planned: int, labels=None) -> list[Exchange]:
    """The family's exchanges on ``run`` (those of ``labels`` only, when given), every one answered: "harness" when
    the tier collected another number than it planned, "crash" (with the first failed request's parameters) when a
    request failed."""
    exchanges = run.exchanges(family)
    if len(exchanges) != planned:
        raise CheckFailure("harness", f"{len(exchanges)} {family} exchanges for {planned} planned requests")
    if labels is not None:
        exchanges = [x for x in exchanges if x.label in labels]
        if len(exchanges) != len(labels):
            raise CheckFailure("harness", f"{len(exchanges)} {family} exchanges for the {len(labels)} labels asked")
    failed = [x for x in exchanges if x.error]
    if failed:
        raise CheckFailure(
            "crash",
            f"{len(failed)}/{len(exchanges)} {family} requests failed; first "
            f"{failed[0].label} {failed[0].sampling_params}: {failed[0].error}",
        )
    return exchanges
