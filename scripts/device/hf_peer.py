#!/usr/bin/env python3
"""The side-by-side peer for bench_model_cuda: Hugging Face transformers,
eager attention, bf16, on the same random-weight checkpoint, same prompt and
output lengths. Runs on the GPU machine (torch + transformers are there).

usage: hf_peer.py CHECKPOINT_DIR [--batches 1,8] [--input 512] [--output 32]
Prints one markdown row per batch: decode tok/s and ms/step (prefill excluded:
the first token is timed separately), prefill tok/s.
"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--input", type=int, default=512)
    ap.add_argument("--output", type=int, default=32)
    a = ap.parse_args()
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(a.dir, torch_dtype=torch.bfloat16, attn_implementation="eager").cuda()
    model.eval()
    print(f"transformers loaded in {time.time() - t0:.1f} s")
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    for b in [int(x) for x in a.batches.split(",")]:
        ids = torch.randint(0, vocab, (b, a.input), generator=g).cuda()
        kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
            torch.cuda.synchronize()
            t = time.time()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
            torch.cuda.synchronize()
            prefill = time.time() - t
            t = time.time()
            model.generate(ids, max_new_tokens=a.output, min_new_tokens=a.output, **kw)
            torch.cuda.synchronize()
            total = time.time() - t
        decode = max(total - prefill, 1e-9) / (a.output - 1)
        print(f"| transformers eager bs {b} (in {a.input}, out {a.output}) | {b / decode:.1f} tok/s decode "
              f"| {decode * 1e3:.1f} ms/step | prefill {b * a.input / prefill:.0f} tok/s |", flush=True)


if __name__ == "__main__":
    main()
