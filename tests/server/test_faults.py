"""Bad input never hurts anyone else: a table of malformed and hostile
requests (each must get the right 4xx and an OpenAI error body naming the
problem), abrupt disconnects mid-stream, slow-loris clients, idle sockets,
and a full queue answered with 503 + Retry-After. Afterwards the server is
healthy, idle, and its KV pool is back to full."""
import json
import socket
import struct
import threading
import time

from serverlib import Checks, Server, check_pool_full, make_tiny_model, parse_args
import tempfile

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return dict({"messages": MSGS, "max_tokens": 4}, **kw)


def comp(**kw):
    return dict({"prompt": "hello", "max_tokens": 4}, **kw)


# (name, method, path, body, expected status, param the error must name or None)
CASES = [
    ("truncated_json", "POST", CHAT, b'{"messages": [', 400, None),
    ("json_array_body", "POST", CHAT, b"[1, 2]", 400, None),
    ("empty_body", "POST", COMP, b"", 400, None),
    ("invalid_utf8_body", "POST", COMP, b'{"prompt": "\xff\xfe"}', 400, None),
    ("messages_missing", "POST", CHAT, {"max_tokens": 4}, 400, None),
    ("messages_not_array", "POST", CHAT, {"messages": "hi"}, 400, None),
    ("messages_empty", "POST", CHAT, {"messages": []}, 400, None),
    ("unknown_role", "POST", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, None),
    ("content_wrong_type", "POST", CHAT, {"messages": [{"role": "user", "content": 42}]}, 400, None),
    ("max_tokens_negative", "POST", CHAT, chat(max_tokens=-5), 400, "max_tokens"),
    ("max_tokens_string", "POST", CHAT, chat(max_tokens="ten"), 400, "max_tokens"),
    ("max_tokens_absurd", "POST", COMP, comp(max_tokens=10 ** 12), 400, "max_tokens"),
    ("max_tokens_fraction", "POST", COMP, comp(max_tokens=5.5), 400, "max_tokens"),
    ("max_tokens_beyond_context", "POST", COMP, comp(max_tokens=255), 400, "max_tokens"),
    ("temperature_negative", "POST", CHAT, chat(temperature=-1), 400, "temperature"),
    ("temperature_string", "POST", CHAT, chat(temperature="hot"), 400, "temperature"),
    ("top_p_zero", "POST", COMP, comp(top_p=0), 400, "top_p"),
    ("top_p_above_one", "POST", COMP, comp(top_p=1.5), 400, "top_p"),
    ("n_zero", "POST", COMP, comp(n=0), 400, "n"),
    ("n_huge", "POST", COMP, comp(n=1000), 400, "n"),
    ("stop_number", "POST", COMP, comp(stop=7), 400, "stop"),
    ("stop_too_many", "POST", COMP, comp(stop=[f"s{i}" for i in range(40)]), 400, "stop"),
    ("logit_bias", "POST", COMP, comp(logit_bias={"50256": -100}), 400, "logit_bias"),
    ("response_format_schema", "POST", CHAT, chat(response_format={"type": "json_schema"}), 400, "response_format"),
    ("tool_choice_required", "POST", CHAT, chat(tool_choice="required"), 400, "tool_choice"),
    ("prompt_missing", "POST", COMP, {"max_tokens": 4}, 400, "prompt"),
    ("prompt_number", "POST", COMP, comp(prompt=3.5), 400, "prompt"),
    ("prompt_negative_id", "POST", COMP, comp(prompt=[1, -2, 3]), 400, "prompt"),
    ("prompt_id_beyond_vocab", "POST", COMP, comp(prompt=[1, 10 ** 9]), 400, None),
    ("prompt_longer_than_context", "POST", COMP, comp(prompt="word " * 400), 400, "prompt"),
    ("stream_options_without_stream", "POST", CHAT, chat(stream_options={"include_usage": True}), 400,
     "stream_options"),
    ("top_logprobs_too_many", "POST", CHAT, chat(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    ("frequency_penalty_range", "POST", CHAT, chat(frequency_penalty=5), 400, "frequency_penalty"),
    ("seed_string", "POST", CHAT, chat(seed="abc"), 400, "seed"),
    ("model_not_string", "POST", CHAT, chat(model=7), 400, "model"),
    ("generate_text_and_ids", "POST", "/generate", {"text": "a", "input_ids": [1]}, 400, None),
    ("generate_batch_text", "POST", "/generate", {"text": ["a", "b"]}, 400, "text"),
    ("generate_params_not_object", "POST", "/generate", {"text": "a", "sampling_params": [1]}, 400,
     "sampling_params"),
    ("unknown_path", "GET", "/v1/engines", None, 404, None),
    ("wrong_method", "GET", CHAT, None, 405, None),
    ("body_over_limit", "POST", COMP, comp(prompt="x" * 70000), 413, None),
]


def raw_exchange(port, data, read_timeout=5):
    """Sends raw bytes, returns whatever the server answers before closing."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(read_timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        pass
    s.close()
    return out


def status_of(raw):
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else None


def main():
    args = parse_args()
    work = tempfile.mkdtemp(prefix="mlaserve-faults-")
    model = args.model_dir or make_tiny_model(args.binary, work)
    s = Server(args.binary, model, "--max-total-tokens", "4096", "--context-length", "256",
               "--max-body-bytes", "65536", "--request-timeout", "1")
    c = Checks()

    def table_case(method, path, body, want, param):
        def run():
            status, _, data = s.request(method, path, body)
            assert status == want, (status, data[:300])
            err = json.loads(data)["error"]
            assert err["message"] and err["type"], err
            if param:
                assert err["param"] == param, err
        return run

    for name, method, path, body, want, param in CASES:
        c.run("table/" + name, table_case(method, path, body, want, param))

    def garbage_request_line():
        raw = raw_exchange(s.port, b"GARBAGE\r\n\r\n")
        assert status_of(raw) == 400, raw[:200]

    def oversized_headers():
        raw = raw_exchange(s.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
        assert status_of(raw) == 431, raw[:200]

    def expect_100_continue():
        body = json.dumps(comp(temperature=0)).encode()
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.settimeout(5)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        interim = sock.recv(100)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
        sock.sendall(body)
        got = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        sock.close()
        assert status_of(got) == 200 and b'"text_completion"' in got, got[:300]

    def slow_loris_headers():
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.settimeout(5)
        t0 = time.time()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        got = b""
        try:
            for _ in range(20):  # one header byte every 0.2 s: never finishes within the 1 s deadline
                sock.sendall(b"X")
                time.sleep(0.2)
        except OSError:
            pass
        try:
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        sock.close()
        assert status_of(got) == 408 and time.time() - t0 < 4.5, (got[:200], time.time() - t0)

    def slow_loris_body():
        raw = raw_exchange(s.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
        assert status_of(raw) == 408, raw[:200]

    def disconnects_mid_stream():
        def one():
            sock = socket.create_connection(("127.0.0.1", s.port))
            body = json.dumps({"prompt": "hello", "max_tokens": 200, "ignore_eos": True, "stream": True}).encode()
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            got = b""
            while got.count(b"data: ") < 3:
                chunk = sock.recv(4096)
                assert chunk, ("the server closed the stream early", got[-200:])
                got += chunk
            # Reset instead of a polite close: the harshest way to go.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        before = s.metrics().get("mlaserve_aborted_requests_total", 0)
        threads = [threading.Thread(target=one) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        m = s.wait_idle()
        check_pool_full(m)
        assert m["mlaserve_aborted_requests_total"] - before >= 15, m  # a few may have finished first

    def disconnect_before_response():
        sock = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps({"prompt": "hello", "max_tokens": 250 - 2, "ignore_eos": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        time.sleep(0.05)
        sock.close()
        check_pool_full(s.wait_idle())

    def idle_sockets_do_not_block_others():
        idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(200)]
        status, body = s.post_json(COMP, comp())
        assert status == 200, body
        for x in idle:
            x.close()

    def still_healthy():
        assert s.request("GET", "/health")[0] == 200
        status, body = s.post_json(CHAT, chat(temperature=0))
        assert status == 200 and body["choices"][0]["message"]["role"] == "assistant", body
        m = s.wait_idle()
        check_pool_full(m)
        assert s.proc.poll() is None, "server died"

    for name, fn in [("garbage_request_line", garbage_request_line), ("oversized_headers", oversized_headers),
                     ("expect_100_continue", expect_100_continue),
                     ("slow_loris_headers", slow_loris_headers), ("slow_loris_body", slow_loris_body),
                     ("disconnects_mid_stream", disconnects_mid_stream),
                     ("disconnect_before_response", disconnect_before_response),
                     ("idle_sockets_do_not_block_others", idle_sockets_do_not_block_others),
                     ("still_healthy", still_healthy)]:
        c.run(name, fn)
    rc = s.stop()
    c.run("clean_exit", lambda: (rc == 0) or (_ for _ in ()).throw(AssertionError(f"exit {rc}\n{s.log()}")))

    small = Server(args.binary, model, "--max-total-tokens", "4096", "--max-running-requests", "1",
                   "--max-queued-requests", "1")

    def full_queue_gets_503():
        long = {"prompt": "hello", "max_tokens": 3000, "ignore_eos": True, "stream": True}
        socks = []
        for _ in range(2):
            sock = socket.create_connection(("127.0.0.1", small.port))
            body = json.dumps(long).encode()
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode()
                         + b"\r\n\r\n" + body)
            sock.recv(100)  # the stream has started: the request is accepted
            socks.append(sock)
        status, headers, data = small.request("POST", COMP, comp())
        assert status == 503 and headers.get("retry-after") == "1", (status, headers, data)
        assert json.loads(data)["error"]["type"] == "service_unavailable_error"
        for sock in socks:
            sock.close()
        check_pool_full(small.wait_idle())
        status, body = small.post_json(COMP, comp())
        assert status == 200, body

    c.run("full_queue_gets_503", full_queue_gets_503)
    small.stop()
    print(f"{len(CASES)} table cases")
    c.finish()


if __name__ == "__main__":
    main()
