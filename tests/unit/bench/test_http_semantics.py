"""bench/gpu/http_semantics.py on the CPU: the HTTP client, the request catalogue, the comparison (token equality,
near-tie accounting, logprob tolerance, 400 classification), the concurrency and KV judgements and the table, on
CONSTRUCTED responses (built here in SGLang 0.5.17's shapes, named ``constructed_*``), and, in the live test at the
end, the client and the comparison over real HTTP against the LAB STAND-IN server (lab/sglang_lab_server) started
twice on this host (about 35 s on a 2-CPU machine, models included: not marked slow), and again with the DDTREE
stand-in crashing twice (CRASHING_STANDIN, written by the test: lab/ is not changed; another 35 s). The crash
handling (``crash_excerpt``, ``Guard``, ``Server.restart``) is also tested on its own. The GPU run against the real
SGLang is bench/gpu/run_all.sh's http-semantics step."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "gpu" / "http_semantics.py"
LAB = ROOT / "lab"


def _module():
    spec = importlib.util.spec_from_file_location("http_semantics", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("http_semantics", module)  # dataclasses look the module up
    spec.loader.exec_module(module)
    return sys.modules["http_semantics"]


hs = _module()
PROMPT = [11, 48, 85, 122, 159, 196, 233, 270]
PLAIN = [501, 502, 503, 504, 505, 506, 507, 508, 509, 510]


# ------------------------------------------------------------------------------------------------ constructed answers
def constructed_generate(ids, status=200, top=None, n=1):
    """A /generate answer as SGLang 0.5.17 shapes it (a list for n > 1); ``top``: top logprobs per position."""
    item = {"text": "x" * len(ids), "output_ids": list(ids), "meta_info": {"completion_tokens": len(ids)}}
    if top is not None:
        item["meta_info"]["output_top_logprobs"] = [[[lp, tok, None] for tok, lp in pos] for pos in top]
        item["meta_info"]["output_token_logprobs"] = [[pos[0][1], pos[0][0], None] for pos in top]
    body = [item] * n if n > 1 else item
    return hs.Reply(status, json.dumps(body))


def constructed_error(status, message):
    """SGLang's refusal body (``{"object": "error", "message", "type", "code"}``)."""
    return hs.Reply(status, json.dumps({"object": "error", "message": message, "type": "BadRequestError",
                                        "code": status}))


def case(option="frequency_penalty", endpoint=hs.GENERATE, logprobs=False, changes=True):
    return hs.Case("feature", endpoint, {}, option, logprobs=logprobs, changes_plain=changes)


# ------------------------------------------------------------------------------------------------ 400 classification
@pytest.mark.parametrize(
    ("message", "option", "named"),
    [
        ("DFLASH speculative decoding does not support return_logprob yet.", "return_logprob", True),
        ("sampling_params.n is not supported by this LAB STAND-IN", "n", True),
        ("this is not supported", "n", False),  # "n" inside words does not count
        ("min_new_tokens must be >= 0", "max_new_tokens", False),
        ("Frequency_Penalty out of range", "frequency_penalty", True),
        ("anything", "", False),
        ("DFLASH speculative decoding does not support return_logprob yet.", "logprobs|return_logprob", True),
        ("DFLASH speculative decoding does not support return_logprob yet.", "logprobs", False),
    ],
)
def test_names_option_is_a_whole_word(message, option, named):
    assert hs.names_option(message, option) is named


def test_clear_400_needs_the_option_named_and_a_200_baseline():
    ok = constructed_generate(PLAIN)
    row = hs.classify(case("return_logprob"), ok,
                      constructed_error(400, "DFLASH speculative decoding does not support return_logprob yet."))
    assert row.verdict == hs.CLEAR_400 and "return_logprob" in row.detail
    vague = hs.classify(case("return_logprob"), ok, constructed_error(400, "bad request"))
    assert vague.verdict == hs.FAILED and "does not name return_logprob" in vague.detail


@pytest.mark.parametrize(
    "cand",
    [hs.Reply(500, '{"message": "Internal Server Error"}'), hs.Reply(502, ""),
     hs.Reply(None, "", "no answer within 120 s"), hs.Reply(None, "", "ConnectionResetError: reset by peer")],
    ids=["500", "502", "timeout", "reset"],
)
def test_ddtree_5xx_timeout_or_reset_is_failed(cand):
    row = hs.classify(case(), constructed_generate(PLAIN), cand)
    assert row.verdict == hs.FAILED and "DDTREE" in row.detail


def test_baseline_failing_is_failed_not_a_pass():
    row = hs.classify(case(), hs.Reply(503, "loading"), constructed_generate(PLAIN))
    assert row.verdict == hs.FAILED and "no speculation failed" in row.detail


def test_both_refusing_the_option_is_not_supported_by_this_server():
    msg = "sampling_params.frequency_penalty is not supported by this LAB STAND-IN"
    row = hs.classify(case(), constructed_error(400, msg), constructed_error(400, msg))
    assert row.verdict == hs.UNSUPPORTED
    both_404 = hs.classify(case(endpoint=hs.CHAT), constructed_error(404, "no route"), constructed_error(404, "x"))
    assert both_404.verdict == hs.UNSUPPORTED


def test_both_refusing_an_empty_prompt_alike_is_the_same():
    row = hs.classify(case("text", changes=False), constructed_error(400, "The input is empty"),
                      constructed_error(400, "The input is empty"))
    assert row.verdict == hs.SAME and "both refuse" in row.detail


def test_ddtree_accepting_what_the_baseline_refuses_differs():
    row = hs.classify(case(), constructed_error(400, "frequency_penalty bad"), constructed_generate(PLAIN))
    assert row.verdict == hs.DIFFERS


# ------------------------------------------------------------------------------------------------ token equality, ties
def test_equal_ids_are_the_same_and_the_feature_effect_is_reported():
    acted = [*PLAIN[:3], 900, 901, 902, 903, 904, 905, 906]
    row = hs.classify(case(), constructed_generate(acted), constructed_generate(acted), plain=PLAIN)
    assert row.verdict == hs.SAME and "no effect" not in row.detail
    idle = hs.classify(case(), constructed_generate(PLAIN), constructed_generate(PLAIN), plain=PLAIN)
    assert idle.verdict == hs.SAME and "no effect on the baseline" in idle.detail


def test_first_divergence_at_a_near_tie_counts_as_the_same():
    cand = [*PLAIN[:4], 777, 778]
    asked = []

    def margin_at(pos):
        asked.append(pos)
        return 0.25

    row = hs.classify(case(), constructed_generate(PLAIN), constructed_generate(cand), margin_at, tie_threshold=1.0)
    assert asked == [4]
    assert row.verdict == hs.SAME and "near-tie at token 4" in row.detail


def test_first_divergence_with_a_clear_margin_differs_with_the_position():
    cand = [*PLAIN[:6], 777, 778, 779, 780]
    row = hs.classify(case(), constructed_generate(PLAIN), constructed_generate(cand), lambda pos: 3.5)
    assert row.verdict == hs.DIFFERS and "token 6" in row.detail and "margin 3.500" in row.detail
    undecided = hs.classify(case(), constructed_generate(PLAIN), constructed_generate(cand), lambda pos: None)
    assert undecided.verdict == hs.DIFFERS and "no logprobs to decide" in undecided.detail


def test_a_shorter_answer_differs_at_its_length():
    row = hs.classify(case(), constructed_generate(PLAIN), constructed_generate(PLAIN[:7]), lambda pos: 0.0)
    assert row.verdict == hs.DIFFERS and "token 7" in row.detail


def test_n_2_compares_every_sequence():
    row = hs.classify(case("n", changes=False), constructed_generate(PLAIN, n=2), constructed_generate(PLAIN, n=2))
    assert row.verdict == hs.SAME and row.detail.startswith("2 x 10 tokens equal")
    fewer = hs.classify(case("n"), constructed_generate(PLAIN, n=2), constructed_generate(PLAIN))
    assert fewer.verdict == hs.DIFFERS


def test_chat_answers_compare_token_ids_else_text():
    def chat(ids=None, text="hello"):
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        if ids is not None:
            choice["token_ids"] = ids
        return hs.Reply(200, json.dumps({"choices": [choice]}))

    c = case("logit_bias", endpoint=hs.CHAT)
    assert hs.classify(c, chat(PLAIN), chat(PLAIN)).verdict == hs.SAME
    by_text = hs.classify(c, chat(text="hello there"), chat(text="hello where"))
    assert by_text.verdict == hs.DIFFERS and "char 6" in by_text.detail


def test_top_logprobs_and_margin_from_both_endpoints():
    gen = json.loads(constructed_generate([5, 6], top=[[(5, -0.1), (9, -2.6)], [(6, -0.7), (7, -0.75)]]).text)
    assert hs.top_logprobs_at(hs.GENERATE, gen, 1) == [(6, -0.7), (7, -0.75)]
    assert hs.tie_margin(hs.top_logprobs_at(hs.GENERATE, gen, 0)) == pytest.approx(2.5)
    chat = {"choices": [{"logprobs": {"content": [{"token": "a", "logprob": -0.2, "top_logprobs": [
        {"token": "b", "logprob": -1.9}, {"token": "a", "logprob": -0.2}]}]}}]}
    assert hs.tie_margin(hs.top_logprobs_at(hs.CHAT, chat, 0)) == pytest.approx(1.7)
    assert hs.top_logprobs_at(hs.GENERATE, gen, 5) is None
    assert hs.tie_margin([(1, -0.1)]) is None


# ------------------------------------------------------------------------------------------------ logprob tolerance
def test_logprobs_within_the_bf16_tolerance_are_the_same():
    base = constructed_generate([5, 6], top=[[(5, -0.10), (9, -2.60)], [(6, -0.70), (7, -1.75)]])
    cand = constructed_generate([5, 6], top=[[(5, -0.13), (9, -2.55)], [(6, -0.66), (7, -1.80)]])
    row = hs.classify(case("return_logprob", logprobs=True, changes=False), base, cand, logprob_tol=0.1)
    assert row.verdict == hs.SAME and "tolerance 0.1" in row.detail


def test_logprobs_beyond_the_tolerance_differ():
    base = constructed_generate([5, 6], top=[[(5, -0.10), (9, -2.60)], [(6, -0.70), (7, -1.75)]])
    cand = constructed_generate([5, 6], top=[[(5, -0.10), (9, -2.60)], [(6, -0.95), (7, -1.75)]])
    ok, detail = hs.compare_logprobs(hs.GENERATE, json.loads(base.text), json.loads(cand.text), 0.1)
    assert not ok and "0.2500" in detail


def test_top_k_edge_swap_at_a_near_tie_is_allowed_but_a_far_one_is_not():
    base = constructed_generate([5], top=[[(5, -0.10), (9, -3.00), (8, -3.02)]])
    swap = constructed_generate([5], top=[[(5, -0.10), (9, -3.00), (4, -3.01)]])
    far = constructed_generate([5], top=[[(5, -0.10), (9, -3.00), (4, -2.00)]])
    assert hs.compare_logprobs(hs.GENERATE, json.loads(base.text), json.loads(swap.text), 0.1)[0]
    ok, detail = hs.compare_logprobs(hs.GENERATE, json.loads(base.text), json.loads(far.text), 0.1)
    assert not ok and "one side only" in detail


def test_logprobs_missing_on_one_side_differ():
    base = constructed_generate([5], top=[[(5, -0.1), (9, -3.0)]])
    ok, detail = hs.compare_logprobs(hs.GENERATE, json.loads(base.text), json.loads(constructed_generate([5]).text),
                                     0.1)
    assert not ok and "DDTREE" in detail


# ------------------------------------------------------------------------------------------------ catalogue
def test_catalogue_builds_each_feature_from_the_plain_answer():
    cases = hs.catalogue(PROMPT, PLAIN, "abcdefghij", "hi", [601, 602, 603, 604, 605, 606, 607, 608], 256,
                         "PROCESSOR")
    by = {(c.endpoint, c.option): c for c in cases}

    def gen(option):
        return by[(hs.GENERATE, option)].body

    assert gen("frequency_penalty")["sampling_params"]["frequency_penalty"] > 0
    assert gen("logit_bias")["sampling_params"]["logit_bias"] == {str(PLAIN[2]): -100.0}
    expected = {"temperature": 0, "max_new_tokens": hs.NEW_TOKENS, "stop_token_ids": [PLAIN[3]], "min_new_tokens": 12}
    assert gen("min_new_tokens")["sampling_params"] == expected
    assert gen("stop_token_ids")["sampling_params"]["stop_token_ids"] == [PLAIN[5]]
    assert "ignore_eos" not in gen("stop_token_ids")["sampling_params"]
    assert gen("stop")["sampling_params"]["stop"] == ["fgh"]
    assert gen("custom_logit_processor")["custom_logit_processor"] == "PROCESSOR"
    assert gen("custom_logit_processor")["sampling_params"]["custom_params"] == {"token_ids": [PLAIN[1], PLAIN[4]]}
    assert gen("n")["sampling_params"]["n"] == 2
    assert gen("max_new_tokens")["sampling_params"]["max_new_tokens"] == 1
    assert gen("regex")["sampling_params"]["regex"] == hs.GRAMMAR_REGEX
    assert "ignore_eos" not in gen("regex")["sampling_params"]  # the grammar ends the answer where it completes
    assert gen("text")["text"] == "" and "input_ids" not in gen("text")
    assert gen("return_logprob")["return_logprob"] is True and gen("return_logprob")["top_logprobs_num"] == 5
    at_limit = next(c for c in cases if c.feature.startswith("prompt at the context limit")).body
    assert len(at_limit["input_ids"]) + at_limit["sampling_params"]["max_new_tokens"] == 256
    past = next(c for c in cases if c.feature.startswith("prompt past the context limit")).body
    assert len(past["input_ids"]) == 256

    def chat(option):
        return by[(hs.CHAT, option)].body

    assert chat("logit_bias")["logit_bias"] == {"603": -100.0}  # from the chat answer's own ids
    min_tokens = chat("min_tokens|min_new_tokens")
    assert min_tokens["stop_token_ids"] == [604] and min_tokens["min_tokens"] == 12
    chat_logprobs = chat("logprobs|top_logprobs|return_logprob")
    assert chat_logprobs["top_logprobs"] == 5 and chat_logprobs["return_token_ids"] is True
    assert all(c.body.get("temperature", c.body.get("sampling_params", {}).get("temperature")) == 0 for c in cases)


def test_catalogue_without_a_processor_or_with_a_short_answer():
    cases = hs.catalogue(PROMPT, PLAIN, "", "hi", None, 256, None)
    assert not [c for c in cases if c.option == "custom_logit_processor"]
    assert not [c for c in cases if c.option == "stop"]  # no text to take a stop string from
    with pytest.raises(ValueError, match="needs >= 8"):
        hs.catalogue(PROMPT, PLAIN[:5], "abc", "hi", None, 256, None)


def test_margin_is_read_only_from_a_repeat_with_the_same_prefix():
    base = json.loads(constructed_generate([5, 6, 7]).text)
    same = constructed_generate([5, 6, 8], top=[[(5, -0.1), (1, -3.0)], [(6, -0.5), (2, -0.8)], [(8, -1), (7, -2)]])
    assert hs.margin_if_same_prefix(hs.GENERATE, base, same, 1) == pytest.approx(0.3)
    assert hs.margin_if_same_prefix(hs.GENERATE, base, same, 2) is None  # the repeat went elsewhere at 2
    assert hs.margin_if_same_prefix(hs.GENERATE, base, constructed_error(400, "no"), 1) is None
    # the probe's answers (generation_probe.py results) carry output_ids the same way
    assert hs.margin_if_same_prefix(hs.GENERATE, {"output_ids": [5, 6]}, same, 0) == pytest.approx(2.9)


def test_tie_probe_asks_the_baseline_for_top_2():
    c = hs.catalogue(PROMPT, PLAIN, "abcdefghij", "hi", None, 256, None)
    gen = hs.tie_probe_body(c[1])
    assert gen["return_logprob"] is True and gen["top_logprobs_num"] == 2
    assert "return_logprob" not in c[1].body  # the original is untouched
    chat = hs.tie_probe_body(next(x for x in c if x.endpoint == hs.CHAT))
    assert chat["logprobs"] is True and chat["top_logprobs"] == 2


def test_the_processor_is_serialized_as_sglangs_docs_say_and_loads_back():
    # All of it in a fresh interpreter, importing sglang only there: once ansible's module_utils have patched
    # sys.intern (other tests of this run import them), importing sglang in this process fails (torch._dynamo, which
    # it imports through transformers, refuses the patched sys.intern).
    if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs sglang and torch")
    check = (
        "import json, sys, torch\n"
        f"sys.path.insert(0, {str(SCRIPT.parent)!r})\n"
        "import http_semantics\n"
        "from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor\n"
        "text = http_semantics.serialized_disallowed_tokens_processor()\n"
        "assert set(json.loads(text)) == {'callable'}, text\n"
        "processor = CustomLogitProcessor.from_str(text)  # what the server does with the request's string\n"
        "logits = processor(torch.zeros(2, 6), [{'token_ids': [1, 4]}, {'token_ids': [1, 4]}])\n"
        "assert torch.isinf(logits[:, [1, 4]]).all() and not torch.isinf(logits[:, [0, 2, 3, 5]]).any(), logits\n"
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]


# ------------------------------------------------------------------------------------------------ concurrency, KV
def test_parse_sse():
    chunks, done = hs.parse_sse(['data: {"a": 1}\n', "\n", ": keep-alive\n", 'data: {"a": 2}\n', "data: [DONE]\n"])
    assert chunks == [{"a": 1}, {"a": 2}] and done
    assert hs.parse_sse(['data: {"a": 1}\n']) == ([{"a": 1}], False)


def test_concurrent_plan_mixes_streams_aborts_and_plain():
    plan = hs.concurrent_plan([PROMPT, PROMPT[::-1]], 64)
    kinds = [p["kind"] for p in plan]
    assert len(plan) == 64 and kinds.count("stream") == 16 and kinds.count("abort") == 16
    assert all(("stream" in p["body"]) == (p["kind"] != "plain") for p in plan)
    assert all(8 <= p["max_new_tokens"] <= 64 and p["body"]["sampling_params"]["ignore_eos"] for p in plan)


def constructed_results(ddtree_bad=None, refuse_streams=False):
    plan = hs.concurrent_plan([PROMPT], 8)
    out = []
    for p in plan:
        ids = list(range(p["max_new_tokens"]))
        if p["kind"] == "plain":
            r = {"status": 200, "output_ids": ids}
        elif refuse_streams:
            r = {"status": 400, "message": "stream is not supported by this LAB STAND-IN"}
        elif p["kind"] == "stream":
            r = {"status": 200, "done": True, "aborted": False, "events": 5, "output_ids": ids}
        else:
            r = {"status": 200, "done": False, "aborted": True, "events": 2, "output_ids": ids[:2]}
        out.append(dict(r, index=p["index"], kind=p["kind"], max_new_tokens=p["max_new_tokens"]))
    if ddtree_bad is not None:
        out[ddtree_bad] = dict(out[ddtree_bad], status=None, error="ConnectionResetError")
    return out


def test_concurrency_row_verdicts():
    good = hs.concurrency_row(constructed_results(), constructed_results())
    assert good.verdict == hs.SAME and "6 complete" in good.detail and "2 aborted" in good.detail
    assert "4/4 plain outputs equal" in good.detail
    broken = hs.concurrency_row(constructed_results(), constructed_results(ddtree_bad=2))
    assert broken.verdict == hs.FAILED and "#2" in broken.detail
    short = constructed_results()
    short[0] = dict(short[0], output_ids=short[0]["output_ids"][:-1])  # a stream that ended a token short
    assert hs.concurrency_row(constructed_results(), short).verdict == hs.FAILED
    incremental = constructed_results()  # last event carries only the last piece; completion_tokens the whole
    incremental[0] = dict(incremental[0], output_ids=[3], completion_tokens=incremental[0]["max_new_tokens"])
    assert hs.concurrency_row(constructed_results(), incremental).verdict == hs.SAME
    no_done = constructed_results()
    no_done[0] = dict(no_done[0], done=False, error="the stream ended without [DONE]")
    assert hs.concurrency_row(constructed_results(), no_done).verdict == hs.FAILED
    plain_short = constructed_results()
    plain_short[2] = dict(plain_short[2], output_ids=plain_short[2]["output_ids"][:-1])
    assert hs.concurrency_row(constructed_results(), plain_short).verdict == hs.FAILED
    refused = hs.concurrency_row(constructed_results(refuse_streams=True), constructed_results(refuse_streams=True))
    assert refused.verdict == hs.UNSUPPORTED and "4/4 plain outputs equal" in refused.detail
    other = constructed_results()
    other[2] = dict(other[2], output_ids=[7] * other[2]["max_new_tokens"])
    assert hs.concurrency_row(constructed_results(), other).verdict == hs.DIFFERS


def test_used_kv_tokens_from_loads_and_metrics():
    loads = {"timestamp": "t", "loads": [{"dp_rank": 0, "num_used_tokens": 12, "num_total_tokens": 12},
                                         {"dp_rank": 1, "num_used_tokens": 3}]}
    assert hs.used_tokens_from_loads(loads) == 15
    assert hs.used_tokens_from_loads({"loads": []}) is None
    assert hs.used_tokens_from_loads({"detail": "Not Found"}) is None
    metrics = ('# HELP sglang:num_used_tokens x\nsglang:num_used_tokens{model_name="m",engine_type="unified"} 7.0\n'
               'sglang:num_used_tokens_total 99\n')
    assert hs.used_tokens_from_metrics(metrics) == 7
    assert hs.used_tokens_from_metrics("nothing") is None


def test_after_row_needs_health_and_idle_kv_on_both():
    ok = hs.after_row("/generate", {"DDTREE": 200, "none": 200}, {"DDTREE": (0, 0, "loads"), "none": (0, 0, "loads")})
    assert ok.verdict == hs.SAME
    leak = hs.after_row("/generate", {"DDTREE": 200, "none": 200},
                        {"DDTREE": (0, 340, "loads"), "none": (0, 0, "loads")})
    assert leak.verdict == hs.FAILED and "after 340" in leak.detail
    sick = hs.after_row("/generate", {"DDTREE": None, "none": 200}, {"DDTREE": (0, 0, "l"), "none": (0, 0, "l")})
    assert sick.verdict == hs.FAILED
    blind = hs.after_row("/generate", {"DDTREE": 200, "none": 200},
                         {"DDTREE": (None, None, "404"), "none": (None, None, "404")})
    assert blind.verdict == hs.UNSUPPORTED
    half = hs.after_row("/generate", {"DDTREE": 200, "none": 200}, {"DDTREE": (None, None, "404"), "none": (0, 0, "l")})
    assert half.verdict == hs.FAILED


# ------------------------------------------------------------------------------------------------ probe, table
def test_probe_row_counts_near_ties_and_needs_both_probes():
    comparison = {"prompts": 3, "agreeing": 1, "speedup": 1.4, "accept_length": {"value": 3.2},
                  "gate": {"passed": False, "failures": ["2 of 3 prompts disagree"]},
                  "per_prompt": [{"index": 0, "agree": True, "first_divergence": None, "unit": "token"},
                                 {"index": 1, "agree": False, "first_divergence": 4, "unit": "token"},
                                 {"index": 2, "agree": False, "first_divergence": 9, "unit": "token"}]}
    margins = {(1, 4): 0.3, (2, 9): 0.2}
    row = hs.probe_row({"ok": True}, {"ok": True}, comparison, lambda i, p: margins[(i, p)])
    assert row.verdict == hs.SAME and "near-ties: prompt 1 at token 4" in row.detail
    margins[(2, 9)] = 4.0
    assert hs.probe_row({"ok": True}, {"ok": True}, comparison, lambda i, p: margins[(i, p)]).verdict == hs.DIFFERS
    failed = hs.probe_row({"ok": True}, {"ok": False, "error": "HTTP 500"}, None, lambda i, p: None)
    assert failed.verdict == hs.FAILED and "HTTP 500" in failed.detail


def test_render_and_exit_status():
    rows = [hs.Row("stop string 'a|b'", hs.GENERATE, hs.SAME, "10 x 1 tokens equal"),
            hs.Row("n 2", hs.CHAT, hs.UNSUPPORTED, "both 404")]
    text = hs.render(rows, {"gpu": "h200", "date": "2026-12-04", "budget": 16})
    lines = text.splitlines()
    assert "| feature | endpoint | DDTREE vs none verdict | detail |" in lines
    assert "| stop string 'a\\|b' | /generate | same as no speculation | 10 x 1 tokens equal |" in lines
    assert "- rows: 1 same as no speculation, 1 not supported by this server" in lines
    assert hs.exit_status(rows) == 0
    assert hs.exit_status([*rows, hs.Row("x", hs.GENERATE, hs.FAILED, "500")]) == 1


def test_generation_compare_is_the_checkouts_filter_with_and_without_ansible():
    compare = hs.load_generation_compare()
    assert Path(sys.modules[compare.__module__].__file__).resolve() == ROOT / "plugins" / "filter" / "pivot.py"
    before = {"ok": True, "tokens_per_s": 10.0, "results": [{"prompt": "p", "output_ids": [1, 2, 3]}]}
    after = {"ok": True, "tokens_per_s": 15.0, "results": [{"prompt": "p", "output_ids": [1, 2, 4]}]}
    out = compare(before, after, 0, 0, 0)
    assert out["per_prompt"][0]["first_divergence"] == 2 and out["speedup"] == 1.5
    # the GPU host has no ansible: the same filter loads with ansible.errors stubbed
    code = ("import sys, importlib.util; sys.modules['ansible'] = None; sys.modules['ansible.errors'] = None; "
            f"spec = importlib.util.spec_from_file_location('hs', {str(SCRIPT)!r}); m = importlib.util.module_from_spec"
            "(spec); sys.modules['hs'] = m; spec.loader.exec_module(m); c = m.load_generation_compare(); "
            "print(c(None, {'ok': True, 'results': []})['gate']['passed'], type(sys.modules['ansible']).__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "module"]


def test_role_prompts_are_the_roles_defaults_with_or_without_yaml():
    yaml = pytest.importorskip("yaml")
    defaults = yaml.safe_load(hs.ROLE_DEFAULTS.read_text())
    expected = (defaults["sglang_service_baseline_prompts"], defaults["sglang_service_baseline_max_new_tokens"])
    assert hs.role_prompts() == expected and len(expected[0]) >= 2
    assert hs.role_prompts_plain(hs.ROLE_DEFAULTS.read_text()) == expected
    with pytest.raises(ValueError, match="not found"):
        hs.role_prompts_plain("sglang_service_baseline_prompts:\n  - unquoted\n")


def test_request_to_a_closed_port_is_no_answer_and_a_failed_row():
    port = hs.free_port()  # nothing listens on it
    reply = hs.request(f"http://127.0.0.1:{port}/generate", {"text": "x"}, timeout=5)
    assert reply.status is None and "Refused" in reply.error
    assert hs.classify(case(), constructed_generate(PLAIN), reply).verdict == hs.FAILED
    s = hs.stream(f"http://127.0.0.1:{port}/generate", {"text": "x", "stream": True}, timeout=5)
    assert s.status is None and s.error


def test_sglang_argv_parses_with_sglang_0_5_17():
    python = ROOT / ".venv-sglang-0.5.17" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-sglang-0.5.17")
    argv = hs.sglang_argv(Path("/m"), 30000, "DDTREE", 16, 1024)
    assert argv[1:3] == ["-m", "sglang.launch_server"] and "--disable-cuda-graph" not in argv
    code = ("import argparse, json, sys; from sglang.srt.server_args import ServerArgs; p = argparse.ArgumentParser();"
            " ServerArgs.add_cli_args(p); a = p.parse_args(json.loads(sys.argv[1])); print(json.dumps([a.attention_"
            "backend, a.enable_custom_logit_processor, a.enable_metrics, a.speculative_num_draft_tokens, "
            "a.speculative_algorithm, a.context_length]))")
    proc = subprocess.run([str(python), "-c", code, json.dumps(argv[3:])], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == ["triton", True, True, 17, "DDTREE", 1024]


# ------------------------------------------------------------------------------------------------ crashes, restarts
SGLANG_CRASH_LOG = """[2026-12-05 10:00:01] INFO:     127.0.0.1:5000 - "POST /generate HTTP/1.1" 200 OK
[2026-12-05 10:00:02] Scheduler hit an exception: Traceback (most recent call last):
  File "/sglang/srt/managers/scheduler.py", line 2900, in run_scheduler_process
    scheduler.event_loop_overlap()
  File "/sglang/srt/managers/scheduler.py", line 1100, in check_memory
    raise ValueError(msg)
ValueError: pool memory leak detected! available_size=1000, protected_size=0, total=1024

[2026-12-05 10:00:02] Received sigquit from a child process. It usually means the child failed.
"""


def test_crash_excerpt_quotes_the_exception_line_and_the_last_line():
    assert hs.crash_excerpt(SGLANG_CRASH_LOG) == (
        "ValueError: pool memory leak detected! available_size=1000, protected_size=0, total=1024 / "
        "[2026-12-05 10:00:02] Received sigquit from a child process. It usually means the child failed.")
    # a chained exception: the last traceback's exception line; a logged line before it does not count
    chained = ("Traceback (most recent call last):\n  x\nKeyError: 1\n\nDuring handling of the above exception, "
               "another exception occurred:\n\nTraceback (most recent call last):\n  y\n[t] INFO other thread\n"
               "torch.OutOfMemoryError: CUDA out of memory\n")
    assert hs.crash_excerpt(chained) == "torch.OutOfMemoryError: CUDA out of memory"
    assert hs.crash_excerpt("loading\nKilled\n\n") == "loading / Killed"  # no traceback: the last two lines
    assert hs.crash_excerpt("\n \n") == ""


class FakeServer:
    """Stands in for ``Server`` in the Guard: answers ``/health`` until ``crash()``; ``restart`` logs a new life."""

    def __init__(self, name, restart_problem=None):
        self.log, self.up, self.restart_problem = Path(f"server-{name}.log"), True, restart_problem
        self.text, self.calls = "", []

    def crash(self, exception_line):
        self.up, self.text = False, f"Traceback (most recent call last):\n  File x\n{exception_line}\n"

    def trouble(self, timeout):
        return None if self.up else "/health: no answer (ConnectionRefusedError: [Errno 111] Connection refused)"

    def log_since_start(self):
        return self.text

    def stop(self):
        self.calls.append("stop")

    def restart(self, deadline_s):
        self.calls.append("restart")
        self.up, self.text = self.restart_problem is None, ""
        return self.restart_problem


def test_guard_fails_the_crashed_row_restarts_and_gives_up_after_the_cap():
    ddtree, none = FakeServer("DDTREE"), FakeServer("none")
    guard = hs.Guard({"DDTREE": ddtree, "none": none}, max_restarts=1, log=lambda _line: None)
    row = guard.check(hs.Row("greedy", hs.GENERATE, hs.SAME, "1 x 24 tokens equal"))
    assert (row.verdict, row.detail) == (hs.SAME, "1 x 24 tokens equal") and guard.down() is None
    ddtree.crash("ValueError: pool memory leak detected!")
    row = guard.check(hs.Row("at the limit", hs.GENERATE, hs.FAILED, "DDTREE: no answer (RemoteDisconnected)"))
    assert row.verdict == hs.FAILED
    assert row.detail == ("DDTREE server crashed (/health: no answer (ConnectionRefusedError: [Errno 111] Connection "
                          "refused); server-DDTREE.log: ValueError: pool memory leak detected!); restarted (restart 1 "
                          "of at most 1); DDTREE: no answer (RemoteDisconnected)")
    assert ddtree.calls == ["stop", "restart"] and none.calls == [] and guard.down() is None
    row = guard.check(hs.Row("past the limit", hs.GENERATE, hs.SAME, "both refuse it"))
    assert (row.verdict, row.detail) == (hs.SAME, "both refuse it; DDTREE after restart 1")
    ddtree.crash("RuntimeError: again")  # a server that answered the row, then died: the row is failed too
    row = guard.check(hs.Row("n 2", hs.GENERATE, hs.SAME, "2 x 24 tokens equal"))
    assert row.verdict == hs.FAILED and "RuntimeError: again); not restarted (at most 1 restarts)" in row.detail
    assert ddtree.calls == ["stop", "restart", "stop"]
    assert guard.down() == "server down: DDTREE crashed 2 times, no restart left (at most 1)"
    gone = "crashed 2 times, no restart left (at most 1)"
    assert guard.summary() == {"DDTREE": {"crashes": 2, "restarts": 1, "down": gone},
                               "none": {"crashes": 0, "restarts": 0, "down": None}}
    lines = hs.render([row], {"gpu": "h200", "date": "d", "restarts": guard.summary()}).splitlines()
    assert f"- server DDTREE: 2 crash(es), 1 restart(s); down from then on: {gone}" in lines
    assert "- server none: 0 crash(es), 0 restart(s)" in lines


def test_guard_gives_up_on_a_server_whose_restart_fails():
    ddtree = FakeServer("DDTREE", restart_problem="exited with 1 (log server-DDTREE.log)")
    guard = hs.Guard({"DDTREE": ddtree}, max_restarts=3, log=lambda _line: None)
    ddtree.crash("ValueError: x")
    row = guard.check(hs.Row("a", hs.GENERATE, hs.SAME, "equal"))
    assert row.verdict == hs.FAILED and "restart failed: exited with 1" in row.detail
    assert guard.down() == "server down: DDTREE restart failed: exited with 1 (log server-DDTREE.log)"
    assert guard.summary()["DDTREE"]["restarts"] == 0
    assert guard.check(hs.Row("b", hs.GENERATE, hs.FAILED, "x")).detail == "x"  # given up: no longer checked


def test_server_restart_runs_the_same_command_and_reads_only_its_new_log(tmp_path):
    """``Server`` on a small program: a crash is seen (exited), the log of the run since the restart is what
    ``log_since_start`` gives, and ``stop`` is once per start."""
    port = hs.free_port()
    program = ("import sys, http.server\nprint('life', flush=True)\n"
               "class H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        self.send_response(200)\n"
               "        self.end_headers()\n    def log_message(self, *a):\n        pass\n"
               f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    log = tmp_path / "server-x.log"
    log.write_text("earlier run\nTraceback (most recent call last):\nValueError: old\n")
    server = hs.Server([sys.executable, "-c", program], f"http://127.0.0.1:{port}", log)
    try:
        assert server.wait_ready(60) is None and server.trouble(5) is None
        os.kill(server.proc.pid, 9)
        server.proc.wait()
        assert server.trouble(5) == "exited with -9"
        assert server.restart(60) is None and server.trouble(5) is None
        assert server.log_since_start() == "life\n" and log.read_text().count("life") == 2
    finally:
        server.stop()
    assert server.trouble(5) == "exited with -15"  # stopped by SIGTERM to its group
    server.stop()  # again: nothing to signal


# ------------------------------------------------------------------------------------------------ live: LAB STAND-IN
@pytest.fixture(scope="module")
def standin_models(tmp_path_factory) -> Path:
    """The lab's tiny pair (lab/make_tiny_models.py) in the layout the script takes: MODELS/target, MODELS/drafter."""
    built = LAB / ".build" / "models"
    made = subprocess.run([sys.executable, str(LAB / "make_tiny_models.py"), str(built)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert made.returncode == 0, made.stderr
    models = tmp_path_factory.mktemp("models")
    (models / "target").symlink_to(built / "Qwen3-tiny")
    (models / "drafter").symlink_to(built / "Qwen3-tiny-DFlash")
    return models


def test_live_main_against_the_lab_standin_twice(standin_models, tmp_path):
    """The whole script over real HTTP, its servers being the LAB STAND-IN (lab/sglang_lab_server, which parses
    SGLang's own flags) twice: target-only decoding and its DDTREE reference engine. What the stand-in implements
    compares token by token; what it lacks comes out as "not supported by this server" (its 400 names the field,
    or 404 for chat), never as a pass; the table and the JSON are written and the exit status is 0. The script runs
    as a program, as on the GPU host (it imports sglang, which fails in a process where ansible's module_utils have
    patched sys.intern, as other tests of this run do)."""
    results = tmp_path / "results"
    env = dict(os.environ, PYTHONPATH=str(LAB))
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--models", str(standin_models), "--work", str(tmp_path / "work"), "--budget",
         "8", "--context-length", "256", "--gpu", "lab-standin", "--results", str(results), "--server-module",
         "sglang_lab_server", "--timeout", "300"],
        capture_output=True, text=True, env=env, timeout=900, check=False)
    status, out = run.returncode, run.stdout + run.stderr
    md = list(results.glob("http-semantics-lab-standin-*.md"))
    assert len(md) == 1, out[-3000:]
    record = json.loads(md[0].with_suffix(".json").read_text())
    rows = [hs.Row(**r) for r in record["rows"]]
    assert status == 0 == hs.exit_status(rows), md[0].read_text()
    assert "| feature | endpoint | DDTREE vs none verdict | detail |" in md[0].read_text()
    copy = tmp_path / "work" / md[0].name  # the copy that run_all.sh's archive brings back from the GPU host
    assert copy.read_text() == md[0].read_text()
    assert "sglang_lab_server" in record["servers"]["DDTREE"] and "DDTREE" in record["servers"]["DDTREE"]
    by = {(r.endpoint, r.feature.split(" (")[0].split(" [")[0]): r for r in rows}
    assert by[(hs.GENERATE, "greedy")].verdict == hs.SAME
    stop = by[(hs.GENERATE, "stop_token_ids")]
    assert stop.verdict == hs.SAME and "no effect" not in stop.detail  # it stops before max_new_tokens
    assert by[(hs.GENERATE, "max_new_tokens 1")].verdict == hs.SAME
    assert by[(hs.GENERATE, "empty prompt")].verdict == hs.SAME  # both refuse it alike
    assert by[(hs.GENERATE, "prompt at the context limit")].verdict == hs.SAME
    assert by[(hs.GENERATE, "prompt past the context limit")].verdict == hs.SAME
    for feature in ("frequency_penalty 1.5", "presence_penalty 1.5", "repetition_penalty 1.5", "n 2",
                    "return_logprob, top_logprobs_num 5", "custom logit processor"):
        row = by[(hs.GENERATE, feature)]
        assert row.verdict == hs.UNSUPPORTED and "LAB STAND-IN" in row.detail, row
    unsupported = {r.feature for r in rows if r.verdict == hs.UNSUPPORTED}
    for prefix in ("logit_bias", "min_new_tokens", "stop string"):
        assert any(f.startswith(prefix) for f in unsupported), prefix
    assert all(r.verdict == hs.UNSUPPORTED for r in rows if r.endpoint == hs.CHAT)
    concurrent = next(r for r in rows if "concurrent mixed" in r.feature)
    assert concurrent.verdict == hs.UNSUPPORTED and "32/32 plain outputs equal" in concurrent.detail
    after = next(r for r in rows if r.feature.startswith("after the concurrent run"))
    assert after.verdict == hs.UNSUPPORTED and "/health 200" in after.detail
    probe = next(r for r in rows if r.feature.startswith("pivot generation probe"))
    assert probe.verdict == hs.SAME and "5/5 prompts agree" in probe.detail, probe


# Test-only wrapper of the LAB STAND-IN, written into the test's own directory and run as ``--server-module``: its
# DDTREE server crashes the way the GPU run's did (the scheduler's traceback, then SGLang's last line, then the
# process is gone mid-request) on a request at the context limit (prompt + max_new_tokens = the context length: the
# catalogue's "prompt at the context limit" row) and, in any later life, on max_new_tokens 22 (only the concurrent
# run's plan asks for 22).
CRASHING_STANDIN = '''
import logging, os, sys, traceback

from sglang_lab_server import server

generate_one = server.Handler._generate_one


def crashing(self, body):
    ids, new = body.get("input_ids") or [], (body.get("sampling_params") or {}).get("max_new_tokens")
    if "DDTREE" in sys.argv and isinstance(new, int):
        if len(ids) + new == self.server.engine.context_length:
            error = ValueError("pool memory leak detected! available_size=100, total=256 (test crash)")
        elif new == 22:
            error = RuntimeError("second test crash")
        else:
            return generate_one(self, body)
        try:
            raise error
        except Exception:
            traceback.print_exc()
        sys.stderr.flush()
        logging.getLogger("sglang").error("Received sigquit from a child process. It usually means the child failed.")
        sys.stdout.flush()
        os._exit(1)
    return generate_one(self, body)


server.Handler._generate_one = crashing
if __name__ == "__main__":
    code = server.main(sys.argv[1:])
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)
'''


def test_live_a_crashed_server_is_restarted_and_the_run_goes_on(standin_models, tmp_path):
    """The whole script against the LAB STAND-IN whose DDTREE side crashes twice (CRASHING_STANDIN), with
    --max-restarts 1: the row it crashed on is failed and quotes the log's exception line, the server is restarted
    and the next rows are measured on it (and say so), the second crash (in the concurrent run) is not restarted and
    every row after it is "server down" without a request; the counts are in the Markdown and the JSON; exit 1."""
    (tmp_path / "crashing_standin.py").write_text(CRASHING_STANDIN)
    results = tmp_path / "results"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(LAB), str(tmp_path)]))
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--models", str(standin_models), "--work", str(tmp_path / "work"), "--budget",
         "8", "--context-length", "256", "--gpu", "lab-standin", "--results", str(results), "--server-module",
         "crashing_standin", "--timeout", "300", "--max-restarts", "1"],
        capture_output=True, text=True, env=env, timeout=900, check=False)
    out = run.stdout + run.stderr
    md = list(results.glob("http-semantics-lab-standin-*.md"))
    assert len(md) == 1, out[-3000:]
    record = json.loads(md[0].with_suffix(".json").read_text())
    rows = [hs.Row(**r) for r in record["rows"]]
    assert run.returncode == 1 == hs.exit_status(rows), md[0].read_text()
    gone = "crashed 2 times, no restart left (at most 1)"
    assert record["restarts"] == {"DDTREE": {"crashes": 2, "restarts": 1, "down": gone},
                                  "none": {"crashes": 0, "restarts": 0, "down": None}}
    assert f"- server DDTREE: 2 crash(es), 1 restart(s); down from then on: {gone}" in md[0].read_text()
    by = {(r.endpoint, r.feature.split(" (")[0].split(" [")[0]): r for r in rows}
    greedy = by[(hs.GENERATE, "greedy")]
    assert greedy.verdict == hs.SAME and "restart" not in greedy.detail
    crashed = by[(hs.GENERATE, "prompt at the context limit")]
    assert crashed.verdict == hs.FAILED, crashed
    assert crashed.detail.startswith("DDTREE server crashed (")
    assert "server-DDTREE.log: ValueError: pool memory leak detected! available_size=100, total=256 (test crash) / " \
        in crashed.detail, crashed
    assert "Received sigquit from a child process" in crashed.detail and "restarted (restart 1 of at most 1)" in \
        crashed.detail
    past = by[(hs.GENERATE, "prompt past the context limit")]  # measured on the restarted server
    assert past.verdict == hs.SAME and past.detail.endswith("; DDTREE after restart 1"), past
    logprob = by[(hs.GENERATE, "return_logprob, top_logprobs_num 5")]
    assert logprob.verdict == hs.UNSUPPORTED and "LAB STAND-IN" in logprob.detail and \
        logprob.detail.endswith("; DDTREE after restart 1"), logprob
    concurrent = next(r for r in rows if "concurrent mixed" in r.feature)
    assert concurrent.verdict == hs.FAILED and "RuntimeError: second test crash" in concurrent.detail, concurrent
    assert "ValueError" not in concurrent.detail  # the log of the server's second life only
    assert "not restarted (at most 1 restarts)" in concurrent.detail
    after = [r for r in rows if r.feature.startswith(("after the concurrent run", "pivot generation probe"))]
    assert len(after) == 2 and all(r.verdict == hs.FAILED and r.detail == f"server down: DDTREE {gone}"
                                   for r in after), after
    log = (tmp_path / "work" / "server-DDTREE.log").read_text()
    assert log.count("The server is fired up and ready to roll!") == 2  # started, restarted once, not again
