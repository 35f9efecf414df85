#!/usr/bin/env python3
"""Renders the DeepSeek chat-template reference outputs for mlaserve's tests.

Reads the conversations in tests/data/chat/conversations.json and the Jinja
templates in tests/data/chat/templates/, renders each conversation the way
transformers' apply_chat_template runs a template, and writes
tests/data/chat/rendered.json: one expected prompt per case, with where it
came from.

Which template governs a case (tests/data/chat/README.md says why):
  v3  : tools given -> sglang_tool_deepseekv3.clean.jinja, else the official
        template from tokenizer_config.json
  r1  : tools given -> sglang_tool_deepseekr1.clean.jinja, else the official
        R1-Distill template
  v31 : tools given -> sglang_tool_deepseekv31.clean.jinja, else the official
        V3.1 template
  v32 : always the official V3.2 template (its DSML tool format is what the
        deepseekv32 tool-call parser reads)

Known bugs of the references are corrected by named patches to the template
source (PATCHES below, each with its reason) or, where no patch can express
the fix, by an expected string written by hand in the case itself
("hand_written"). Every output records which of the three it is.

The request is turned into template variables the way an OpenAI server does
before calling apply_chat_template (normalize_request): text-part arrays are
joined with "\\n", `developer` is a system message for templates without a
developer branch, add_generation_prompt defaults to true, and
chat_template_kwargs become template variables.

Usage: python3 tools/reference/render_chat_templates.py [--check]
"""
import argparse
import copy
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "tests", "data", "chat")
TEMPLATES = os.path.join(DATA, "templates")

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"

GOVERNING = {
    ("v3", False): "official_deepseek_v3.jinja",
    ("v3", True): "sglang_tool_deepseekv3.clean.jinja",
    ("r1", False): "official_deepseek_r1_distill.jinja",
    ("r1", True): "sglang_tool_deepseekr1.clean.jinja",
    ("v31", False): "official_deepseek_v3.1.jinja",
    ("v31", True): "sglang_tool_deepseekv31.clean.jinja",
    ("v32", False): "official_deepseek_v3.2.jinja",
    ("v32", True): "official_deepseek_v3.2.jinja",
}

# name -> (template file, [(old, new), ...], reason). Each `old` must occur
# in the template source exactly once.
PATCHES = {
    "sglang_v3_arguments_as_given": (
        "sglang_tool_deepseekv3.clean.jinja",
        [("{%- for tool in message['tool_calls'] %}",
          "{%- for tool in message['tool_calls'] %}{%- set args = tool['function']['arguments'] "
          "if tool['function']['arguments'] is string else tool['function']['arguments']|tojson %}"),
         ("'```json' + '\\n' + tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- else %}{{- message['content']",
          "'```json' + '\\n' + args + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- else %}{{- message['content']"),
         ("'```json' + '\\n' + tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}",
          "'```json' + '\\n' + args + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}"),
         ("'```json' + '\\n' + tool['function']['arguments'] + '\\n'",
          "'```json' + '\\n' + args + '\\n'")],
        "SGLang's V3 template JSON-encodes a string `arguments` a second time (README known bug) "
        "and fails on mapping arguments after the first call; arguments are the JSON text as given, "
        "mappings are JSON-encoded",
    ),
    "sglang_r1_arguments_as_given": (
        "sglang_tool_deepseekr1.clean.jinja",
        [("{%- for tool in message['tool_calls'] %}",
          "{%- for tool in message['tool_calls'] %}{%- set args = tool['function']['arguments'] "
          "if tool['function']['arguments'] is string else tool['function']['arguments']|tojson %}")]
        + [("tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- else %}{{- content",
            "args + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- else %}{{- content"),
           ("tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- set ns.is_first",
            "args + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- set ns.is_first"),
           ("tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor",
            "args + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor")],
        "SGLang's R1 template JSON-encodes a string `arguments` a second time (README known bug)",
    ),
    "sglang_r1_null_content": (
        "sglang_tool_deepseekr1.clean.jinja",
        [("{% if '</think>' in content %}", "{% if content is not none and '</think>' in content %}")],
        "SGLang's R1 template fails on an assistant message whose content is null (README known bug)",
    ),
    "official_v3_tool_call_turns": (
        "official_deepseek_v3.jinja",
        [("{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}",
          "{%- if message['role'] == 'assistant' and message['content'] is none %}"
          "{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{%- else %}{{'<｜Assistant｜>'}}{%- endif %}"
          "{%- set ns.is_tool = false -%}{%- set ns.is_first = false -%}{%- set ns.is_output_first = true -%}"),
         ("{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜>",
          "{%- if not ns.is_first %}{{'<｜tool▁calls▁begin｜>"),
         ("'<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}",
          "'<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}")],
        "the tokenizer_config.json V3 template closes a tool-call block only after a second call "
        "(one call is never closed, three calls close it twice), keeps its first-call and "
        "first-output state across turns, and does not end the tool outputs before a following "
        "call; DeepSeek's later V3 template (V3-0324, which SGLang's copies) closes the block once "
        "per turn, resets that state per turn and ends the outputs first",
    ),
    "official_v32_content_null": (
        "official_deepseek_v3.2.jinja",
        [("{{ message.get('content', '') }}", "{{ message.content if message.content is not none else '' }}"),
         ("{{ message.get('reasoning_content', '') }}",
          "{{ message.reasoning_content if message.reasoning_content is not none else '' }}")],
        "the V3.2 template renders a null content as the text `None` (README known bug)",
    ),
    "official_v32_generation_prompt": (
        "official_deepseek_v3.2.jinja",
        [("{%- if add_generation_prompt -%}\n  <｜User｜>{{ \"\\n\" }}<｜Assistant｜>",
          "{%- if false -%}\n  <｜User｜>{{ \"\\n\" }}<｜Assistant｜>")],
        "the V3.2 template appends a second, empty user turn after the generation prompt (README "
        "known bug); in DeepSeek's V3.2 encoding every user and tool-result turn already ends with "
        "the assistant prefix (<｜Assistant｜> and <think> or </think>), so nothing is added",
    ),
}

# Applied to every case of a kind (the bug shows in every render).
ALWAYS = {"v32": ["official_v32_content_null", "official_v32_generation_prompt"]}


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' override of Jinja's tojson (no HTML escaping).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def load_template_source(name, patches):
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
        src = f.read()
    for patch in patches:
        file, edits, _ = PATCHES[patch]
        if file != name:
            raise SystemExit(f"patch {patch} is for {file}, not {name}")
        for old, new in edits:
            count = src.count(old)
            if count != 1:
                raise SystemExit(f"patch {patch}: expected one occurrence in {name}, found {count}: {old!r}")
            src = src.replace(old, new)
    return src


def join_text_parts(content, where):
    if not isinstance(content, list):
        return content
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise SystemExit(f"{where}: only text parts are supported")
        texts.append(part["text"])
    return "\n".join(texts)


def normalize_request(kind, request, where):
    messages = copy.deepcopy(request["messages"])
    for i, m in enumerate(messages):
        if "content" in m:
            m["content"] = join_text_parts(m["content"], f"{where} message {i}")
        if m["role"] == "developer" and kind != "v32":
            m["role"] = "system"
    variables = dict(request.get("chat_template_kwargs", {}))
    if kind == "v32" and "enable_thinking" not in variables and "thinking" in variables:
        variables["enable_thinking"] = variables["thinking"]
    variables.update(
        messages=messages,
        tools=request.get("tools"),
        add_generation_prompt=request.get("add_generation_prompt", True),
        bos_token=BOS,
        eos_token=EOS,
    )
    return variables


def render_case(env, case):
    kind = case["template"]
    has_tools = bool(case["request"].get("tools"))
    template = GOVERNING[(kind, has_tools)]
    if "hand_written" in case:
        hw = case["hand_written"]
        return {"expected": hw["expected"], "source": "hand-written", "reason": hw["reason"]}
    patches = ALWAYS.get(kind, []) + case.get("patches", [])
    source = load_template_source(template, patches)
    variables = normalize_request(kind, case["request"], case["name"])
    text = env.from_string(source).render(**variables)
    out = {"expected": text, "source": template}
    if patches:
        out["patches"] = {p: PATCHES[p][2] for p in patches}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="fail if rendered.json is out of date")
    args = ap.parse_args()
    with open(os.path.join(DATA, "conversations.json"), encoding="utf-8") as f:
        cases = json.load(f)
    env = make_env()
    names = set()
    results = []
    for case in cases:
        if case["name"] in names:
            raise SystemExit(f"duplicate case name {case['name']}")
        names.add(case["name"])
        results.append({"name": case["name"], "template": case["template"], **render_case(env, case)})
    text = json.dumps(results, ensure_ascii=False, indent=1) + "\n"
    path = os.path.join(DATA, "rendered.json")
    if args.check:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit("rendered.json is out of date")
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{len(results)} cases -> {path}")


if __name__ == "__main__":
    main()
