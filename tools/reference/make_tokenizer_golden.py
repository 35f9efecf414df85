#!/usr/bin/env python3
"""Golden tokenizer data from Hugging Face, and the side-by-side benchmark.

Runs on the GPU machine, where the Python packages `tokenizers` and
`transformers` exist (this machine has neither):

  make_tokenizer_golden.py --tokenizer-dir DIR --out-dir OUT [--mlaserve BIN --lib-dir LIBS]

Writes into OUT:
  golden.jsonl      every string of tokenizer_corpus.golden_corpus():
                    {"text", "ids"} with ids = Tokenizer.from_file(tokenizer.json)
                    .encode(text, add_special_tokens=False).ids; "decoded" only
                    where decode(ids, skip_special_tokens=False) != text, and
                    "decoded_skip_special" only where that decode differs from it.
  golden_decode.jsonl  id sequences (cut UTF-8 characters, special and unknown
                    ids) with {"ids", "skip_special_tokens", "text": decode(...)}.
  golden_transformers.jsonl  a few strings through transformers' AutoTokenizer:
                    {"text", "ids": add_special_tokens=True, "decoded_skip_special"}.
                    A record only: transformers 5.17 rebuilds this tokenizer
                    wrongly (tests/data/tokenizer/README.md).
  perf.json         single-thread encoding throughput of HF tokenizers on
                    tokenizer_corpus.bench_corpus(10), and of `mlaserve
                    bench-tokenizer` on the same corpus when --mlaserve is given.
"""
import os

# Single-threaded Hugging Face: must be set before tokenizers is imported.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import datetime
import json
import platform
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402

try:
    import tokenizers
except ImportError:
    tokenizers = None

TRANSFORMERS_STRINGS = ["Hello world!", "", " leading space", "<｜User｜>Hi<｜Assistant｜>",
                        "<｜begin▁of▁sentence｜>already has BOS", "中文和English混合", "<|EOT|> end",
                        "tool<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```",
                        "emoji 👨‍👩‍👧 ok", "  \n\t spaces  "]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_jsonl(records, path):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")


def golden_records(tok):
    records = []
    for text in tokenizer_corpus.golden_corpus():
        ids = tok.encode(text, add_special_tokens=False).ids
        record = {"text": text, "ids": ids}
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != text:
            record["decoded"] = decoded
        decoded_skip = tok.decode(ids, skip_special_tokens=True)
        if decoded_skip != decoded:
            record["decoded_skip_special"] = decoded_skip
        records.append(record)
    return records


def decode_records(tok):
    """Id sequences no encoder produces: characters cut between tokens, bytes
    that never form UTF-8, special tokens, ids past the vocabulary."""
    rng = random.Random(4242)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    # Tokens that stand for one raw byte: the 256 byte-level characters.
    byte_alphabet = [c for c in vocab if len(c) == 1 and ord(c) < 0x144 and not c.isspace()]
    byte_ids = sorted(vocab[c] for c in byte_alphabet)
    special_ids = [vocab[t] for t in tokenizer_corpus.SPECIAL_TOKENS if t in vocab]
    records = []
    for case in range(400):
        ids = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.45:
                ids.append(rng.choice(byte_ids))
            elif r < 0.75:
                ids.append(rng.randrange(128000))
            elif r < 0.9:
                ids.append(rng.choice(special_ids) if rng.random() < 0.7 else rng.randrange(128000, vocab_size))
            else:
                ids.append(rng.randrange(vocab_size, vocab_size + 1000))  # not in the vocabulary
        skip = case % 2 == 1
        records.append({"ids": ids, "skip_special_tokens": skip, "text": tok.decode(ids, skip_special_tokens=skip)})
    return records


def transformers_records(tokenizer_dir):
    from transformers import AutoTokenizer
    auto = AutoTokenizer.from_pretrained(tokenizer_dir)
    records = []
    for text in TRANSFORMERS_STRINGS:
        ids = auto(text, add_special_tokens=True)["input_ids"]
        records.append({"text": text, "ids": ids, "decoded_skip_special": auto.decode(ids, skip_special_tokens=True)})
    info = {"class": type(auto).__name__, "bos_token_id": auto.bos_token_id, "eos_token_id": auto.eos_token_id,
            "len": len(auto)}
    return records, info


def best_of(runs, fn):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def benchmark(tok, args):
    docs = tokenizer_corpus.bench_corpus(args.bench_megabytes)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    perf = {"docs": len(docs), "bytes": nbytes}

    loop_times, loop_ids = best_of(3, lambda: [tok.encode(d, add_special_tokens=False).ids for d in docs])
    tokens = sum(len(ids) for ids in loop_ids)
    perf["tokens"] = tokens
    perf["hf_encode_loop_s"] = loop_times
    batch_times, _ = best_of(3, lambda: tok.encode_batch(docs, add_special_tokens=False))
    perf["hf_encode_batch_s"] = batch_times
    print(f"HF encode loop: {min(loop_times):.3f} s = {nbytes / 1e6 / min(loop_times):.2f} MB/s; "
          f"encode_batch (1 thread): {min(batch_times):.3f} s = {nbytes / 1e6 / min(batch_times):.2f} MB/s",
          flush=True)

    if args.mlaserve:
        try:
            perf.update(time_mlaserve(args, docs, loop_ids))
        except (OSError, subprocess.CalledProcessError, ValueError) as e:
            perf["mlaserve_error"] = repr(e) + " " + str(getattr(e, "stderr", ""))
            print(perf["mlaserve_error"], flush=True)
    return perf


def time_mlaserve(args, docs, hf_ids):
    """`mlaserve bench-tokenizer` on the same documents, and a check that
    `mlaserve tokenize` gives HF's ids for every one of them."""
    perf = {}
    corpus_path = os.path.join(args.work_dir, "bench_corpus.jsonl")
    tokenizer_corpus.write_jsonl(docs, corpus_path)
    env = dict(os.environ)
    if args.lib_dir:
        env["LD_LIBRARY_PATH"] = args.lib_dir + ":" + env.get("LD_LIBRARY_PATH", "")
    out = subprocess.run([args.mlaserve, "bench-tokenizer", "--model-path", args.tokenizer_dir, "--corpus",
                          corpus_path, "--repeat", "3"], env=env, check=True, capture_output=True, text=True)
    print(out.stdout, flush=True)
    perf["mlaserve"] = json.loads(out.stdout.strip().splitlines()[-1])
    # The same 10 MB through `mlaserve tokenize`: ids must equal HF's.
    ours = subprocess.run([args.mlaserve, "tokenize", "--model-path", args.tokenizer_dir], env=env, check=True,
                          capture_output=True, text=True, input=open(corpus_path, encoding="utf-8").read())
    our_ids = [json.loads(line) for line in ours.stdout.split("\n") if line]
    mismatched = sum(1 for a, b in zip(our_ids, hf_ids) if a != b) + abs(len(our_ids) - len(hf_ids))
    perf["mlaserve_bench_corpus_mismatched_docs"] = mismatched
    for doc, (a, b) in enumerate(zip(our_ids, hf_ids)):
        if a != b:
            at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            perf["first_mismatch"] = {"doc": doc, "token": at, "ours": a[max(0, at - 3):at + 6],
                                      "hf": b[max(0, at - 3):at + 6], "text": docs[doc][:200]}
            break
    print(f"bench corpus: {mismatched} of {len(docs)} documents tokenized differently by mlaserve", flush=True)
    return perf


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-dir", required=True, help="holds tokenizer.json and tokenizer_config.json")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--work-dir", default="/tmp", help="scratch space for the 10 MB bench corpus")
    parser.add_argument("--mlaserve", help="mlaserve binary to time on the same corpus")
    parser.add_argument("--lib-dir", help="LD_LIBRARY_PATH for the mlaserve binary")
    parser.add_argument("--bench-megabytes", type=float, default=10.0)
    args = parser.parse_args()
    if tokenizers is None:
        sys.exit("make_tokenizer_golden.py needs the Python package `tokenizers` (present on the GPU machine)")

    os.makedirs(args.out_dir, exist_ok=True)
    tok = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    start = time.perf_counter()
    golden = golden_records(tok)
    write_jsonl(golden, os.path.join(args.out_dir, "golden.jsonl"))
    write_jsonl(decode_records(tok), os.path.join(args.out_dir, "golden_decode.jsonl"))
    print(f"golden: {len(golden)} strings in {time.perf_counter() - start:.1f} s", flush=True)

    # The benchmark still runs if transformers cannot load the directory.
    try:
        import transformers
        transformers_version = transformers.__version__
        records, auto_info = transformers_records(args.tokenizer_dir)
        write_jsonl(records, os.path.join(args.out_dir, "golden_transformers.jsonl"))
    except Exception as e:  # noqa: BLE001 - reported in perf.json and the log
        transformers_version, auto_info = None, {"error": repr(e)}
    print(f"transformers: {auto_info}", flush=True)

    perf = benchmark(tok, args)
    perf.update({
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
        "transformers": transformers_version,
        "auto_tokenizer": auto_info,
    })
    with open(os.path.join(args.out_dir, "perf.json"), "w") as f:
        json.dump(perf, f, indent=1)
    print(json.dumps(perf), flush=True)


if __name__ == "__main__":
    main()
