"""lm-evaluation-harness against minirl's server and against its own `hf` backend, on the same model and rows:
does a user who points lm-eval at `python -m minirl.sessions.serve` get lm-eval's own numbers?

    pip install "lm-eval[api]==0.4.13"
    HF_HUB_OFFLINE=1 python scripts/compare_lm_eval.py --model tiny --rows 20 [--json out.json]

Two local tasks over toy sums ("What is 3+4?"), written as JSONL and YAML into a temporary folder:
`minirl_sums_gen` (generate_until, exact match against "#### 7") and `minirl_sums_mc` (multiple_choice: the
loglikelihood of three answers), three ways:

    generate_until via chat          local-chat-completions (the server applies the chat template)
    generate_until via completions   local-completions: token-id prompts, no chat template
    loglikelihood (multiple choice)  local-completions: the chat-templated prompt and each answer as token ids,
                                     echo + logprobs, max_tokens 1

each against lm-eval's `hf` backend with the same prompts (chat template or not). The table gives each
side's score and how many rows gave the same output: the same text for a generation; for a multiple-choice
row the same answer and every choice's log-likelihood within 1e-4 (with the same is-greedy flag). The server
answers lm-eval's requests concurrently (`--num_concurrent`) and in batches (`--batch_size` prompts per
completions request), so its batching is exercised too.
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

GEN_TASK = """task: minirl_sums_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {rows}
test_split: test
output_type: generate_until
doc_to_text: "What is {{{{a}}}}+{{{{b}}}}?"
doc_to_target: target
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 16
  do_sample: false
  temperature: 0.0
metric_list:
  - metric: exact_match
"""
MC_TASK = """task: minirl_sums_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {rows}
test_split: test
output_type: multiple_choice
doc_to_text: "What is {{{{a}}}}+{{{{b}}}}?"
doc_to_choice: choices
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
"""


def write_tasks(folder: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        choices = [f"#### {a + b + d}" for d in (-1, 0, 1)]
        rng.shuffle(choices)
        rows.append({"a": a, "b": b, "target": f"#### {a + b}", "choices": choices,
                     "label": choices.index(f"#### {a + b}")})
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "gen.yaml").write_text(GEN_TASK.format(rows=folder / "rows.jsonl"))
    (folder / "mc.yaml").write_text(MC_TASK.format(rows=folder / "rows.jsonl"))


def evaluate(model: str, model_args: dict, tasks: list[str], chat: bool, folder: Path) -> dict:
    """{task: (score, [per-row output])} for one lm-eval run."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    out = simple_evaluate(model=model, model_args=model_args, tasks=tasks, apply_chat_template=chat,
                          task_manager=TaskManager(include_path=str(folder), include_defaults=False),
                          log_samples=True, bootstrap_iters=0)
    result = {}
    for task in tasks:
        metric = "exact_match,none" if task.endswith("gen") else "acc,none"
        rows = sorted(out["samples"][task], key=lambda s: s["doc_id"])
        result[task] = (out["results"][task][metric], [s["resps"] for s in rows])
    return result


def same_output(a, b) -> bool:
    """One row's outputs: a generation's text, or each choice's (loglikelihood, is_greedy)."""
    if isinstance(a[0][0], str):
        return a[0][0] == b[0][0]
    pairs = [(x[0], y[0]) for x, y in zip(a, b)]
    argmax = lambda r: max(range(len(r)), key=lambda i: r[i][0][0])  # noqa: E731
    return argmax(a) == argmax(b) and all(abs(float(x[0]) - float(y[0])) <= 1e-4 and x[1] == y[1]
                                          for x, y in pairs)


def max_loglikelihood_gap(rows_a, rows_b) -> float | None:
    """The largest |loglikelihood difference| over every choice of every row (None for generations)."""
    if isinstance(rows_a[0][0][0], str):
        return None
    return max(abs(float(x[0][0]) - float(y[0][0])) for a, b in zip(rows_a, rows_b) for x, y in zip(a, b))


def compare(model: str, rows: int, num_concurrent: int, batch_size: int) -> list[dict]:
    from minirl.models import resolve_model_path
    from minirl.sessions import ServiceClient
    from minirl.sessions.serve import serve
    path = str(resolve_model_path(model))
    sampler = ServiceClient().create_sampling_client(path)
    server = serve(sampler, sampler.tokenizer, path, port=0)
    hf = {"pretrained": path, "dtype": "float32", "device": "cpu", "batch_size": 1}
    api = {"model": path, "tokenizer": path, "tokenizer_backend": "huggingface", "num_concurrent": num_concurrent,
           "max_retries": 1, "timeout": 120}
    gen, mc = "minirl_sums_gen", "minirl_sums_mc"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            write_tasks(folder, rows)
            completions = {**api, "base_url": f"{server.url}/completions", "batch_size": batch_size}
            hf_chat = evaluate("hf", hf, [gen, mc], True, folder)
            hf_raw = evaluate("hf", hf, [gen], False, folder)
            served_chat = evaluate("local-chat-completions", {**api, "base_url": f"{server.url}/chat/completions"},
                                   [gen], True, folder)
            served_raw = evaluate("local-completions", completions, [gen], False, folder)
            served_mc = evaluate("local-completions", completions, [mc], True, folder)
    finally:
        server.close()
    table = []
    for kind, served, ours, task in [("generate_until via chat", served_chat, hf_chat, gen),
                                     ("generate_until via completions", served_raw, hf_raw, gen),
                                     ("loglikelihood (multiple choice)", served_mc, hf_chat, mc)]:
        (s_score, s_rows), (h_score, h_rows) = served[task], ours[task]
        table.append({"task type": kind, "minirl.serve": s_score, "lm-eval hf": h_score,
                      "identical outputs": sum(same_output(a, b) for a, b in zip(s_rows, h_rows)), "rows": rows,
                      "max |loglikelihood gap|": max_loglikelihood_gap(s_rows, h_rows)})
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="a model folder, or tiny / smollm2-135m")
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--num_concurrent", type=int, default=4)
    ap.add_argument("--batch_size", type=int, default=4, help="prompts per /v1/completions request")
    ap.add_argument("--json", help="also write the table here")
    args = ap.parse_args()
    table = compare(args.model, args.rows, args.num_concurrent, args.batch_size)
    print("| task type | minirl.serve | lm-eval hf | identical outputs | max loglikelihood gap |\n"
          "|---|---|---|---|---|")
    for r in table:
        gap = r["max |loglikelihood gap|"]
        print(f"| {r['task type']} | {r['minirl.serve']:.3f} | {r['lm-eval hf']:.3f} | "
              f"{r['identical outputs']}/{r['rows']} | {'-' if gap is None else f'{gap:.1e}'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
