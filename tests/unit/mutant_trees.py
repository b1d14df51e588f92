"""Shared by the fault-injection tests (test_mutant_hook, test_catalogue, test_suites, test_mutants_cli):
toy source trees, the toy mutant and the hook's environment, fake sglang release forms, and the stand-in smoke
suite the runner and the scheduler are driven with."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from mtpmatrix.faults import mutants as M
from mtpmatrix.faults import mutation as F

REPO = Path(__file__).resolve().parents[2]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


TOY = {
    "toypkg/__init__.py": "",
    "toypkg/mod.py": """\
        VALUE = 1


        def where():
            raise RuntimeError("boom at VALUE=%d" % VALUE)
        """,
}


TOY_MUTANT = F.Mutant("value-two", "accounting", "VALUE 1 -> 2", (F.Site("toypkg.mod", "VALUE = 1\n", "VALUE = 2\n"),))


def payload_for(tmp_path: Path, mutant=TOY_MUTANT, pkg="toypkg") -> tuple[Path, Path]:
    site = write_tree(tmp_path / "site", TOY)
    app = F.apply(mutant, site / pkg)
    assert app.applicable and not app.error, app.reason()
    payload = tmp_path / "mutant.json"
    payload.write_text(json.dumps(F.hook_payload(app)))
    return site, payload


def py(code: str, env: dict, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def hook_env(*paths: Path, payload: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", F.ENV_MUTANT)}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (F.HOOK_DIR, *paths))
    if payload is not None:
        env[F.ENV_MUTANT] = str(payload)
    return env


FAKE = {
    "sglang/srt/speculative/worker_v2.py": """\
        def seed(h, n):
            return h[n - 1]
        """,
    "sglang/srt/speculative/twice.py": "x = 1\nx = 1\n",
}


# A stand-in for one smoke suite: a "server" process imports the toy module through the hook (its stderr is the
# server log, as for sglang), and a check fails when the module is not the unpatched one.
STUB = """\
import json, os, subprocess, sys, time
folder, name = sys.argv[1], sys.argv[2]
t0 = time.monotonic()  # one clock for every process of this machine: the spans compare across them
with open(os.path.join(folder, "server-w.log"), "w") as log:
    log.write("# mtpmatrix: ready after 0.1s\\n")
    log.flush()
    out = subprocess.run([sys.executable, "-c", "import toypkg.mod as m; print(m.VALUE)"], stdout=subprocess.PIPE,
                         stderr=log, text=True).stdout.strip()
time.sleep(float(os.environ.get("STUB_SLEEP", "0.3")))
with open(os.path.join(folder, "..", "spans.txt"), "a") as fh:
    fh.write(f"{name} {t0} {time.monotonic()}\\n")
fail = name == os.environ.get("STUB_FAIL") or out != "1"
rec = {"id": "tests/tiers/test_smoke.py::test_spec_metrics[w]", "tier": "smoke",
       "outcome": "failed" if fail else "passed", "seconds": 0.1, "metrics": {}}
if fail:
    rec["failure"] = {"kind": "acceptance", "message": f"accept length off (VALUE={out})"}
json.dump({"tiers": {"smoke": {"verdict": "failed" if fail else "passed", "checks": [rec]}}},
          open(os.path.join(folder, "tiers.json"), "w"))
"""


TOY_CAT = (
    F.Mutant(
        "value-two", "accounting", "VALUE 1 -> 2", (F.Site("toypkg.mod", "VALUE = 1\n", "VALUE = 2\n"),), servers=("w",)
    ),
    F.Mutant(
        "comment-only",
        "positions",
        "a comment: changes nothing observable",
        (F.Site("toypkg.mod", "def where():\n", "def where():  # mutated\n"),),
        servers=("w",),
    ),
    F.Mutant("elsewhere", "handoff", "absent here", (F.Site("toypkg.v1", "x", "y"),), servers=("w",)),
)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    M.add_arguments(p)
    return p.parse_args(argv)


def run_stub(tmp_path, stub_env, argv, **kw):
    pkg, command = stub_env
    lines: list[str] = []
    rc = M.run(
        parse(["--out", str(tmp_path / "out"), *argv]),
        M.StandIns(
            catalogue=TOY_CAT,
            pkg_dir=pkg,
            command=command,
            known_servers=["w"],
            gpu_check=False,
            cpus=6,
            poll=0.05,
            log=lines.append,
            **kw,
        ),
    )
    record = json.loads((tmp_path / "out" / "mutants.json").read_text())
    return rc, record, "\n".join(lines)


# The lines the decoy / sampled / metric-field mutants edit, in the shape each release has them (read from the
# installed 0.5.13, 0.5.17 and 0.5.23: eagle_info(_v2) vs eagle_utils verify, the v1 request counters of 0.5.13,
# 0.5.23's sampling_softmax), each in a module that compiles.
_SPU_TEXT = """\
    def later(flat_cs, topk, batch_offsets, hidden_states):
        selected_input_index = flat_cs // topk + batch_offsets.repeat_interleave(topk)
        return hidden_states[selected_input_index]
    """


_BRP_TEXT = """\
    def settle(req, num_correct_drafts):
        req.spec_verify_ct += 1
        req.spec_num_correct_drafts += num_correct_drafts
        req.update_spec_correct_drafts_histogram(num_correct_drafts)
    """


_V1_VERIFY = """\
    class EagleVerifyInput:
        def verify(self, bs, logits_output, sampling_info, req, num_correct_drafts_this_req):
            candidates = self.draft_token.reshape(bs, self.draft_token_num)
            if sampling_info.is_all_greedy:
                target_predict = torch.argmax(logits_output.next_token_logits, dim=-1)
                target_predict = target_predict.reshape(bs, self.draft_token_num)
            else:
                target_probs = F.softmax(
                    logits_output.next_token_logits / expanded_temperature, dim=-1
                )
                target_probs = top_k_renorm_prob(
                    target_probs, sampling_info.top_ks
                )
                if sampling_info.need_top_p_sampling:
                    target_probs = top_p_renorm_prob(
                        target_probs, sampling_info.top_ps
                    )
                tree_speculative_sampling_target_only(
                    target_probs=target_probs,
                    threshold_single=get_global_server_args().speculative_accept_threshold_single,
                    threshold_acc=get_global_server_args().speculative_accept_threshold_acc,
                )
            req.spec_num_correct_drafts += num_correct_drafts_this_req
    """


_V2_SAMPLE = """\
    def eagle_sample(verify_input, bs, next_token_logits, sampling_info, expanded_temperature):
        candidates = verify_input.draft_token.reshape(bs, verify_input.draft_token_num)
        if sampling_info.is_all_greedy:
            target_predict = torch.argmax(next_token_logits, dim=-1)
            target_predict = target_predict.reshape(bs, verify_input.draft_token_num)
        else:
            target_probs = SOFTMAX
            if sampling_info.need_top_k_sampling:
                target_probs = top_k_renorm_prob(
                    target_probs, sampling_info.top_ks
                )
            if sampling_info.need_top_p_sampling:
                target_probs = top_p_renorm_prob(
                    target_probs, sampling_info.top_ps
                )
            sampling_fn(
                target_probs=target_probs,
                threshold_single=get_spec().speculative_accept_threshold_single,
                threshold_acc=get_spec().speculative_accept_threshold_acc,
            )
    """


_SOFTMAX_0517 = "F.softmax(\n            next_token_logits / expanded_temperature, dim=-1\n        )"


_SOFTMAX_0523 = "sampling_softmax(\n            next_token_logits, temperatures=expanded_temperature\n        )"


_SPEC = "sglang/srt/speculative/"


_BRP_FILE = "sglang/srt/managers/scheduler_components/batch_result_processor.py"


RELEASE_FORMS = {
    "0.5.13": {
        _SPEC + "spec_utils.py": _SPU_TEXT,
        _BRP_FILE: _BRP_TEXT,
        _SPEC + "eagle_info.py": _V1_VERIFY,
        _SPEC + "eagle_info_v2.py": _V1_VERIFY.replace(
            "            req.spec_num_correct_drafts += num_correct_drafts_this_req\n", ""
        ),
    },
    "0.5.17": {
        _SPEC + "spec_utils.py": _SPU_TEXT,
        _BRP_FILE: _BRP_TEXT,
        _SPEC + "eagle_utils.py": _V2_SAMPLE.replace("SOFTMAX", _SOFTMAX_0517),
    },
    "0.5.23": {
        _SPEC + "spec_utils.py": _SPU_TEXT,
        _BRP_FILE: _BRP_TEXT,
        _SPEC + "eagle_utils.py": _V2_SAMPLE.replace("SOFTMAX", _SOFTMAX_0523),
    },
}


OFF_CHAIN = {  # mutant -> files it must patch in each release form (0.5.13 / 0.5.17 and 0.5.23)
    "topk-parent-non-first": ({"spec_utils.py"}, {"spec_utils.py"}),
    "verify-accept-all-greedy": ({"eagle_info.py", "eagle_info_v2.py"}, {"eagle_utils.py"}),
    "verify-temperature-ignored": ({"eagle_info.py", "eagle_info_v2.py"}, {"eagle_utils.py"}),
    "verify-renorm-skipped": ({"eagle_info.py", "eagle_info_v2.py"}, {"eagle_utils.py"}),
    "verify-accept-threshold": ({"eagle_info.py", "eagle_info_v2.py"}, {"eagle_utils.py"}),
    "metric-correct-drafts-bonus": ({"batch_result_processor.py", "eagle_info.py"}, {"batch_result_processor.py"}),
}


def make_stub_env(tmp_path, monkeypatch):
    """The toy site and the stand-in suite command (a test module's ``stub_env`` fixture)."""
    site = write_tree(tmp_path / "site", TOY)
    stub = tmp_path / "stub.py"
    stub.write_text(STUB)
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.delenv(F.ENV_MUTANT, raising=False)
    command = lambda suite: [sys.executable, str(stub), str(suite.folder), suite.name]  # noqa: E731
    return site / "toypkg", command
