"""The LLM agent against hostile endpoints and programs that try to leak data through their failures.

A real HTTP server on 127.0.0.1 (tests/support/llm_server.py) records every request body, so "never reaches the
endpoint" is checked on what was actually sent. Covered: failure feedback that never echoes text a program
produced (exception messages, tracebacks, computed values), a total deadline per request against an
endpoint that drips one byte every 0.5 s, responses that are huge, compressed or deeply nested, redirects
to another server, a reply proposing a 10 MB program, and negative token usage.
"""
from __future__ import annotations

import gzip
import json
import time
import tracemalloc

import pytest

from headsurgeon.synth.search.llm import prompts  # noqa: E402
from headsurgeon.synth.search.llm import LLMAgent  # noqa: E402
from headsurgeon.synth.errors import ProgramExecutionError, ProgramValidationError  # noqa: E402
from headsurgeon.synth.program import Program  # noqa: E402
from support.agent_store import SELECT, SYNTH, TEXTS, build_store, config
from support.llm_server import Reply, ScriptedLLMServer, by_head

SECRET = "TOPSEKRIT4711"  # built at run time by the programs below; never written in their source
MAKE_SECRET = "'TOP' + 'SEKRIT' + str(47 * 100 + 11)"
PY_RAISE_SECRET = f"def program(seq):\n    secret = {MAKE_SECRET}\n    raise ValueError(secret + ' ' + seq.text)\n"
PY_KEYERROR_SECRET = f"def program(seq):\n    d = {{}}\n    return d[{MAKE_SECRET}]\n"
PY_SHAPE_SECRET = "def program(seq):\n    return np.zeros((len(seq.text) * 1000 + 7, 2))\n"
MB = 2**20


@pytest.fixture(scope="module")
def store():
    return build_store()


def sent_text(srv: ScriptedLLMServer) -> str:
    """Every request body the server received, as one string."""
    return "\n".join(json.dumps(r.body, ensure_ascii=False) for r in srv.requests)


# ------------------------------------------------------------------------------------------------
# failure feedback (no server)
# ------------------------------------------------------------------------------------------------

def test_failure_feedback_keeps_only_type_line_and_library_text():
    program = "def program(seq):\n    x = 1\n    raise ValueError(s)\n"
    crash = ProgramExecutionError(f"sequence 0: the program raised ValueError: {SECRET} (at line 3: raise ValueError(s))",
                                  "crash", f"Traceback ...\n{SECRET}")
    assert prompts.failure_feedback(crash, program) == "the program raised ValueError (at line 3)"
    # a type name that is not a known exception type, or a line outside the program, is not shown
    spoof = ProgramExecutionError(f"sequence 0: the program raised {SECRET}: x (at line 99)", "crash")
    assert prompts.failure_feedback(spoof, program) == "the program raised an exception"
    assert prompts.safe_type_name(SECRET, known_only=True) is None and prompts.safe_type_name("LinAlgError", True) == "LinAlgError"
    assert prompts.safe_type_name("Bad-Name<>") is None and prompts.safe_type_name("x" * 41) is None
    timeout = ProgramExecutionError(f"sequence 1: the program exceeded its 5 s time limit (interrupted at line 2: {SECRET})",
                                    "timeout")
    assert prompts.failure_feedback(timeout, program) == "the program exceeded its time limit (at line 2)"
    shape = ProgramExecutionError("sequence 0: the return value has shape (13007, 2); expected (5, 5)", "bad_output")
    assert "13007" not in prompts.failure_feedback(shape, program) and "shape" in prompts.failure_feedback(shape, program)
    memory = ProgramExecutionError(f"sequence 0: the program ran out of memory: MemoryError: {SECRET}", "memory")
    assert SECRET not in prompts.failure_feedback(memory, program)
    weird = ProgramExecutionError(f"sequence 0: {SECRET}", "no-such-reason")
    assert prompts.failure_feedback(weird, program) == "the program raised an exception"
    # a library error outside the program's run shows its type only (it may carry local paths)
    assert prompts.failure_feedback(OSError(f"/home/user/{SECRET}")) == "OSError (details withheld)"
    # library-written validation messages are kept, cut to MAX_FEEDBACK_CHARS
    long = prompts.failure_feedback(ProgramValidationError("import of 'os' is not allowed " + "x" * 1000))
    assert long.startswith("import of 'os' is not allowed") and len(long) == prompts.MAX_FEEDBACK_CHARS


def test_parse_reply_refuses_huge_and_deeply_nested_replies():
    with pytest.raises(prompts.MalformedReply, match="characters long"):
        prompts.parse_reply('{"hypothesis": "x", "program": "' + "a" * (prompts.MAX_REPLY_CHARS + 1) + '"}')
    with pytest.raises(prompts.MalformedReply, match="program is .* characters long"):
        prompts.parse_reply(json.dumps({"hypothesis": "x", "program": "p" * (prompts.MAX_PROGRAM_CHARS + 1)}))
    for nested in ("[" * 100_000, "{" * 100_000, '{"hypothesis": "x", "program": ' + "[" * 50_000 + "]" * 50_000 + "}"):
        with pytest.raises(prompts.MalformedReply):
            prompts.parse_reply(nested)
    t0 = time.monotonic()
    with pytest.raises(prompts.MalformedReply):
        prompts.parse_reply('{"a": [' * 20_000)  # many candidate starts: only the first few are tried
    assert time.monotonic() - t0 < 5


# ------------------------------------------------------------------------------------------------
# leaks through failures
# ------------------------------------------------------------------------------------------------

def test_program_failures_never_send_program_text_to_the_endpoint(store):
    script = {"L0H0": [Reply.program(PY_RAISE_SECRET, kind="python"), Reply.program(PY_KEYERROR_SECRET, kind="python"),
                       Reply.program(PY_SHAPE_SECRET, kind="python"), Reply.program("prev(1)"),
                       Reply.program("first()"), Reply.program("uniform()")]}
    with ScriptedLLMServer(by_head(script)) as srv:
        agent = LLMAgent(config(srv.base_url, rounds=1, candidates_per_round=3))
        res = agent.search(store, [(0, 0)], SYNTH, SELECT)
        reqs = srv.requests_for("L0H0")
        sent = sent_text(srv)
    st = agent.stats
    assert st.failed_programs == 3 and st.failure_reasons["crash"] == 2 and st.failure_reasons["bad_output"] == 1
    assert len(reqs) == 6 and res[(0, 0)][0].program == Program.parse("prev(1)")
    refine = reqs[3].last_user
    assert "These proposals failed" in refine
    assert "the program raised ValueError (at line 3)" in refine and "the program raised KeyError (at line 3)" in refine
    assert "wrong shape" in refine
    assert SECRET not in sent and "Traceback" not in sent
    for i in SYNTH:  # the texts the programs put into their errors and shapes
        assert TEXTS[i] not in sent and f"{len(TEXTS[i]) * 1000 + 7}" not in sent


# ------------------------------------------------------------------------------------------------
# hostile endpoints
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("drip_headers", [False, True], ids=["body", "headers"])
def test_dripping_endpoint_hits_the_total_deadline(store, tmp_path, drip_headers):
    reply = Reply.program("prev(1)", drip=0.5, drip_headers=drip_headers)
    with ScriptedLLMServer(lambda req: reply) as srv:
        agent = LLMAgent(config(srv.base_url, request_timeout=2.0, max_retries=1, rounds=0))
        t0 = time.monotonic()
        res = agent.search(store, [(0, 0)], SYNTH, SELECT, journal=tmp_path / "j.jsonl")
        elapsed = time.monotonic() - t0
        assert srv.wait_idle(10.0)  # the dripping handlers stopped: the client hung up on them
        assert len(srv.requests) == 2 and all(r.dropped for r in srv.requests)
    assert elapsed < 8.0, f"search took {elapsed:.1f} s for 2 requests with a 2 s deadline"
    st = agent.stats
    assert dict(st.retry_reasons) == {"timeout": 1} and st.failed_requests == 1
    hs = st.heads["L0H0"]
    assert res[(0, 0)] == [] and hs.status == "error"
    assert "timeout" in hs.error and "request_timeout=2 s" in hs.error
    events = [json.loads(line) for line in (tmp_path / "j.jsonl").read_text().splitlines()]
    failed = [e for e in events if e.get("event") == "request" and e.get("status") == "failed"]
    assert len(failed) == 1 and failed[0]["reason"] == "timeout" and failed[0]["latency"] < 3.5


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_huge_response_is_refused_while_streaming(store, chunked):
    reply = Reply.stream(b"x" * 65536, 800, chunked=chunked)  # 50 MiB
    with ScriptedLLMServer(lambda req: reply) as srv:
        agent = LLMAgent(config(srv.base_url, max_retries=2, rounds=0))
        tracemalloc.start()
        try:
            t0 = time.monotonic()
            res = agent.search(store, [(0, 0)], SYNTH, SELECT)
            elapsed = time.monotonic() - t0
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert srv.wait_idle(10.0)
        assert len(srv.requests) == 1  # refused, not retried
        assert srv.requests[0].sent_bytes < 40 * MB
    hs = agent.stats.heads["L0H0"]
    assert res[(0, 0)] == [] and hs.status == "error" and "max_response_bytes" in hs.error
    assert peak < 40 * MB, f"peak traced memory {peak / MB:.1f} MiB"
    assert elapsed < 20


def test_compressed_response_is_refused(store):
    body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "prev(1)"},
                                    "finish_reason": "stop"}]}).encode()
    reply = Reply(raw=gzip.compress(body), headers={"Content-Encoding": "gzip"})
    with ScriptedLLMServer(lambda req: reply) as srv:
        agent = LLMAgent(config(srv.base_url, rounds=0))
        agent.search(store, [(0, 0)], SYNTH, SELECT)
        assert srv.requests[0].headers.get("accept-encoding") == "identity"
        assert len(srv.requests) == 1
    hs = agent.stats.heads["L0H0"]
    assert hs.status == "error" and "compressed" in hs.error


def test_deeply_nested_json_never_raises_recursion_error(store):
    nested_body = Reply(raw=b"[" * 200_000 + b"]" * 200_000)
    script = {
        "L0H0": [Reply(content="[" * 100_000), Reply(content='{"hypothesis": "x", "program": ' + "{" * 50_000 + "}"),
                 Reply.program("prev(1)")],
        "L0H1": [nested_body, nested_body],
    }
    deep_dsl = '{"sharpen": [' * 450 + '{"first": {}}' + ", 2]}" * 450  # 900 levels: decodable, too deep
    script["L0H2"] = [Reply(content='{"hypothesis": "deep", "kind": "dsl", "program": ' + deep_dsl + "}"),
                      Reply.program("first()")]
    with ScriptedLLMServer(by_head(script)) as srv:
        agent = LLMAgent(config(srv.base_url, rounds=0, max_retries=1, max_reply_retries=2))
        res = agent.search(store, [(0, 0), (0, 1), (0, 2)], SYNTH, SELECT)
    st = agent.stats
    assert res[(0, 0)][0].program == Program.parse("prev(1)") and st.malformed == 2
    assert st.heads["L0H1"].status == "error" and "unreadable response" in st.heads["L0H1"].error
    assert st.retry_reasons["bad_response"] == 1
    assert st.heads["L0H2"].status == "done" and res[(0, 2)][0].program == Program.parse("first()")
    assert all("Traceback" not in h.error for h in st.heads.values())


def test_ten_megabyte_program_is_refused_with_a_short_message(store):
    huge = "def program(seq):\n    return np.zeros((seq.n, seq.n))\n" + "#" * (10 * MB) + "\n"
    script = {"L0H0": [Reply.program(huge, kind="python"), Reply.program("prev(1)")]}
    with ScriptedLLMServer(by_head(script)) as srv:
        agent = LLMAgent(config(srv.base_url, rounds=0))
        res = agent.search(store, [(0, 0)], SYNTH, SELECT)
        follow = srv.requests[1]
    assert agent.stats.malformed == 1 and res[(0, 0)][0].program == Program.parse("prev(1)")
    retry = follow.messages[-1]["content"]
    assert "characters long" in retry and len(retry) < 1000
    assert len(json.dumps(follow.body)) < 200_000  # the 10 MB reply is not sent back


def test_negative_or_garbage_usage_cannot_lower_the_cost(store):
    script = {"L0H0": [Reply.program("first()", prompt_tokens=-10**9, completion_tokens=-5),
                       Reply.program("prev(1)", prompt_tokens=10, completion_tokens=0)]}
    with ScriptedLLMServer(by_head(script)) as srv:
        agent = LLMAgent(config(srv.base_url, rounds=1, price_prompt_per_1k=1.0, price_completion_per_1k=1.0))
        agent.search(store, [(0, 0)], SYNTH, SELECT)
    st = agent.stats
    assert (st.prompt_tokens, st.completion_tokens) == (10, 0) and st.cost == pytest.approx(0.01)


def test_redirects_are_not_followed(store):
    with ScriptedLLMServer(lambda req: Reply.program("prev(1)")) as elsewhere:
        redirect = Reply.error(307, headers={"Location": elsewhere.base_url + "/chat/completions"})
        with ScriptedLLMServer(lambda req: redirect) as srv:
            agent = LLMAgent(config(srv.base_url, rounds=0))
            res = agent.search(store, [(0, 0)], SYNTH, SELECT)
            assert len(srv.requests) == 1
        assert elsewhere.requests == []
    hs = agent.stats.heads["L0H0"]
    assert res[(0, 0)] == [] and hs.status == "error" and "HTTP 307" in hs.error
