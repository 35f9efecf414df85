"""Load: 500 concurrent streaming clients on the tiny model all finish or get
a clean 503; afterwards nothing runs and the KV pool is full again; RSS does
not grow across two identical rounds beyond a stated bound. Then SIGTERM
during load: every accepted stream still completes, the server exits 0."""
import http.client
import json
import signal
import tempfile
import threading
import time

from serverlib import Checks, Server, check_pool_full, make_tiny_model, parse_args

CLIENTS = 500
# Pages the first round never touched may be touched by the second: the KV
# pool (16384 tokens x 576 bytes = 9 MiB) bounds that, plus allocator slack.
RSS_GROWTH_BOUND_KIB = 16 * 1024


def stream_client(port, i, results, max_tokens=8):
    body = {"model": "tiny", "prompt": f"Shared instructions for every client. Client number {i} says",
            "max_tokens": max_tokens, "temperature": 0.8, "seed": i, "ignore_eos": True, "stream": True}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            err = json.loads(r.read())
            results[i] = ("rejected", r.status, err["error"]["type"], r.getheader("Retry-After"))
            return
        events = []
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
        c.close()
        done = events and events[-1] == "[DONE]"
        finish = json.loads(events[-2])["choices"][0]["finish_reason"] if done and len(events) > 1 else None
        results[i] = ("ok" if done and finish == "length" else "broken", events[-2:] if events else None)
    except (ConnectionError, OSError) as e:
        results[i] = ("connection_error", str(e))


def run_round(port, n, max_tokens=8):
    results = [None] * n
    threads = [threading.Thread(target=stream_client, args=(port, i, results, max_tokens)) for i in range(n)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.time() - t0


def main():
    args = parse_args()
    work = tempfile.mkdtemp(prefix="mlaserve-load-")
    model = args.model_dir or make_tiny_model(args.binary, work)
    s = Server(args.binary, model, "--max-total-tokens", "16384", "--max-running-requests", "128",
               "--max-queued-requests", "300", "--served-model-name", "tiny")
    c = Checks()
    rss = []

    def one_round():
        results, dt = run_round(s.port, CLIENTS)
        ok = sum(r[0] == "ok" for r in results)
        rejected = [r for r in results if r[0] == "rejected"]
        bad = [r for r in results if r[0] not in ("ok", "rejected")]
        print(f"     {CLIENTS} clients in {dt:.1f} s: {ok} complete streams, {len(rejected)} clean 503s")
        assert not bad, bad[:3]
        assert all(r[1] == 503 and r[2] == "service_unavailable_error" and r[3] == "1" for r in rejected), rejected[:3]
        assert ok >= 300, ok  # running 128 + queued 300 are always accepted
        m = s.wait_idle()
        check_pool_full(m)
        assert m["mlaserve_num_running_reqs"] == 0 and m["mlaserve_active_http_responses"] <= 1, m
        rss.append(s.rss_kib())

    c.run("round_1", one_round)
    c.run("round_2", one_round)

    def rss_bounded():
        growth = rss[1] - rss[0]
        print(f"     RSS after round 1: {rss[0] / 1024:.1f} MiB, after round 2: {rss[1] / 1024:.1f} MiB")
        assert growth <= RSS_GROWTH_BOUND_KIB, f"RSS grew {growth} KiB"

    c.run("rss_bounded", rss_bounded)
    s.stop()

    t = Server(args.binary, model, "--max-total-tokens", "16384", "--max-running-requests", "64",
               "--shutdown-timeout", "300")  # a slow CI machine must not turn draining into aborts

    def sigterm_during_load():
        results = [None] * 150
        threads = [threading.Thread(target=stream_client, args=(t.port, i, results, 24)) for i in range(150)]
        for th in threads:
            th.start()
        deadline = time.time() + 30
        while t.metrics()["mlaserve_num_running_reqs"] == 0 and time.time() < deadline:
            time.sleep(0.01)
        t.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late = [None] * 10  # after SIGTERM: refused (no listener) or 503, never a broken stream
        late_threads = [threading.Thread(target=stream_client, args=(t.port, i, late, 24)) for i in range(10)]
        for th in late_threads:
            th.start()
        for th in threads + late_threads:
            th.join()
        assert all(r[0] in ("rejected", "connection_error") for r in late), late
        rc = t.proc.wait(60)
        kinds = {}
        for r in results:
            kinds[r[0]] = kinds.get(r[0], 0) + 1
        print(f"     after SIGTERM: {kinds}, exit code {rc}")
        assert rc == 0, t.log()[-2000:]
        assert kinds.get("broken", 0) == 0, [r for r in results if r[0] == "broken"][:3]
        assert kinds.get("ok", 0) > 0, kinds
        # Late clients are refused (503 while draining, or no listener any more), never cut off.
        assert all(r[0] in ("ok", "rejected", "connection_error") for r in results)

    c.run("sigterm_during_load", sigterm_during_load)
    c.finish()


if __name__ == "__main__":
    main()
