"""The runtime on CUDA end to end, in one GPU-machine call (standard library only).

1. The golden tiny checkpoints (tiny, tiny-v2, tiny block-FP8; made here with
   make-model from the seeds the golden files record) through
   `mlaserve generate --device cuda`, CUDA graphs on and off: greedy tokens
   against the transformers continuations in tests/data/model/*.json.
2. `mlaserve serve --device cuda` on tiny: 8 concurrent /generate requests
   (decode batches replay graphs) equal to the golden tokens, a chat
   completion, streamed and not; SIGTERM exits cleanly.
3. bench-one-batch --device cuda with graphs on and off (v2-lite width, few
   layers) to show what the graphs buy on the engine path, and decode through
   the engine (`generate`, batch 1) with and without the overlapped decode
   steps (--disable-overlap-schedule).

Usage: python3 scripts/device/engine_check.py BIN WORKDIR [--bench-layers N] [--bench-only]
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def make(binary, work, case):
    out = os.path.join(work, case["case"])
    if not os.path.exists(os.path.join(out, "config.json")):
        run([binary, "make-model", "--preset", case["preset"], "--dtype", case["dtype"], "--seed",
             str(case["seed"]), "--out", out])
    return out


# bf16 activations cannot order two logits closer than about this; a
# continuation may leave the f32 reference at such a near-tie (and then
# differ arbitrarily), which is rounding, not a bug.
NEAR_TIE = 0.02


def judge(got, want, min_top2_gap):
    """(tokens equal, acceptable): equal, or a divergence where the reference
    itself has a top-2 gap under NEAR_TIE somewhere in the continuation."""
    n = agreement(got, want)
    return n, n == len(want) or (min_top2_gap is not None and min_top2_gap < NEAR_TIE)


def agreement(got, want):
    n = 0
    while n < min(len(got), len(want)) and got[n] == want[n]:
        n += 1
    return n


def golden_generate(binary, work):
    ok = True
    for name in ("tiny", "tiny_v2", "tiny_fp8"):
        with open(os.path.join(ROOT, "tests/data/model", name + ".json")) as f:
            case = json.load(f)
        model = make(binary, work, case)
        for graphs in (True, False):
            for i, seq in enumerate(case["sequences"]):
                cmd = [binary, "generate", "--device", "cuda", "--model-path", model, "--input-ids",
                       ",".join(map(str, seq["input_ids"])), "--max-new-tokens", str(len(seq["greedy"])),
                       "--ignore-eos", "--json"] + ([] if graphs else ["--disable-cuda-graph"])
                got = json.loads(run(cmd).stdout)["output_ids"]
                gap = seq.get("greedy_min_top2_gap")
                n, fine = judge(got, seq["greedy"], gap)
                ok &= fine
                print(f"generate {name:8s} seq{i} graphs={'on ' if graphs else 'off'} "
                      f"{n}/{len(seq['greedy'])} tokens equal transformers"
                      + ("" if n == len(seq["greedy"]) else
                         f" (first difference at {n}; reference min top-2 gap {gap}: "
                         f"{'bf16 near-tie' if fine else 'FAIL'})"), flush=True)
    return ok


def post(port, path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def serve(binary, work):
    with open(os.path.join(ROOT, "tests/data/model/tiny.json")) as f:
        case = json.load(f)
    model = make(binary, work, case)
    proc = subprocess.Popen([binary, "serve", "--device", "cuda", "--model-path", model, "--port", "0",
                             "--max-total-tokens", "65536", "--served-model-name", "tiny"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        print("serve did not start:", line, proc.stderr.read())
        return False
    port = int(line.strip().rsplit(":", 1)[1])
    ok = True
    results = {}

    def one(k):
        seq = case["sequences"][k % len(case["sequences"])]
        status, data = post(port, "/generate", {"input_ids": seq["input_ids"], "sampling_params": {
            "max_new_tokens": len(seq["greedy"]), "temperature": 0, "ignore_eos": True}})
        results[k] = (status, json.loads(data)["output_ids"] if status == 200 else data, seq["greedy"],
                      seq.get("greedy_min_top2_gap"))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in sorted(results):
        status, got, want, gap = results[k]
        n, fine = judge(got, want, gap) if status == 200 else (-1, False)
        ok &= fine
        print(f"serve /generate #{k}: status {status}, {n}/{len(want)} tokens equal transformers"
              + ("" if n == len(want) else f" ({'bf16 near-tie' if fine else 'FAIL'})"), flush=True)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16,
            "temperature": 0}
    status, data = post(port, "/v1/chat/completions", body)
    full = json.loads(data)
    print("serve chat:", status, json.dumps(full["choices"][0]["message"], ensure_ascii=False)[:200], flush=True)
    ok &= status == 200
    status, data = post(port, "/v1/chat/completions", dict(body, stream=True))
    events = [l[6:] for l in data.decode().split("\n") if l.startswith("data: ")]
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in events[:-1] if json.loads(e)["choices"])
    same = status == 200 and events[-1] == "[DONE]" and text == (full["choices"][0]["message"]["content"] or "")
    print("serve chat stream equals non-stream:", same, flush=True)
    ok &= same
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    err = proc.stderr.read()
    print("serve exit code", rc, "| graph log:", [l for l in err.splitlines() if "CUDA graphs" in l][:1], flush=True)
    return ok and rc == 0


def bench(binary, work, layers, output_len):
    model = os.path.join(work, "v2lite")
    if not os.path.exists(os.path.join(model, "config.json")):
        t = time.time()
        run([binary, "make-model", "--preset", "v2-lite", "--layers", str(layers), "--out", model])
        print(f"made v2-lite --layers {layers} in {time.time() - t:.0f} s", flush=True)
    for bs in (1, 8, 64):
        for graphs in (True, False):
            cmd = [binary, "bench-one-batch", "--device", "cuda", "--model-path", model, "--batch-size", str(bs),
                   "--input-len", "512", "--output-len", str(output_len)] + ([] if graphs else ["--disable-cuda-graph"])
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"bench-one-batch bs {bs} failed: {proc.stderr.strip()[-300:]}", flush=True)
                continue
            out = proc.stdout.strip().splitlines()
            lines = [l for l in out if l.startswith(("Prefill.", "Decode.  median", "Decode step reads"))]
            print(f"bench-one-batch v2-lite x{layers} bs {bs} graphs={'on ' if graphs else 'off'}: "
                  + " | ".join(lines), flush=True)
    # The engine loads a tokenizer with the model (bench_model_cuda's
    # checkpoints, which check_and_bench links here, come without one).
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if not os.path.exists(os.path.join(model, f)):
            shutil.copy(os.path.join(ROOT, "assets", "tokenizer", f), model)
    ids = ",".join(str(7 + i % 1000) for i in range(512))
    for rnd in range(2):
        for overlap in (True, False):
            cmd = [binary, "generate", "--device", "cuda", "--model-path", model, "--input-ids", ids,
                   "--max-new-tokens", str(4 * output_len), "--ignore-eos", "--json"] + (
                      [] if overlap else ["--disable-overlap-schedule"])
            out = json.loads(run(cmd).stdout)
            print(f"generate v2-lite x{layers} bs 1 (engine) overlap={'on ' if overlap else 'off'}: "
                  f"{out['tokens_per_s']:.1f} tok/s, {1e3 / out['tokens_per_s']:.3f} ms a step", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("work")
    ap.add_argument("--bench-layers", type=int, default=4)
    ap.add_argument("--bench-output-len", type=int, default=64)
    ap.add_argument("--bench-only", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    ok = True
    if not a.bench_only:
        ok &= golden_generate(a.binary, a.work)
        ok &= serve(a.binary, a.work)
    if a.bench_layers > 0:
        bench(a.binary, a.work, a.bench_layers, a.bench_output_len)
    print("ENGINE CHECK", "PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
