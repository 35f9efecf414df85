"""OpenAI API shapes over real HTTP on loopback with the tiny model:
chat and completions, streaming and not, tools and reasoning on, n, seeds,
logprobs, stop strings, prefix caching, the native /generate API, API keys,
and temperature-0 equality with `mlaserve generate` and with the committed
transformers greedy continuations."""
import json
import os
import subprocess
import tempfile
import time

from serverlib import Checks, Server, check_pool_full, make_tiny_model, parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "The capital of France is"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def main():
    args = parse_args()
    work = tempfile.mkdtemp(prefix="mlaserve-api-")
    model = args.model_dir or make_tiny_model(args.binary, work)
    s = Server(args.binary, model, "--max-total-tokens", "8192", "--reasoning-parser", "deepseek-r1",
               "--tool-call-parser", "deepseekv3", "--served-model-name", "tiny")
    c = Checks()

    def models():
        status, body = s.request("GET", "/v1/models")[0], json.loads(s.request("GET", "/v1/models")[2])
        assert status == 200 and body["object"] == "list" and body["data"][0]["id"] == "tiny", body

    def same_as_generate_cli():
        out = subprocess.run([args.binary, "generate", "--model-path", model, "--prompt", PROMPT,
                              "--max-new-tokens", "16", "--json"], check=True, capture_output=True, text=True)
        cli = json.loads(out.stdout)
        status, native = s.post_json("/generate", {"text": PROMPT, "sampling_params": {
            "max_new_tokens": 16, "temperature": 0, "ignore_eos": True}})
        assert status == 200, native
        assert native["output_ids"][:len(cli["output_ids"])] == cli["output_ids"], (native, cli)
        status, comp = s.post_json("/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 16,
                                                        "temperature": 0, "ignore_eos": True})
        assert status == 200 and comp["choices"][0]["text"] == native["text"], (comp, native)

    def same_as_transformers():
        with open(os.path.join(ROOT, "tests/data/model/tiny.json")) as f:
            golden = json.load(f)
        assert golden["preset"] == "tiny" and golden["seed"] == 0 and golden["dtype"] == "bf16"
        for seq in golden["sequences"]:
            status, out = s.post_json("/generate", {"input_ids": seq["input_ids"], "sampling_params": {
                "max_new_tokens": len(seq["greedy"]), "temperature": 0, "ignore_eos": True}})
            assert status == 200, out
            assert out["output_ids"] == seq["greedy"], (out["output_ids"], seq["greedy"])

    def tokenize_matches_hf_tokenizers():
        # Ids and decodes made by Hugging Face tokenizers (tests/data/tokenizer).
        with open(os.path.join(ROOT, "tests/data/tokenizer/golden.jsonl")) as f:
            golden = [json.loads(line) for line in f][:300]
        status, out = s.post_json("/tokenize", {"prompt": [g["text"] for g in golden]})
        assert status == 200, out
        assert out["tokens"] == [g["ids"] for g in golden] and out["count"] == [len(g["ids"]) for g in golden]
        status, one = s.post_json("/tokenize", {"prompt": golden[20]["text"]})
        assert status == 200 and one["tokens"] == golden[20]["ids"] and one["max_model_len"] > 0, one
        with open(os.path.join(ROOT, "tests/data/tokenizer/golden_decode.jsonl")) as f:
            # The API refuses ids beyond the model's vocabulary (HF would drop them).
            cases = [c for c in map(json.loads, f) if max(c["ids"], default=0) < 129280][:100]
        assert len(cases) >= 50, len(cases)
        for case in cases:
            status, out = s.post_json("/detokenize", {"tokens": case["ids"],
                                                      "skip_special_tokens": case["skip_special_tokens"]})
            assert status == 200 and out["text"] == case["text"], (case, out)
        for bad in ({"prompt": 5}, {"prompt": ["ok", 7]}, {}):
            status, err = s.post_json("/tokenize", bad)
            assert status == 400 and err["error"]["param"] == "prompt", (bad, err)
        for bad in ({"tokens": [-1]}, {"tokens": "abc"}, {"tokens": [10**9]}, {}):
            status, err = s.post_json("/detokenize", bad)
            assert status == 400 and err["error"]["param"] == "tokens", (bad, err)

    def chat_non_stream():
        status, r = s.post_json("/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Hello!"}],
            "max_tokens": 8, "temperature": 0})
        assert status == 200, r
        assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-") and r["model"] == "tiny"
        ch = r["choices"][0]
        assert ch["index"] == 0 and ch["message"]["role"] == "assistant", ch
        assert ch["finish_reason"] in ("stop", "length"), ch
        u = r["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["completion_tokens"] <= 8, u
        assert "cached_tokens" in u["prompt_tokens_details"], u

    def chat_stream_matches_non_stream():
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Count to three."}],
                "max_tokens": 12, "temperature": 0}
        status, full = s.post_json("/v1/chat/completions", body)
        assert status == 200, full
        status, events = s.stream("/v1/chat/completions", dict(body, stream=True,
                                                                stream_options={"include_usage": True}))
        assert status == 200 and events[-1] == "[DONE]", events[-3:]
        chunks = events[:-1]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert all(e["object"] == "chat.completion.chunk" for e in chunks)
        content = "".join(e["choices"][0]["delta"].get("content", "") or "" for e in chunks if e["choices"])
        reasoning = "".join(e["choices"][0]["delta"].get("reasoning_content", "") or ""
                            for e in chunks if e["choices"])
        msg = full["choices"][0]["message"]
        assert content == (msg["content"] or ""), (content, msg)
        assert reasoning == (msg.get("reasoning_content") or ""), (reasoning, msg)
        finals = [e for e in chunks if e["choices"] and e["choices"][0]["finish_reason"]]
        assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
        usage = chunks[-1]["usage"]
        assert chunks[-1]["choices"] == [], chunks[-1]
        assert all(usage[k] == full["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens"))

    def chat_with_tools_and_reasoning():
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": TOOLS, "tool_choice": "auto", "max_tokens": 10, "temperature": 0.7, "seed": 5}
        status, r = s.post_json("/v1/chat/completions", body)
        assert status == 200, r
        ch = r["choices"][0]
        assert ch["finish_reason"] in ("stop", "length", "tool_calls") and ch["message"]["role"] == "assistant"
        # R1's parser: output starts inside the reasoning block, so with no </think> it is all reasoning.
        assert ch["message"].get("reasoning_content") or ch["message"]["content"] is not None, ch
        status, events = s.stream("/v1/chat/completions", dict(body, stream=True))
        assert status == 200 and events[-1] == "[DONE]"
        streamed = "".join((e["choices"][0]["delta"].get("reasoning_content") or "") for e in events[:-1])
        assert streamed == (ch["message"].get("reasoning_content") or ""), (streamed, ch)
        status, r = s.post_json("/v1/chat/completions", dict(body, tool_choice="required"))
        assert status == 400 and r["error"]["param"] == "tool_choice", r

    def completions_stream_matches():
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 10, "temperature": 0}
        status, full = s.post_json("/v1/completions", body)
        status, events = s.stream("/v1/completions", dict(body, stream=True))
        assert events[-1] == "[DONE]"
        text = "".join(e["choices"][0]["text"] for e in events[:-1])
        assert text == full["choices"][0]["text"], (text, full)
        assert events[-2]["choices"][0]["finish_reason"] == "length"

    def n_and_seed():
        body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "n": 3, "seed": 1234}
        status, a = s.post_json("/v1/completions", body)
        status, b = s.post_json("/v1/completions", body)
        assert [x["index"] for x in a["choices"]] == [0, 1, 2], a
        assert [x["text"] for x in a["choices"]] == [x["text"] for x in b["choices"]], (a, b)
        assert len({x["text"] for x in a["choices"]}) > 1, a
        assert a["usage"]["completion_tokens"] == 24 and a["usage"]["prompt_tokens"] == 6, a["usage"]

    def batch_prompts():
        for prompt in ([PROMPT, "Hello"], [[0, 100, 200], [0, 5]]):
            status, r = s.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 3, "temperature": 0, "n": 2})
            assert status == 200 and len(r["choices"]) == 4, r
            assert r["choices"][0]["text"] == r["choices"][1]["text"], r  # greedy: same per prompt

    def logprobs():
        status, r = s.post_json("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0,
            "logprobs": True, "top_logprobs": 3})
        lp = r["choices"][0]["logprobs"]["content"]
        assert len(lp) == r["usage"]["completion_tokens"], r
        for e in lp:
            assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3 and isinstance(e["bytes"], list)
            assert abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-6  # greedy takes the top token
        status, r = s.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                                     "logprobs": 2})
        lp = r["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == 4 and len(lp["top_logprobs"][0]) <= 2 and len(lp["text_offset"]) == 4, lp

    def stop_string_across_tokens():
        body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        status, events = s.stream("/v1/completions", dict(body, stream=True))
        pieces = [e["choices"][0]["text"] for e in events[:-1] if e["choices"][0]["text"]]
        full = "".join(pieces)
        i = next(k for k in range(2, len(pieces) - 1) if len(pieces[k]) >= 2 and len(pieces[k + 1]) >= 2)
        stop = pieces[i][-2:] + pieces[i + 1][:2]  # straddles two tokens
        status, r = s.post_json("/v1/completions", dict(body, stop=[stop]))
        ch = r["choices"][0]
        assert ch["text"] == full[:full.find(stop)] and ch["finish_reason"] == "stop", (ch, stop, full)
        status, events = s.stream("/v1/completions", dict(body, stop=stop, stream=True))
        streamed = "".join(e["choices"][0]["text"] for e in events[:-1])
        assert streamed == ch["text"], (streamed, ch["text"])

    def echo_and_zero_tokens():
        status, r = s.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": 0, "echo": True})
        assert status == 200 and r["choices"][0]["text"] == PROMPT and r["usage"]["completion_tokens"] == 0, r

    def cached_prefix_is_reported_and_faster():
        system = " ".join(f"rule {i}: answer politely and precisely." for i in range(120))
        def ask(q):
            times = []
            status, events = s.stream("/v1/chat/completions", {
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
                "max_tokens": 2, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}, times=times)
            # Event 0 is the role chunk sent at once; event 1 carries the first token.
            return events[-2]["usage"], times[1]
        u1, t1 = ask("What is rule 3?")
        u2, t2 = ask("What is rule 7?")
        assert u1["prompt_tokens"] > 500, u1
        assert u2["prompt_tokens_details"]["cached_tokens"] > 500, u2
        print(f"     first request {u1['prompt_tokens']} prompt tokens, cached "
              f"{u1['prompt_tokens_details']['cached_tokens']}: TTFT {t1 * 1000:.1f} ms; "
              f"second, cached {u2['prompt_tokens_details']['cached_tokens']}: TTFT {t2 * 1000:.1f} ms")

    def native_generate_stream():
        status, events = s.stream("/generate", {"text": PROMPT, "stream": True,
                                                "sampling_params": {"max_new_tokens": 5, "temperature": 0}})
        assert events[-1] == "[DONE]" and events[-2]["meta_info"]["finish_reason"]["type"] == "length", events[-2:]
        status, full = s.post_json("/generate", {"text": PROMPT, "sampling_params": {
            "max_new_tokens": 5, "temperature": 0}})
        assert events[-2]["text"] == full["text"] and events[-2]["output_ids"] == full["output_ids"]

    def operational_endpoints():
        assert s.request("GET", "/health")[0] == 200
        assert s.request("GET", "/health_generate")[0] == 200
        status, _, body = s.request("GET", "/get_server_info")
        info = json.loads(body)
        assert status == 200 and info["max_total_num_tokens"] == 8192 and info["page_size"] == 1, info
        check_pool_full(s.wait_idle())
        status, _, body = s.request("POST", "/flush_cache")
        assert status == 200, body
        m = s.metrics()
        assert m["mlaserve_kv_free_tokens"] == m["mlaserve_kv_total_tokens"], m

    for name, fn in [("models", models), ("same_as_generate_cli", same_as_generate_cli),
                     ("same_as_transformers", same_as_transformers), ("chat_non_stream", chat_non_stream),
                     ("chat_stream_matches_non_stream", chat_stream_matches_non_stream),
                     ("chat_with_tools_and_reasoning", chat_with_tools_and_reasoning),
                     ("completions_stream_matches", completions_stream_matches), ("n_and_seed", n_and_seed),
                     ("batch_prompts", batch_prompts), ("logprobs", logprobs),
                     ("stop_string_across_tokens", stop_string_across_tokens),
                     ("echo_and_zero_tokens", echo_and_zero_tokens),
                     ("cached_prefix_is_reported_and_faster", cached_prefix_is_reported_and_faster),
                     ("native_generate_stream", native_generate_stream),
                     ("operational_endpoints", operational_endpoints),
                     ("tokenize_matches_hf_tokenizers", tokenize_matches_hf_tokenizers)]:
        c.run(name, fn)
    rc = s.stop()
    c.run("clean_exit", lambda: rc == 0 or (_ for _ in ()).throw(AssertionError(f"exit code {rc}\n{s.log()}")))

    keyed = Server(args.binary, model, "--api-key", "sekret", "--max-total-tokens", "1024")

    def api_key():
        status, _, body = keyed.request("GET", "/v1/models")
        assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error", body
        status, _, _ = keyed.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        assert status == 401
        status, _, _ = keyed.request("GET", "/v1/models", headers={"Authorization": "Bearer sekret"})
        assert status == 200
        assert keyed.request("GET", "/health")[0] == 200

    c.run("api_key", api_key)
    keyed.stop()
    c.finish()


if __name__ == "__main__":
    main()
