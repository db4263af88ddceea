"""The LLM agent against a real HTTP chat-completions server (tests/support/llm_server.py) through the openai client.

The attention store is built from known programs (L0H0 = prev(1), L0H1 = first(), L0H2 = an even mix of
both) over word-tokenized story sentences, so the right answer per head is known independently of the
agent. Scripted replies cover good DSL and Python programs, malformed JSON, invalid/hostile, crashing and
looping programs, 429 with Retry-After, 500, replies slower than the client timeout, a cost cap, the
concurrency bound, and a run killed after its first head and resumed from its journal.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import TESTS
from headsurgeon.synth.search.llm import prompts  # noqa: E402
from headsurgeon.synth.search.llm import (AgentConfig, AgentConfigError, JournalMismatchError, LLMAgent,  # noqa: E402
                                          retry_after)
from headsurgeon.synth.program import Program  # noqa: E402
from support.agent_store import HEADS, RESUME_CONFIG, SELECT, SYNTH, build_store, config
from support.llm_server import Reply, ScriptedLLMServer, by_head

PY_FIRST = "def program(seq):\n    s = np.zeros((seq.n, seq.n))\n    s[:, 0] = 1.0\n    return s\n"
PY_CRASH = "def program(seq):\n    return 1 / 0\n"
PY_LOOP = "def program(seq):\n    while True:\n        pass\n"
PY_HOSTILE = "import os\ndef program(seq):\n    return os.listdir('/')\n"


# ------------------------------------------------------------------------------------------------
# fixtures and helpers (the store and the agent's settings: tests/support/agent_store.py)
# ------------------------------------------------------------------------------------------------

class SleepRecorder:
    """Records the backoff delays instead of sleeping (keeps tests fast and the delays checkable)."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, d: float) -> None:
        self.delays.append(d)


@pytest.fixture(scope="module")
def store():
    return build_store()


def soft_iou_ref(p: np.ndarray, q: np.ndarray) -> float:
    """Independent soft IoU of two causal n x n patterns: sum(min) / sum(max) over j <= i."""
    mask = np.tril(np.ones_like(p, dtype=bool))
    return float(np.minimum(p, q)[mask].sum() / np.maximum(p, q)[mask].sum())


def select_iou_ref(store, head, program: Program) -> float:
    vals = []
    for i in SELECT:
        real = store.pattern(i, *head)
        pred = program.evaluate([store.sequences[i]], causal=True)[0]
        vals.append(soft_iou_ref(real, pred))
    return float(np.mean(vals))


# ------------------------------------------------------------------------------------------------
# prompts and parsing (no server)
# ------------------------------------------------------------------------------------------------

def test_parse_reply_variants():
    r = prompts.parse_reply('Sure!\n```json\n{"hypothesis": "previous token", "program": "prev(1)"}\n```\nDone.')
    assert (r.kind, r.program, r.hypothesis) == ("dsl", "prev(1)", "previous token")
    r = prompts.parse_reply('I think {"hypothesis": "bos", "program": ' + json.dumps(PY_FIRST) + "} is it")
    assert r.kind == "python" and r.program == PY_FIRST
    r = prompts.parse_reply('{"hypothesis": "mix", "kind": "dsl", "program": {"mix": [[0.5, {"prev": 1}], [0.5, {"first": {}}]]}}')
    assert r.kind == "dsl" and isinstance(r.program, dict)
    assert Program.from_json(r.program) == Program.parse("0.5*prev(1) + 0.5*first()")
    for bad, why in [("no json here", "no JSON object"), ('{"hypothesis": "x"}', "no \"program\""),
                     ('{"program": "prev(1)"}', "no \"hypothesis\""), ('{"hypothesis": "x", "program": ""}', "empty"),
                     ('{"hypothesis": "x", "program": 3}', "must be a string"), ("", "empty")]:
        with pytest.raises(prompts.MalformedReply, match=why):
            prompts.parse_reply(bad)


def test_strongest_pairs_against_brute_force():
    rng = np.random.default_rng(0)
    n = 30
    pat = np.tril(rng.random((n, n)) ** 4)
    pat /= pat.sum(1, keepdims=True)
    pairs = prompts.strongest_pairs(pat, causal=True, frac=0.025, max_pairs=1000, mode="top")
    vis = [(i, j) for i in range(n) for j in range(i + 1)]
    q = math.ceil(0.025 * len(vis))
    assert len(pairs) == q
    chosen = {(i, j) for i, j, _ in pairs}
    weakest_chosen = min(w for _, _, w in pairs)
    assert all(pat[i, j] <= weakest_chosen for i, j in vis if (i, j) not in chosen)
    assert all(j <= i for i, j, _ in pairs)  # only visible cells
    assert len(prompts.strongest_pairs(pat, True, 0.025, max_pairs=5)) == 5
    strat = prompts.strongest_pairs(pat, causal=True, max_pairs=10, mode="stratified")
    weights = sorted(w for _, _, w in strat)
    vals = np.sort(pat[np.tril(np.ones((n, n), bool)) & (pat > 0)])
    assert len(strat) == 10 and weights[-1] == pytest.approx(vals[-1]) and weights[0] == pytest.approx(vals[0])


def test_prompts_show_dsl_api_and_pairs(store):
    sysp = prompts.system_prompt(True)
    for name in ("prev(k)", "induction()", "fallback(", "gate(", "seq.tokens", "seq.features.word_index", "hypothesis"):
        assert name in sysp
    for example in prompts.DSL_EXAMPLES:  # every example the prompt shows must be a valid program
        Program.parse(example)
    Program.python(prompts.PYTHON_EXAMPLE)
    seq = store.sequences[0]
    hp = prompts.head_prompt((0, 0), [(seq, store.pattern(0, 0, 0))], causal=True, frac=0.1)
    assert "L0H0" in hp
    # prev(1): each shown query's key is the token before it, quoted as in the sequence
    rows = re.findall(r'^  (\d+):("(?:[^"\\]|\\.)*") -> (\d+):("(?:[^"\\]|\\.)*") 1\.00$', hp, re.M)
    assert len(rows) >= 3
    for qi, qt, kj, kt in rows:
        assert int(kj) == max(int(qi) - 1, 0)  # query 0 has only BOS to attend to
        assert json.loads(qt) == seq.tokens[int(qi)] and json.loads(kt) == seq.tokens[int(kj)]


def test_retry_after_header_forms():
    class R:
        def __init__(self, h):
            self.headers = h
    assert retry_after(R({"retry-after": "1.5"}), 100) == 1.5
    assert retry_after(R({"retry-after-ms": "250", "retry-after": "9"}), 100) == 0.25
    assert retry_after(R({"retry-after": "500"}), 100) == 100
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 < retry_after(R({"retry-after": date}), 100) <= 31
    assert retry_after(R({}), 100) is None and retry_after(R({"retry-after": "soon"}), 100) is None


def test_config_from_environment(monkeypatch):
    monkeypatch.setenv("HEADSURGEON_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("HEADSURGEON_LLM_MODEL", "m1")
    monkeypatch.setenv("OPENAI_API_KEY", "k1")
    monkeypatch.delenv("HEADSURGEON_LLM_API_KEY", raising=False)
    cfg = AgentConfig()
    assert (cfg.base_url, cfg.model, cfg.api_key) == ("http://127.0.0.1:9/v1", "m1", "k1")
    assert "api_key" not in cfg.public() and "k1" not in repr(cfg)
    monkeypatch.delenv("HEADSURGEON_LLM_MODEL")
    with pytest.raises(AgentConfigError, match="HEADSURGEON_LLM_MODEL"):
        LLMAgent(AgentConfig())
    with pytest.raises(AgentConfigError, match="concurrency"):
        AgentConfig(concurrency=0)


# ------------------------------------------------------------------------------------------------
# against the server
# ------------------------------------------------------------------------------------------------

def test_right_program_wins_dsl_and_python(store):
    script = {
        "L0H0": [Reply.program("first()"), Reply.program("prev(1)", "attends to the previous token"),
                 Reply.program("uniform()")],
        "L0H1": [Reply.program("uniform()"), Reply.program(PY_FIRST, "always BOS", kind="python"),
                 Reply.program({"mix": [[0.5, {"prev": 1}], [0.5, {"first": {}}]]})],
    }
    with ScriptedLLMServer(by_head(script)) as srv:
        agent = LLMAgent(config(srv.base_url, concurrency=2, candidates_per_round=3))
        res = agent.search(store, [(0, 0), (0, 1)], SYNTH, SELECT)
        assert len(srv.requests) == 6  # both heads matched exactly in round 0: no refinement requests
        assert all(r.body["model"] == "scripted-model" for r in srv.requests)
        assert all(r.headers.get("authorization") == "Bearer test-key" for r in srv.requests)
    best0, best1 = res[(0, 0)][0], res[(0, 1)][0]
    assert best0.program == Program.parse("prev(1)") and best0.hypothesis == "attends to the previous token"
    assert best1.program.kind == "python" and best1.program == Program.python(PY_FIRST)
    for head, cands in res.items():
        assert len(cands) == 3 and all(c.source == "llm" for c in cands)  # filed under their head
        ious = [c.scores["select"]["iou"] for c in cands]
        assert ious == sorted(ious, reverse=True)
        for c in cands:  # select IoU is the mean soft IoU over the select split, computed independently
            assert c.scores["select"]["iou"] == pytest.approx(select_iou_ref(store, head, c.program), abs=2e-3)
            assert set(c.scores) == {"synth", "select"} and set(c.scores["synth"]) == {"jsd", "iou"}
    assert best0.scores["select"]["iou"] > 0.999 and best0.scores["synth"]["jsd"] < 1e-3
    assert res[(0, 0)][1].scores["select"]["iou"] < 0.9
    st = agent.stats
    assert (st.requests, st.retries, st.malformed, st.failed_programs) == (6, 0, 0, 0)
    assert st.heads["L0H0"].status == "done" and st.heads["L0H1"].status == "done"


def test_retries_on_429_500_timeout_and_giving_up(store):
    script = {
        "L0H0": [Reply.error(429, headers={"Retry-After": "0.25"}), Reply.error(500),
                 Reply.program("prev(1)", delay=1.5), Reply.program("prev(1)")],
        "L0H1": [Reply.error(503)] * 10,
    }
    sleeps = SleepRecorder()
    with ScriptedLLMServer(by_head(script)) as srv:
        agent = LLMAgent(config(srv.base_url, request_timeout=0.5, max_retries=3), sleep=sleeps)
        res = agent.search(store, [(0, 0), (0, 1)], SYNTH, SELECT)
        assert [r.reply.label for r in srv.requests_for("L0H0")] == ["http429", "http500", "program:prev(1)",
                                                                     "program:prev(1)"]
        assert srv.wait_idle()
        assert srv.requests_for("L0H0")[2].dropped  # the client timed out before the slow reply
        assert len(srv.requests_for("L0H1")) == 4  # 1 + max_retries, then the head gives up
    st = agent.stats
    assert st.retries == 6 and dict(st.retry_reasons) == {"429": 1, "5xx": 4, "timeout": 1}
    assert st.requests == 8 and st.failed_requests == 1
    # Retry-After honoured exactly; other delays are exponential backoff with jitter in [b, b*(1+jitter)]
    assert sleeps.delays[0] == pytest.approx(0.25)
    b0 = [d for d in sleeps.delays[1:]]
    for d in b0:
        assert 0.01 <= d <= 0.05 * 1.5
    assert res[(0, 0)][0].program == Program.parse("prev(1)")
    assert st.heads["L0H0"].status == "done"
    assert res[(0, 1)] == [] and st.heads["L0H1"].status == "error" and "gave up" in st.heads["L0H1"].error


def test_malformed_invalid_crash_and_timeout_programs(store):
    script = {"L0H0": [
        Reply(content="I believe this head looks back one token."),  # not JSON
        Reply(content='{"hypothesis": "previous token"}'),  # no program
        Reply.program(PY_HOSTILE, kind="python"),  # rejected by validation; the reply retries are used up
        Reply.program(PY_CRASH, kind="python"),  # valid, crashes in the sandbox
        Reply.program(PY_LOOP, kind="python"),  # valid, times out in the sandbox
        # round 1 (refinement)
        Reply.program("prev(1)"), Reply.program("uniform()"), Reply.program("sharpen(decay(0.5), 3)"),
    ]}
    with ScriptedLLMServer(by_head(script)) as srv:
        agent = LLMAgent(config(srv.base_url, candidates_per_round=3, max_reply_retries=2))
        res = agent.search(store, [(0, 0)], SYNTH, SELECT)
        reqs = srv.requests_for("L0H0")
    st = agent.stats
    assert st.malformed == 2 and st.invalid_programs == 1
    assert st.failed_programs == 2 and st.failure_reasons["crash"] == 1 and st.failure_reasons["timeout"] == 1
    assert st.heads["L0H0"].status == "done" and len(reqs) == 8
    # an unusable reply is answered in the same conversation with what was wrong
    follow = reqs[1].messages
    assert follow[-2] == {"role": "assistant", "content": "I believe this head looks back one token."}
    assert "could not be used" in follow[-1]["content"] and "no JSON object" in follow[-1]["content"]
    assert 'no "program" field' in reqs[2].messages[-1]["content"]
    # the failures (rejected, crashed, timed out) are fed back in the refinement prompt
    refine = reqs[5].last_user
    assert "Feedback" in refine and "These proposals failed" in refine
    assert "import of 'os' is not allowed" in refine and "ZeroDivisionError" in refine and "time limit" in refine
    assert res[(0, 0)][0].program == Program.parse("prev(1)")
    assert {c.program.kind for c in res[(0, 0)]} == {"dsl"}  # failed programs never become candidates


def test_refinement_feedback_and_token_accounting(store):
    script = {"L0H0": [Reply.program("first()", "BOS sink", prompt_tokens=1234, completion_tokens=56),
                       Reply.program("prev(1)", "previous token")]}
    with ScriptedLLMServer(by_head(script)) as srv:
        agent = LLMAgent(config(srv.base_url, rounds=2, price_prompt_per_1k=0.5, price_completion_per_1k=2.0))
        res = agent.search(store, [(0, 0)], SYNTH, SELECT)
        reqs = srv.requests_for("L0H0")
        pt, ct = srv.usage_totals()
    assert len(reqs) == 2  # prev(1) fits exactly: the third round is skipped
    first_prompt, refine = reqs[0].last_user, reqs[1].last_user
    assert "Feedback" not in first_prompt and "Feedback" in refine and "[dsl] first()" in refine
    # rows: real attention goes to the previous token, the proposal put it on BOS (token strings shown)
    rows = re.findall(r'query (\d+):("(?:[^"\\]|\\.)*")  real: (\d+):("(?:[^"\\]|\\.)*") [\d.]+  '
                      r'\| predicted: (\d+):("(?:[^"\\]|\\.)*")', refine)
    assert len(rows) >= 3
    synth_tokens = [store.sequences[i].tokens for i in SYNTH]
    for qi, qt, rj, rt, pj, pt_ in rows:
        qi, rj, pj = int(qi), int(rj), int(pj)
        assert rj == qi - 1 and pj == 0 and json.loads(pt_) == "<s>"
        assert any(len(t) > qi and t[qi] == json.loads(qt) and t[rj] == json.loads(rt) for t in synth_tokens)
    assert [c.program.text for c in res[(0, 0)]] == ["prev(1)", "first()"]
    st = agent.stats
    assert (st.prompt_tokens, st.completion_tokens) == (pt, ct) and pt > 1234 and ct > 56
    assert st.cost == pytest.approx(pt / 1000 * 0.5 + ct / 1000 * 2.0)


def test_cost_cap_stops_requests(store):
    def respond(req):
        return Reply.program("uniform()" if len(srv.requests) % 2 else "first()", prompt_tokens=1000,
                             completion_tokens=0)
    srv = ScriptedLLMServer(respond)
    with srv:
        agent = LLMAgent(config(srv.base_url, candidates_per_round=2, rounds=3, cost_cap=2.5,
                                price_prompt_per_1k=1.0))
        res = agent.search(store, [(0, 0), (0, 1)], SYNTH, SELECT)
        n = len(srv.requests)
    assert n == 3  # $1 each: requests start while spent < $2.50
    st = agent.stats
    assert st.cost == pytest.approx(3.0) and st.cost_capped and st.requests == 3
    assert st.heads["L0H0"].status == "cost_cap" and st.heads["L0H1"].status == "cost_cap"
    assert st.heads["L0H1"].requests == 0 and res[(0, 1)] == []
    assert len(res[(0, 0)]) >= 1  # what was found before the cap is still returned


def test_concurrency_bound(store):
    with ScriptedLLMServer(lambda req: Reply.program("prev(1)" if req.head == "L0H0" else "first()", delay=0.3)) as srv:
        agent = LLMAgent(config(srv.base_url, concurrency=2, candidates_per_round=3, rounds=0))
        agent.search(store, HEADS, SYNTH, SELECT)
        assert len(srv.requests) == 9
        assert srv.max_in_flight == 2
    assert agent.stats.max_in_flight == 2


def test_journal_mismatch_is_refused(store, tmp_path):
    journal = tmp_path / "j.jsonl"
    with ScriptedLLMServer(lambda req: Reply.program("prev(1)")) as srv:
        LLMAgent(config(srv.base_url, rounds=0)).search(store, [(0, 0)], SYNTH, SELECT, journal=journal)
        with pytest.raises(JournalMismatchError, match="other inputs"):
            LLMAgent(config(srv.base_url, rounds=0)).search(store, [(0, 0)], SYNTH, SELECT[:2], journal=journal)


# ------------------------------------------------------------------------------------------------
# kill and resume
# ------------------------------------------------------------------------------------------------

def resume_responder(block: threading.Event | None = None):
    """Deterministic replies as a function of the head and of whether the prompt is a refinement."""
    initial = {"L0H0": Reply.program("first()", "sink"), "L0H1": Reply.program(PY_FIRST, "bos", kind="python"),
               "L0H2": Reply.program("uniform()", "spread")}
    refined = {"L0H0": Reply.program("prev(1)", "previous"), "L0H1": Reply.program("first()", "bos"),
               "L0H2": Reply.program("0.5*prev(1) + 0.5*first()", "half and half")}

    def respond(req):
        reply = (refined if "Feedback" in req.last_user else initial)[req.head]
        if block is not None and req.head != "L0H0":
            return Reply(content=reply.content, wait=block, label="blocked")
        return reply
    return respond


CHILD = """
import sys
sys.path.insert(0, {tests!r})
from support.agent_store import build_store, config, SYNTH, SELECT, HEADS, RESUME_CONFIG
from headsurgeon.synth.search.llm import LLMAgent
LLMAgent(config({url!r}, **RESUME_CONFIG)).search(build_store(), HEADS, SYNTH, SELECT, journal={journal!r})
print("FINISHED")
"""


def _key(res):
    return {h: [(c.program.hash, c.hypothesis, c.scores) for c in cs] for h, cs in res.items()}


def test_kill_and_resume(store, tmp_path):
    # reference: one uninterrupted run
    with ScriptedLLMServer(resume_responder()) as srv:
        ref = LLMAgent(config(srv.base_url, **RESUME_CONFIG)).search(store, HEADS, SYNTH, SELECT,
                                                                     journal=tmp_path / "ref.jsonl")
    assert ref[(0, 0)][0].program == Program.parse("prev(1)")
    assert ref[(0, 2)][0].program == Program.parse("0.5*prev(1) + 0.5*first()")

    # a run in a subprocess, killed while the server holds its first request about the second head
    journal = tmp_path / "run.jsonl"
    release = threading.Event()
    with ScriptedLLMServer(resume_responder(block=release)) as srv:
        code = CHILD.format(tests=str(TESTS), url=srv.base_url, journal=str(journal))
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.monotonic() + 120
            while not srv.requests_for("L0H1") and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            assert srv.requests_for("L0H1"), f"the child never reached head L0H1: {proc.communicate()[1][-3000:]!r}"
            proc.kill()
            out, _ = proc.communicate(timeout=30)
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert b"FINISHED" not in out
        assert [r.head for r in srv.requests] == ["L0H0", "L0H0", "L0H1"]
    events = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    heads_done = [e["name"] for e in events if e["event"] == "head"]
    assert heads_done == ["L0H0"]
    assert sum(1 for e in events if e["event"] == "request" and e["status"] == "ok") == 2

    # resume: the finished head is restored from the journal, never asked again
    with ScriptedLLMServer(resume_responder()) as srv:
        agent = LLMAgent(config(srv.base_url, **RESUME_CONFIG))
        res = agent.search(store, HEADS, SYNTH, SELECT, journal=journal)
        asked = {r.head for r in srv.requests}
    assert "L0H0" not in asked and asked == {"L0H1", "L0H2"}
    assert agent.stats.resumed_heads == 1 and agent.stats.heads["L0H0"].status == "resumed"
    assert agent.stats.journal_prompt_tokens > 0  # the killed run's spend is known to the cost cap
    assert _key(res) == _key(ref)

    # a third run on the same journal has nothing left to ask
    with ScriptedLLMServer(resume_responder()) as srv:
        res3 = LLMAgent(config(srv.base_url, **RESUME_CONFIG)).search(store, HEADS, SYNTH, SELECT, journal=journal)
        assert srv.requests == []
    assert _key(res3) == _key(ref)


def dead_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_check_endpoint_fails_fast_on_a_dead_port_and_passes_a_live_server(tmp_path):
    from headsurgeon.pipeline import explain
    from headsurgeon.synth.search.llm import EndpointError, check_endpoint

    dead = f"http://127.0.0.1:{dead_port()}/v1"
    with pytest.raises(EndpointError, match=re.escape(dead) + r".*does not answer.*HEADSURGEON_LLM_BASE_URL"):
        check_endpoint(config(dead))
    with ScriptedLLMServer(by_head({})) as srv:  # a real HTTP server; its GET /models is a 404: alive
        check_endpoint(config(srv.base_url))
        assert not srv.requests  # the check sent no chat request
    check_endpoint(AgentConfig(base_url=None, api_key=None, model=None))  # nothing configured: the agent is skipped
    with pytest.raises(EndpointError, match="does not answer"):  # explain stops before loading or capturing
        explain("tiny-stories", None, tmp_path / "out", searchers=("llm",), agent_config=config(dead),
                progress=False)
    assert not (tmp_path / "out" / "store").exists()
