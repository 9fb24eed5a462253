"""A real mlx-lm client as an MLX ring rank: `python lm_prog.py MODE [ARGS]`.

A small random Llama built with mlx-lm's own classes (no download, no tokenizer:
token ids are fed directly), sharded with mlx-lm's own `model.shard(group)` (tensor
parallel: two all_sum per layer per token) and run with mlx-lm's own
`generate_step`. It never imports the watchdog: run it with MLX_WATCHDOG=1 and the
zero-code activation instruments it, as it would any mlx-lm process.

Modes:
  generate [TOKENS]   generate TOKENS tokens (default 32) per round, round after round,
                      printing "round R tokens N" after each
  server DIR          mlx-lm-server style: rank 0 polls DIR for a file "request" (its
                      text: how many tokens) and shares a "have a request" flag with a
                      tiny all_sum every ~0.1 s; on a request every rank generates and
                      writes its tokens to DIR/reply-rank<R>.json; idle otherwise
  bench TOKENS ROUNDS generate ROUNDS rounds of TOKENS tokens after one warm-up round;
                      rank 0 prints one JSON line per round: {"tokens", "seconds",
                      "main_cpu"} (the main thread's CPU seconds)
  toggle TOKENS CYCLES DIR
                      the same in cycles of four rounds, plain, hook, hook, plain: the
                      hook installed (record in DIR) before a "hook" round, uninstalled
                      before a "plain" one, in the same processes on every rank; rank 0
                      prints {"kind", "tokens", "seconds", "main_cpu"} per round
"""

import json
import os
import sys
import time

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models import llama

MODE = sys.argv[1]
ARGS = sys.argv[2:]

ARGS_TINY = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2,
                            intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256)
PROMPT = [(7 * i + 3) % 256 for i in range(16)]


def build(group):
    mx.random.seed(0)  # every rank builds the same weights before taking its shard
    model = llama.Model(ARGS_TINY)
    mx.eval(model.parameters())
    model.shard(group)
    mx.eval(model.parameters())
    return model


def generate(model, tokens):
    return [token for token, _ in generate_step(mx.array(PROMPT), model, max_tokens=tokens)]


group = mx.distributed.init(backend="ring", strict=True)
rank, size = group.rank(), group.size()
model = build(group)
print(f"rank {rank} of {size} up", flush=True)

if MODE == "generate":
    tokens = int(ARGS[0]) if ARGS else 32
    done = 0
    while True:
        out = generate(model, tokens)
        if len(out) != tokens or not all(0 <= t < ARGS_TINY.vocab_size for t in out):
            print(f"WRONG tokens: {out}", flush=True)
            sys.exit(3)
        done += 1
        print(f"round {done} tokens {done * tokens}", flush=True)
elif MODE == "server":
    folder = ARGS[0]
    request = os.path.join(folder, "request")
    while True:
        wanted = 0
        if rank == 0 and os.path.exists(request):
            with open(request) as f:
                wanted = int(f.read().strip() or 0)
            os.unlink(request)
        wanted = int(mx.distributed.all_sum(mx.array([wanted])).item())
        if not wanted:
            time.sleep(0.1)
            continue
        out = generate(model, wanted)
        reply = os.path.join(folder, f"reply-rank{rank}.json")
        with open(reply + ".new", "w") as f:
            json.dump(out, f)
        os.replace(reply + ".new", reply)
        print(f"served {wanted} tokens", flush=True)
elif MODE == "bench":
    tokens, rounds = int(ARGS[0]), int(ARGS[1])
    generate(model, tokens)  # warm-up: first-call costs are not the steady rate
    for _ in range(rounds):
        began, cpu = time.perf_counter(), time.thread_time()
        out = generate(model, tokens)
        took, cpu = time.perf_counter() - began, time.thread_time() - cpu
        if rank == 0:
            print(json.dumps({"tokens": len(out), "seconds": took, "main_cpu": cpu}),
                  flush=True)
elif MODE == "toggle":
    import watchdog

    tokens, cycles, folder = int(ARGS[0]), int(ARGS[1]), ARGS[2]
    generate(model, tokens)
    for _ in range(cycles):
        for kind in ("plain", "hook", "hook", "plain"):
            if kind == "hook":
                if not watchdog.install(folder).active:
                    sys.exit("install failed")
            else:
                watchdog.uninstall()
            began, cpu = time.perf_counter(), time.thread_time()
            out = generate(model, tokens)
            took, cpu = time.perf_counter() - began, time.thread_time() - cpu
            if rank == 0:
                print(json.dumps({"kind": kind, "tokens": len(out), "seconds": took,
                                  "main_cpu": cpu}), flush=True)
else:
    sys.exit(f"unknown mode {MODE}")
