#!/usr/bin/env python3
"""Collects the argument lists of Megatron-LM's GPT example scripts and GPT
functional-test configs into cmd/gotron/testdata/megatron/configs.

Usage: collect_configs.py MEGATRON_CHECKOUT OUT_DIR

Sources (Megatron-LM d98e8a6):
  tests/functional_tests/test_cases/gpt/*/model_config.yaml  MODEL_ARGS
  examples/gpt3/*.sh, examples/llama/*.sh                     the arrays passed to pretrain_gpt.py

Each config becomes OUT_DIR/NAME.args: one argument per line, as Megatron's
launcher passes it ("--flag value", or "--flag" for `true`; a `false` boolean
is left out, as the functional-test launcher leaves it out). Values are
Megatron's own; the harness (cmd/gotron/megatron_compat_test.go) scales the
model down and points data, checkpoint and log paths at its own files when it
runs them: the files here are what Megatron runs, unchanged.
"""
import os
import re
import shlex
import sys

import yaml


def from_model_config(path):
    with open(path) as f:
        cfg = yaml.safe_load(f)
    args = cfg.get("MODEL_ARGS") or {}
    lines = []
    for k, v in args.items():
        if v is True:
            lines.append(k)
        elif v is False or v is None:
            continue
        elif isinstance(v, list):  # nargs: the launcher passes the items as words
            lines.append(f"{k} " + " ".join(str(x) for x in v))
        elif isinstance(v, str) and re.fullmatch(r"\[[^]]+\]", v.strip()):
            # A string in brackets ("[2 2]"): the launcher
            # (tests/functional_tests/shell_test_utils/_run_training.sh) strips
            # the brackets and passes the words unquoted, as nargs values.
            lines.append(f"{k} " + v.strip()[1:-1])
        else:
            lines.append(f"{k} {v}")
    return lines


TORCHRUN = {"nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port"}


def from_script(path):
    """The --flags of a bash launch script: every --name [value] token in its
    argument arrays, with ${VAR} left as written."""
    text = open(path).read()
    text = re.sub(r"\\\n", " ", text)
    # Constants the script assigns (TP_SIZE=1) are written in; variables it
    # takes from its caller (paths) stay as ${NAME}.
    consts = dict(re.findall(r"^([A-Z_][A-Z0-9_]*)=([0-9][0-9.]*)\s*$", text, re.M))
    for name, value in consts.items():
        text = re.sub(r"\$\{?" + name + r"\b\}?", value, text)
    lines = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "--" not in line or line.startswith(("echo", "if", "export")):
            continue
        try:
            toks = shlex.split(line)
        except ValueError:
            continue
        i = 0
        while i < len(toks):
            t = toks[i].strip("()")
            if t.lstrip("-") in TORCHRUN:  # torchrun's own options, not pretrain_gpt.py's
                i += 2
                continue
            if t.startswith("--") and len(t) > 2 and re.match(r"^--[a-z0-9][a-z0-9_-]*$", t):
                if i + 1 < len(toks) and not toks[i + 1].startswith("--") and toks[i + 1].strip("()"):
                    lines.append(f"{t} {toks[i + 1].strip('()')}")
                    i += 2
                    continue
                lines.append(t)
            i += 1
    return lines


def main():
    root, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    n = 0
    gpt = os.path.join(root, "tests/functional_tests/test_cases/gpt")
    for name in sorted(os.listdir(gpt)):
        p = os.path.join(gpt, name, "model_config.yaml")
        if os.path.exists(p):
            lines = from_model_config(p)
            if lines:
                mode = (yaml.safe_load(open(p)).get("MODE") or "pretraining")
                write(out, "test_" + name, [f"# {os.path.relpath(p, root)} (MODE {mode})"] + lines)
                n += 1
    for d in ("examples/gpt3", "examples/llama"):
        for name in sorted(os.listdir(os.path.join(root, d))):
            if name.endswith(".sh"):
                lines = from_script(os.path.join(root, d, name))
                if lines:
                    write(out, "example_" + name[:-3], [f"# {d}/{name} (MODE pretraining)"] + lines)
                    n += 1
    print(f"{n} configs", file=sys.stderr)


def write(out, name, lines):
    with open(os.path.join(out, name + ".args"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
