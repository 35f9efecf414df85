#!/usr/bin/env python3
"""Golden model outputs from transformers, for tests/model/golden_test.cpp.

Runs on the GPU machine (python3 there has torch and transformers; the
reference itself runs on its CPU in float32, which is deterministic). For
each case it makes the project's own random checkpoint with
`mlaserve make-model` (same preset, dtype and seed as the C++ test will),
loads it into transformers' DeepseekV3ForCausalLM / DeepseekV2ForCausalLM
(block-FP8 weights dequantized here: w * weight_scale_inv of its 128x128
block), runs fixed token sequences and writes tests/data/model/<case>.json:

- for every prefix length of every sequence: the last position's top-64
  logits with their ids and the log-sum-exp of the full 129280-wide row;
- a 32-token greedy continuation of each sequence (recomputed from scratch
  each step, no cache) and the smallest top-1/top-2 logit gap seen on the way;
- for checkpoints with an MTP layer: the MTP block's logits per position
  (top-64 + log-sum-exp). transformers has no MTP module, so it is built here
  from transformers' own DeepseekV3DecoderLayer and DeepseekV3RMSNorm:
  logits_i = head(norm(block(eh_proj([enorm(embed(t_{i+1})) | hnorm(h_i)]))))
  with h_i the main model's final-normed hidden state at position i.

Deliberate deviation, printed when it applies: transformers' DeepseekV2
attention omits the YaRN mscale(factor, mscale_all_dim)^2 softmax factor
that DeepSeek's own V2 code (and transformers' V3) applies; the script sets
DeepSeek's value on every attention module so the reference is DeepSeek's math.

Workaround, also printed: transformers' DeepseekV2Moe reads
self.num_experts for group_limited_greedy routing but never sets it; the
script sets it to n_routed_experts.

Usage (GPU machine, repo root):
  python3 tools/reference/make_model_golden.py --mlaserve .device/mlaserve \
      --mlaserve-lib-dir .device/lib --tokenizer-dir assets/tokenizer --out $OUT
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import traceback

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

CASES = [
    # name, preset, dtype, seed
    ("tiny", "tiny", "bf16", 0),
    ("tiny_v2", "tiny-v2", "bf16", 0),
    ("tiny_fp8", "tiny", "fp8", 0),
]
SEQUENCE_LENGTHS = [8, 13, 24]
SEQUENCE_SEED = 20261121
TOP_K = 64
GREEDY_TOKENS = 32
FP8_BLOCK = 128


def token_sequences(vocab_size):
    """Fixed pseudo-random token sequences, each starting with BOS (id 0)."""
    rng = random.Random(SEQUENCE_SEED)
    return [[0] + [rng.randrange(1, vocab_size) for _ in range(n - 1)] for n in SEQUENCE_LENGTHS]


def load_checkpoint_tensors(model_dir):
    """All tensors of the checkpoint as float32, block-FP8 weights dequantized."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    raw = {}
    for name in files:
        raw.update(load_file(os.path.join(model_dir, name)))
    out = {}
    for name, t in raw.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            scale = raw[name + "_scale_inv"].float()
            n, k = t.shape
            full = scale.repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
            out[name] = t.float() * full
        else:
            out[name] = t.float()
    return out


def experts_of(tensors, prefix, num_experts, proj):
    return [tensors[f"{prefix}experts.{e}.{proj}.weight"] for e in range(num_experts)]


def fit(name, source, param):
    """source as shaped like param (fused expert tensors may be stored transposed)."""
    if source.shape == param.shape:
        return source
    if source.dim() == 3 and source.transpose(1, 2).shape == param.shape:
        return source.transpose(1, 2).contiguous()
    sys.exit(f"{name}: checkpoint gives {tuple(source.shape)}, transformers expects {tuple(param.shape)}")


def state_dict_for(module, tensors, src_prefix, dst_prefix, num_experts):
    """Maps checkpoint tensors (HF release names) onto `module`'s parameters.

    Per-expert gate/up/down weights are stacked when transformers keeps the
    experts as fused 3-D tensors (gate_up_proj {E, 2I, D}, down_proj {E, D, I}).
    Exits naming any parameter it cannot fill."""
    sd = {}
    used = set()
    for key, param in module.state_dict().items():
        name = src_prefix + key[len(dst_prefix):]
        if name in tensors:
            sd[key] = fit(name, tensors[name], param)
            used.add(name)
            continue
        m = re.match(r"(.*mlp\.)experts\.(gate_up_proj|down_proj)$", name)
        if m:
            p = m.group(1)
            if m.group(2) == "gate_up_proj":
                gates = experts_of(tensors, p, num_experts, "gate_proj")
                ups = experts_of(tensors, p, num_experts, "up_proj")
                stacked = torch.stack([torch.cat([g, u], 0) for g, u in zip(gates, ups)])
                used.update(f"{p}experts.{e}.{w}.weight" for e in range(num_experts) for w in ("gate_proj", "up_proj"))
            else:
                stacked = torch.stack(experts_of(tensors, p, num_experts, "down_proj"))
                used.update(f"{p}experts.{e}.down_proj.weight" for e in range(num_experts))
            sd[key] = fit(name, stacked, param)
            continue
        sys.exit(f"transformers parameter {key} (checkpoint name {name}) has no source in the checkpoint")
    return sd, used


def deepseek_softmax_scale(cfg):
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling") or {}
    if rs.get("type", rs.get("rope_type")) == "yarn" and rs.get("mscale_all_dim"):
        factor = rs["factor"]
        m = 0.1 * rs["mscale_all_dim"] * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale *= m * m
    return scale


def set_deepseek_scaling(model, cfg):
    want = deepseek_softmax_scale(cfg)
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("Attention") and hasattr(mod, "scaling"):
            if abs(mod.scaling - want) > 1e-12 * want:
                print(f"  note: {name}.scaling {mod.scaling:.9g} -> DeepSeek's {want:.9g}")
                mod.scaling = want


def patch_v2_moe(model, cfg):
    for name, mod in model.named_modules():
        if type(mod).__name__ == "DeepseekV2Moe" and not hasattr(mod, "num_experts"):
            print(f"  note: {name}.num_experts unset in transformers; set to {cfg['n_routed_experts']}")
            mod.num_experts = cfg["n_routed_experts"]


def top_and_lse(row):
    row = row.double()
    vals, ids = torch.topk(row, TOP_K)
    return {
        "top_ids": [int(i) for i in ids],
        "top_logits": [round(float(v), 6) for v in vals],
        "logsumexp": round(float(torch.logsumexp(row, 0)), 6),
    }


def causal_mask(n):
    return torch.full((n, n), float("-inf")).triu(1)[None, None]


def layer_out(result):
    return result[0] if isinstance(result, tuple) else result


def run_layers_by_hand(model, ids):
    """The main model recomputed layer by layer the way the MTP block is run,
    to check the calling convention (mask, rotary) against model(ids)."""
    inner = model.model
    pos = torch.arange(len(ids))[None]
    h = inner.embed_tokens(torch.tensor([ids]))
    pe = inner.rotary_emb(h, pos)
    for layer in inner.layers:
        h = layer_out(layer(h, attention_mask=causal_mask(len(ids)), position_ids=pos, position_embeddings=pe))
    return model.lm_head(inner.norm(h))[0]


class MtpReference(torch.nn.Module):
    def __init__(self, config, tensors, index):
        super().__init__()
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm

        d, v = config.hidden_size, config.vocab_size
        self.embed_tokens = torch.nn.Embedding(v, d)
        self.enorm = DeepseekV3RMSNorm(d, eps=config.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(d, eps=config.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * d, d, bias=False)
        self.block = DeepseekV3DecoderLayer(config, layer_idx=index)
        self.norm = DeepseekV3RMSNorm(d, eps=config.rms_norm_eps)
        self.head = torch.nn.Linear(d, v, bias=False)
        p = f"model.layers.{index}."
        sd = {
            "embed_tokens.weight": tensors[p + "embed_tokens.weight"],
            "enorm.weight": tensors[p + "enorm.weight"],
            "hnorm.weight": tensors[p + "hnorm.weight"],
            "eh_proj.weight": tensors[p + "eh_proj.weight"],
            "norm.weight": tensors[p + "shared_head.norm.weight"],
            "head.weight": tensors[p + "shared_head.head.weight"],
        }
        block_sd, _ = state_dict_for(self.block, tensors, p, "", config.n_routed_experts)
        sd.update({"block." + k: v for k, v in block_sd.items()})
        self.load_state_dict(sd, strict=True)

    def forward(self, next_ids, hidden, rotary):
        n = len(next_ids)
        pos = torch.arange(n)[None]
        e = self.enorm(self.embed_tokens(torch.tensor([next_ids])))
        x = self.eh_proj(torch.cat([e, self.hnorm(hidden[None])], -1))
        x = layer_out(self.block(x, attention_mask=causal_mask(n), position_ids=pos, position_embeddings=rotary(x, pos)))
        return self.head(self.norm(x))[0]


def build_reference(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    config = AutoConfig.from_pretrained(model_dir)
    if getattr(config, "quantization_config", None) is not None:
        try:  # weights are dequantized to f32 here
            del config.quantization_config
        except AttributeError:
            config.quantization_config = None
    config._attn_implementation = "eager"
    if hasattr(config, "_experts_implementation"):
        config._experts_implementation = "eager"
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    except TypeError:  # transformers 4.x spelling
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    model = model.float().eval()
    tensors = load_checkpoint_tensors(model_dir)
    sd, used = state_dict_for(model, tensors, "", "", cfg.get("n_routed_experts") or 0)
    model.load_state_dict(sd, strict=True)
    n_main = cfg["num_hidden_layers"]
    leftover = [n for n in tensors if n not in used and not n.startswith(f"model.layers.{n_main}.")]
    if cfg.get("tie_word_embeddings"):
        leftover = [n for n in leftover if n != "lm_head.weight"]
    if leftover:
        sys.exit(f"checkpoint tensors not used by the reference: {leftover[:8]}")
    set_deepseek_scaling(model, cfg)
    patch_v2_moe(model, cfg)
    mtp = None
    if cfg.get("num_nextn_predict_layers", 0) > 0:
        mtp = MtpReference(config, tensors, n_main).float().eval()
        set_deepseek_scaling(mtp, cfg)
    return cfg, model, mtp


@torch.no_grad()
def golden_case(args, work, name, preset, dtype, seed):
    model_dir = os.path.join(work, name)
    env = dict(os.environ)
    if args.mlaserve_lib_dir:  # the binary's shared libraries, for it alone (not for torch)
        env["LD_LIBRARY_PATH"] = args.mlaserve_lib_dir + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    subprocess.run([args.mlaserve, "make-model", "--preset", preset, "--dtype", dtype, "--seed", str(seed),
                    "--out", model_dir, "--tokenizer-dir", args.tokenizer_dir], check=True, env=env)
    cfg, model, mtp = build_reference(model_dir)
    out = {"case": name, "preset": preset, "dtype": dtype, "seed": seed,
           "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, float32 on CPU",
           "architecture": cfg["architectures"][0], "sequences": []}
    for ids in token_sequences(cfg["vocab_size"]):
        logits = model(torch.tensor([ids])).logits[0]
        by_hand = run_layers_by_hand(model, ids)
        check = float((by_hand - logits).abs().max())
        if check > 1e-4:
            print(f"  WARNING {name}: layer-by-layer recomputation differs from model() by {check}; "
                  "the MTP reference (run the same way) is suspect")
        seq = {"input_ids": ids, "prefixes": [top_and_lse(logits[p]) for p in range(len(ids))],
               "layer_by_layer_check_max_abs": check}

        tokens, min_gap = list(ids), float("inf")
        for _ in range(GREEDY_TOKENS):
            row = model(torch.tensor([tokens])).logits[0, -1]
            top2 = torch.topk(row, 2).values
            min_gap = min(min_gap, float(top2[0] - top2[1]))
            tokens.append(int(torch.argmax(row)))
        seq["greedy"] = tokens[len(ids):]
        seq["greedy_min_top2_gap"] = round(min_gap, 6)

        if mtp is not None:
            hidden = model.model(torch.tensor([ids])).last_hidden_state[0]
            mtp_logits = mtp(ids[1:], hidden[:-1], model.model.rotary_emb)
            seq["mtp"] = [top_and_lse(mtp_logits[i]) for i in range(len(ids) - 1)]
        out["sequences"].append(seq)
        print(f"  {name}: sequence of {len(ids)} done (greedy min top-2 gap {min_gap:.4g})")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mlaserve", required=True, help="path to the mlaserve binary (for make-model)")
    ap.add_argument("--mlaserve-lib-dir", help="LD_LIBRARY_PATH entry for the binary only")
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--out", required=True, help="folder for <case>.json")
    ap.add_argument("--cases", nargs="*", default=[c[0] for c in CASES])
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for name, preset, dtype, seed in CASES:
            if name not in args.cases:
                continue
            print(f"{name}: make-model --preset {preset} --dtype {dtype} --seed {seed}", flush=True)
            try:
                result = golden_case(args, work, name, preset, dtype, seed)
            except Exception:  # report and go on with the other cases
                traceback.print_exc()
                continue
            with open(os.path.join(args.out, f"{name}.json"), "w") as f:
                json.dump(result, f, separators=(",", ":"))
                f.write("\n")


if __name__ == "__main__":
    main()
