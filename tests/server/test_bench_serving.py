"""bench-serving against our own server in CI (small numbers): the random
and ShareGPT datasets, Poisson arrivals and a concurrency cap; checks the
printed table and the JSON line against what was asked for."""
import json
import os
import subprocess
import tempfile

from serverlib import Checks, Server, check_pool_full, make_tiny_model, parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    args = parse_args()
    work = tempfile.mkdtemp(prefix="mlaserve-bench-")
    model = args.model_dir or make_tiny_model(args.binary, work)
    s = Server(args.binary, model, "--max-total-tokens", "16384", "--served-model-name", "tiny")
    out_file = os.path.join(work, "results.jsonl")
    c = Checks()

    def bench(*extra):
        p = subprocess.run([args.binary, "bench-serving", "--port", str(s.port), "--tokenizer", model,
                            "--output-file", out_file, "--seed", "3", *extra],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        with open(out_file) as f:
            return p.stdout, json.loads(f.readlines()[-1])

    def random_poisson():
        table, r = bench("--dataset-name", "random", "--num-prompts", "24", "--random-input-len", "48",
                         "--random-output-len", "6", "--random-range-ratio", "1", "--request-rate", "40")
        print(table)
        assert "Serving Benchmark Result" in table and "Successful requests:                     24" in table
        assert r["completed"] == 24 and r["failed"] == 0, r
        assert r["total_input_tokens"] == 24 * 48 and r["total_output_tokens"] == 24 * 6, r
        assert r["request_rate"] == 40 and r["max_concurrency"] is None, r
        for k in ("mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "mean_e2e_latency_ms"):
            assert r[k] > 0, (k, r)
        assert r["median_ttft_ms"] <= r["p99_ttft_ms"] and r["mean_itl_ms"] <= r["max_itl_ms"], r

    def max_concurrency():
        _, r = bench("--dataset-name", "random", "--num-prompts", "12", "--random-input-len", "16",
                     "--random-output-len", "8", "--random-range-ratio", "1", "--max-concurrency", "3",
                     "--backend", "mlaserve-chat")
        assert r["completed"] == 12 and r["max_concurrency"] == 3, r
        assert r["concurrency"] <= 3.0 + 1e-6, r  # average requests in flight can't exceed the cap
        assert r["total_output_tokens"] == 12 * 8, r

    def sharegpt():
        path = os.path.join(ROOT, "tests/data/server/sharegpt_sample.json")
        # A fixed output length keeps the empty reply; the single-turn entry is always skipped.
        _, r = bench("--dataset-name", "sharegpt", "--dataset-path", path, "--num-prompts", "10",
                     "--sharegpt-output-len", "5")
        assert r["completed"] == 6 and r["total_output_tokens"] == 30, r
        _, r = bench("--dataset-name", "sharegpt", "--dataset-path", path, "--num-prompts", "10")
        assert r["completed"] == 5 and r["total_output_tokens"] > 5 * 10, r

    def server_idle_afterwards():
        check_pool_full(s.wait_idle())

    for name, fn in [("random_poisson", random_poisson), ("max_concurrency", max_concurrency),
                     ("sharegpt", sharegpt), ("server_idle_afterwards", server_idle_afterwards)]:
        c.run(name, fn)
    s.stop()
    c.finish()


if __name__ == "__main__":
    main()
