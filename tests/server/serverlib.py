"""Helpers for the HTTP tests: start `mlaserve serve` on the tiny model on a
free loopback port, talk to it with the standard library only, read its
Prometheus metrics, and stop it."""
import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True, help="path to the mlaserve binary")
    ap.add_argument("--model-dir", help="existing tiny checkpoint (default: made in a temp dir)")
    return ap.parse_args()


def make_tiny_model(binary, workdir):
    out = os.path.join(workdir, "tiny")
    subprocess.run([binary, "make-model", "--preset", "tiny", "--out", out], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


class Server:
    def __init__(self, binary, model_dir, *extra):
        self.binary = binary
        self.model_dir = model_dir
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [binary, "serve", "--model-path", model_dir, "--port", "0", "--enable-metrics", *extra],
            stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.proc.kill()
            self.stderr.seek(0)
            raise RuntimeError("server did not start: " + line + self.stderr.read().decode(errors="replace"))
        self.port = int(line.strip().rsplit(":", 1)[1])
        self.headers = {}

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """Returns (status, headers dict, body bytes)."""
        c = self.conn(timeout)
        h = dict(self.headers)
        h.update(headers or {})
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        if data is not None and "Content-Type" not in h:
            h["Content-Type"] = "application/json"
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        c.close()
        return out

    def post_json(self, path, body, **kw):
        status, headers, data = self.request("POST", path, body, **kw)
        return status, json.loads(data) if data else None

    def stream(self, path, body, timeout=120, times=None):
        """POSTs a streaming request; returns (status, list of parsed SSE data payloads).
        With a list for `times`, appends each event's arrival time (seconds since the request)."""
        t0 = time.time()
        c = self.conn(timeout)
        h = dict(self.headers)
        h["Content-Type"] = "application/json"
        c.request("POST", path, body=json.dumps(body), headers=h)
        r = c.getresponse()
        if r.status != 200:
            data = r.read()
            c.close()
            return r.status, [json.loads(data)]
        events = []
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if times is not None:
                times.append(time.time() - t0)
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        c.close()
        return 200, events

    def metrics(self):
        status, _, data = self.request("GET", "/metrics")
        assert status == 200, status
        values = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_idle(self, timeout=30):
        """Until no request runs or waits; returns the metrics."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if (m["mlaserve_num_requests_in_flight"] == 0 and m["mlaserve_num_running_reqs"] == 0
                    and m["mlaserve_num_queue_reqs"] == 0):
                return m
            if time.time() > deadline:
                raise AssertionError(f"server not idle after {timeout}s: {m}")
            time.sleep(0.05)

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        return rc

    def log(self):
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")


def check_pool_full(m):
    """Idle server: every KV page is free or evictable prefix cache."""
    assert m["mlaserve_kv_available_tokens"] == m["mlaserve_kv_total_tokens"], m


class Checks:
    """Counts and reports named checks; exits non-zero if any failed."""

    def __init__(self):
        self.failed = []
        self.passed = 0

    def run(self, name, fn):
        try:
            fn()
            self.passed += 1
            print(f"ok   {name}", flush=True)
        except Exception as e:  # a failed check is reported, the others still run
            self.failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)

    def finish(self):
        print(f"{self.passed} passed, {len(self.failed)} failed", flush=True)
        if self.failed:
            print("failed: " + ", ".join(self.failed))
            sys.exit(1)
