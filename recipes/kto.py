"""KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization") from binary feedback,
as a loop over the sessions API: a LoRA policy whose reference is the same model with the adapter switched off.

    python recipes/kto.py                                         # the toy task: the verifier's verdicts
    python recipes/kto.py --model /path/to/Qwen2.5-0.5B-Instruct --max_tokens 512 \\
        --train_files data/prepared/gsm8k_train.jsonl --val_files data/prepared/gsm8k_test.jsonl

Feedback: K samples per prompt from the starting policy, each marked desirable or undesirable by the verifier
(gsm8k_reward; the judge's verdicts would do as well). KTO needs no pairs. For a completion y of prompt x:

    r(x, y) = log pi(y|x) - log pi_ref(y|x)                    the implicit reward (summed over y's tokens)
    z_0     = max(0, mean over the batch of r(x, y'))           the KL term, on mismatched pairs (x_i, y_{i+1}),
                                                                without gradient (as the paper's HALOs code)
    v(x, y) = lambda_D * sigmoid(beta * (r - z_0))  if y is desirable
              lambda_U * sigmoid(beta * (z_0 - r))  if y is undesirable
    loss    = mean(lambda_y - v(x, y))

The loss is not one of the built-in ones, so it goes through forward_backward_custom: the session hands the
loss the policy's per-token log-probs and backpropagates whatever it returns.
"""
from __future__ import annotations

import argparse
import random

import common  # the options and ending every recipe shares
import torch

from common import accuracy, answer_of, prompt_tokens
from minirl.data import load_rows
from minirl.rewards import gsm8k_reward
from minirl.sessions import AdamParams, Datum, SamplingParams, ServiceClient


def kto_loss(logp: torch.Tensor, ref_logp: torch.Tensor, kl_logp: torch.Tensor, kl_ref_logp: torch.Tensor,
             desirable: torch.Tensor, beta: float, lambda_d: float, lambda_u: float):
    """Sequence log-probs (n,) of the batch, and of its mismatched pairs for z_0 -> (loss, metrics)."""
    r = logp - ref_logp
    z0 = (kl_logp - kl_ref_logp).mean().clamp(min=0).detach()
    v = torch.where(desirable, lambda_d * torch.sigmoid(beta * (r - z0)), lambda_u * torch.sigmoid(beta * (z0 - r)))
    lam = torch.where(desirable, torch.tensor(lambda_d), torch.tensor(lambda_u))
    rd = r.detach()
    metrics = {"kl": float(z0), "rewards/desirable": float(rd[desirable].mean()) if desirable.any() else 0.0,
               "rewards/undesirable": float(rd[~desirable].mean()) if (~desirable).any() else 0.0}
    return (lam - v).mean(), metrics


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--prompts", type=int, default=64)              # prompts to collect feedback on
    p.add_argument("--samples_per_prompt", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_tokens", type=int, default=8)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--lambda_d", type=float, default=0.0)          # 0: n_undesirable / n_desirable (see main)
    p.add_argument("--lambda_u", type=float, default=1.0)
    p.add_argument("--lora_rank", type=int, default=16)
    p.add_argument("--lora_alpha", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def sequence_logps(per_token: list, completions: list[list[int]]) -> torch.Tensor:
    """Sum of each completion's token log-probs, from compute_logprobs' whole-sequence lists."""
    return torch.tensor([sum(lps[-len(c):]) for lps, c in zip(per_token, completions)])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    svc = ServiceClient()
    rank, world = svc.process_index, svc.num_processes
    tc = svc.create_lora_training_client(args.model, rank=args.lora_rank, alpha=args.lora_alpha,
                                         seed=args.seed).result()
    tok = tc.get_tokenizer()
    ref = tc.create_sampling_client(use_adapter=False).result()  # pi_ref: the base model, no second copy (minirl)
    sc = tc.save_weights_and_get_sampling_client().result()     # the starting policy
    rows = load_rows(args.train_files, split="train")
    val_rows = load_rows(args.val_files, split="test", limit=args.val_max_samples) if args.val_files else []
    torch.manual_seed(args.seed * 1000 + rank)
    rng = random.Random(args.seed * 1000 + rank)
    before = accuracy(sc, tok, val_rows, args.max_tokens, rank, world) if val_rows else None

    # --- binary feedback on the starting policy's own samples ----------------------------------------------
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    chosen = rng.sample(rows, args.prompts)
    futures = [(r, p, sc.sample(p, args.samples_per_prompt, params)) for r in chosen if (p := prompt_tokens(tok, r))]
    examples = [(p, s.tokens, gsm8k_reward(tok.decode(s.tokens, skip_special_tokens=True), answer_of(r)) == 1.0)
                for r, p, f in futures for s in f.result().sequences]

    # the paper's rule for unbalanced feedback: lambda_D * n_D / (lambda_U * n_U) in [1, 4/3]; we take 1
    n_d = sum(e[2] for e in examples)
    lambda_d = args.lambda_d or args.lambda_u * (len(examples) - n_d) / max(n_d, 1)

    # --- KTO steps -------------------------------------------------------------------------------------------
    history = []
    for step in range(args.steps):
        batch = rng.sample(examples, min(args.batch_size, len(examples)))
        prompts, completions = [b[0] for b in batch], [b[1] for b in batch]
        mismatched = completions[1:] + completions[:1]  # (x_i, y_{i+1}): the batch's estimate of z_0
        pairs = list(zip(prompts, completions)) + list(zip(prompts, mismatched))
        datums = [Datum.from_completion(p, c) for p, c in pairs]
        ref_logp = sequence_logps(ref.compute_logprobs([p + c for p, c in pairs]).result(), [c for _, c in pairs])
        desirable = torch.tensor([b[2] for b in batch])
        n = len(batch)

        def loss_fn(datums: list[Datum], logprobs: list[torch.Tensor]):  # per datum, 0 under the prompt
            logp = torch.stack([lp.sum() for lp in logprobs])
            return kto_loss(logp[:n], ref_logp[:n], logp[n:], ref_logp[n:], desirable, args.beta, lambda_d,
                            args.lambda_u)

        fb = tc.forward_backward_custom(datums, loss_fn)
        op = tc.optim_step(AdamParams(learning_rate=args.lr, beta2=0.99, eps=1e-8, grad_clip_norm=1.0))
        out = fb.result()
        history.append({"step": step + 1, "loss": out.loss, **out.metrics, **op.result().metrics})
        if rank == 0:
            print(f"step {step + 1}: loss {out.loss:.4f} r+ {out.metrics['rewards/desirable']:.3f} "
                  f"r- {out.metrics['rewards/undesirable']:.3f} kl {out.metrics['kl']:.3f}")
    after = common.finish(tc, tok, val_rows, args.max_tokens, before, rank, world)
    return {"before": before, "after": after, "history": history,
            "desirable_fraction": n_d / len(examples), "lambda_d": lambda_d}


if __name__ == "__main__":
    main()
