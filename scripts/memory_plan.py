"""Per-GPU memory of a training run, phase by phase, before renting the GPUs: nothing is loaded or downloaded.

    python scripts/memory_plan.py --config recipes/gsm8k.yaml --model qwen2.5-7b --gpus 8 --gpu_gib 80 --fsdp true
    python scripts/memory_plan.py --config recipes/code.yaml --model /path/to/config.json --gpus 8 --gpu_gib 40

`--model` is a preset below (the sizes of a model's config.json) or a config.json / model folder; any other
`--key value` overrides the config as train.py's command line does. The model is built on the meta device from
its config (no memory) to count its parameters exactly; the sizes are those the code uses:
- trained weights, gradients and AdamW's two moments are fp32 (4 + 4 + 8 bytes a parameter), divided by the
  number of GPUs under FSDP; gradients live from backward to the optimizer step (zero_grad frees them);
- the KL reference: in the compute dtype on every GPU, or under FSDP in fp32 shards like the policy; PPO's
  critic: fp32 weights, gradients and AdamW (16 bytes a parameter), replicated, or under FSDP sharded too;
- rollouts: FSDP gathers a compute-dtype copy of the whole model (`distributed.gathered`); plain data parallel
  computes under autocast, which caches a compute-dtype copy of every weight for as long as it is on;
- the rollout's key/value cache: layers x kv heads x (key + value dims) per token (`rollout.kv_bytes_per_row`),
  in the compute dtype under FSDP and fp32 under autocast (RoPE's fp32 cos/sin promote the keys), capped by
  `rollout_kv_budget_gb` or `rollout.KV_SHARE_OF_FREE` of what is free (`rollout.chunk_groups`);
- the LM head's logits: chunks of `logprobs.MAX_CHUNK_TOKENS` tokens and `LOGITS_PER_CHUNK` logits, fp32;
- activations (update): what autograd keeps a layer for a token (ACT_* below), x tokens of a micro-batch x
  layers; with gradient checkpointing each layer keeps its input and one layer's activations are rebuilt;
- vLLM (rollout_engine: vllm): a server of its own with fp32 weights, which takes its default 90% of a GPU.
Sequences are counted at full length: prompts at `max_prompt_length` (or `--prompt_tokens`), responses at
`max_new_tokens`. What it leaves out: the allocator's fragmentation and CUDA's context (~0.5-1 GiB a GPU).
Checked by tests/core/test_memory_plan.py against CPU peaks and the one GPU figure on record.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2**30
HEADROOM_GIB = 4  # CUDA's context, the allocator's fragmentation, NCCL's buffers: not planned, left free
PRESETS = {  # the sizes of each model's config.json (Qwen2.5 family)
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "qwen2.5-7b": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       tie_word_embeddings=False),
}
# What autograd keeps for backward, per layer and token, in units of a hidden vector (h) and of the MLP width (I):
# in the compute dtype the q/k/v and attention outputs, both norms' outputs, gate, up, act(gate) and their
# product (4h + 2 kv + 4I); in the residual dtype (fp32 under autocast) both norms' inputs and normalised values (4h)
ACT_COMPUTE_H, ACT_COMPUTE_I, ACT_RESIDUAL_H = 4, 4, 4


def model_sizes(model: str) -> dict:
    """Parameters and shapes of a preset or a config.json, counted on a meta-device model."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM
    if model in PRESETS:
        sizes = dict(PRESETS[model])
        config = AutoConfig.for_model(sizes.pop("model_type"), **sizes)
    else:
        path = Path(model)
        config = AutoConfig.from_pretrained(path.parent if path.name == "config.json" else path)
    with init_empty_weights():
        meta = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    meta.tie_weights()  # lm_head = embeddings where the config says so: counted once
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    layer = sum(p.numel() for p in meta.get_decoder().layers[0].parameters())
    params = sum(p.numel() for p in meta.parameters())
    return dict(params=params, layer_params=layer, root_params=params - layer * c.num_hidden_layers,
                layers=c.num_hidden_layers, hidden=c.hidden_size, inter=c.intermediate_size, vocab=c.vocab_size,
                kv_dim=(getattr(c, "num_key_value_heads", None) or heads) * head_dim)


def activation_bytes(m: dict, tokens: int, compute: int, residual: int, checkpointing: bool) -> int:
    """Activations autograd keeps through one micro-batch's forward (`tokens` = sequences x length)."""
    per_layer = compute * (ACT_COMPUTE_H * m["hidden"] + 2 * m["kv_dim"] + ACT_COMPUTE_I * m["inter"]) \
        + residual * ACT_RESIDUAL_H * m["hidden"]
    if checkpointing:  # every layer's input kept; in backward one layer's activations rebuilt, and gradients
        # through them: 1.5 layers' worth at once (measured on CPU, tests/core/test_memory_plan.py)
        return tokens * (m["layers"] * residual * m["hidden"] + 3 * per_layer // 2)
    return tokens * m["layers"] * per_layer


def logits_bytes(m: dict) -> int:
    """One chunk of the LM head's fp32 logits, with its log-softmax and its gradient (logprobs._chunk_logp)."""
    from minirl.logprobs import LOGITS_PER_CHUNK, MAX_CHUNK_TOKENS
    return 3 * 4 * m["vocab"] * max(1, min(MAX_CHUNK_TOKENS, LOGITS_PER_CHUNK // m["vocab"]))


def plan(cfg, m: dict, gpus: int, gpu_bytes: float, prompt_tokens: int, compute: int = 2) -> dict:
    """Bytes per GPU of each part, and each phase's peak (`peak/<phase>`). `compute`: bytes of the compute
    dtype (2 for bf16 on a GPU, 4 for fp32 on a CPU)."""
    from minirl.rollout import KV_SHARE_OF_FREE
    P, shards = m["params"], gpus if cfg.fsdp else 1
    fsdp = cfg.fsdp and gpus > 1
    lora = cfg.lora_rank > 0
    residual = compute if fsdp else 4  # FSDP computes wholly in bf16; autocast keeps the residual stream fp32
    part = {"weights": (compute * P if lora else 4 * P / shards), "gradients": 0 if lora else 4 * P / shards,
            "optimizer": 0 if lora else 8 * P / shards,
            "reference": (4 * P / shards if fsdp else compute * P) if cfg.kl_coef > 0 and not lora else 0,
            "critic": 16 * P / shards if cfg.algorithm == "ppo" else 0}
    # a compute-dtype copy of the weights: FSDP's gathered model (rollouts), autocast's cache (plain, not fp32)
    part["gathered"] = compute * P if (fsdp or compute < 4) else 0
    part["gathered_train"] = compute * (m["root_params"] + 2 * m["layer_params"]) if fsdp else part["gathered"]
    rows, length = cfg.prompts_per_step * cfg.group_size, prompt_tokens + cfg.max_new_tokens
    kv_elem = compute if fsdp else 4
    per_group = cfg.group_size * length * m["layers"] * 2 * m["kv_dim"] * kv_elem
    static = part["weights"] + part["optimizer"] + part["reference"] + part["critic"]
    free = gpu_bytes - static - part["gathered"]
    cap = cfg.rollout_kv_budget_gb * GIB if cfg.rollout_kv_budget_gb > 0 else KV_SHARE_OF_FREE * max(free, 0)
    groups = max(1, min(cfg.prompts_per_step, int(cap // per_group)))  # rollout.chunk_groups: whole groups, >= 1
    part["kv_cache"], part["rollout_chunks"] = groups * per_group, -(-cfg.prompts_per_step // groups)
    part["sampling_logits"] = rows * m["vocab"] * 4 * 2  # each decode step's fp32 logits and probabilities
    mbs_tokens = min(cfg.micro_batch_size, rows) * length
    part["activations"] = activation_bytes(m, mbs_tokens, compute, residual, cfg.gradient_checkpointing)
    part["activations_other"] = activation_bytes(m, mbs_tokens, compute, residual, not cfg.gradient_checkpointing)
    part["logits_chunk"] = logits_bytes(m)
    part["vllm"] = 0.9 * gpu_bytes if cfg.rollout_engine == "vllm" else 0
    no_grad = compute * m["hidden"] * mbs_tokens * 4  # old_log_prob/ref: a layer's transient tensors
    part["peak/gen"] = static + part["gathered"] + part["kv_cache"] + part["sampling_logits"]
    part["peak/log_prob"] = static + part["gathered_train"] + no_grad + part["logits_chunk"]
    part["peak/update"] = static + part["gradients"] + part["gathered_train"] + part["activations"] \
        + part["logits_chunk"]
    return part


def table(cfg, m: dict, gpus: int, gpu_gib: float, prompt_tokens: int) -> str:
    p = plan(cfg, m, gpus, gpu_gib * GIB, prompt_tokens)
    gc = "with" if cfg.gradient_checkpointing else "without"
    other = "without" if cfg.gradient_checkpointing else "with"
    lines = [f"{m['params'] / 1e9:.2f}B parameters, {gpus} x {gpu_gib:g} GiB, "
             f"{'FSDP' if cfg.fsdp and gpus > 1 else 'replicated (data parallel)'}, "
             f"{cfg.prompts_per_step} x {cfg.group_size} rollouts of {prompt_tokens} + {cfg.max_new_tokens} tokens, "
             f"micro-batch {cfg.micro_batch_size}", "| part | GiB per GPU |", "|---|---|"]
    names = [("weights", "trained weights (fp32)" if not cfg.lora_rank else "frozen base"),
             ("gradients", "gradients (fp32, update only)"), ("optimizer", "AdamW moments (fp32)"),
             ("reference", "KL reference"), ("critic", "critic + AdamW"),
             ("gathered", "compute-dtype copy (rollouts)"), ("gathered_train", "gathered while training"),
             ("kv_cache", f"rollout key/value cache (groups in {p['rollout_chunks']} chunks)"),
             ("activations", f"activations, {gc} gradient checkpointing"),
             ("activations_other", f"(activations {other} it)"), ("logits_chunk", "logits chunk"),
             ("vllm", "vLLM server")]
    lines += [f"| {label} | {p[key] / GIB:.1f} |" for key, label in names if p[key]]
    for phase in ("gen", "log_prob", "update"):
        peak = p[f"peak/{phase}"] + p["vllm"]
        verdict = "fits" if peak + HEADROOM_GIB * GIB <= gpu_gib * GIB else \
            f"tight (< {HEADROOM_GIB} GiB left)" if peak <= gpu_gib * GIB else "DOES NOT FIT"
        lines.append(f"| **peak: {phase}** | **{peak / GIB:.1f}** {verdict} |")
    if p["rollout_chunks"] > 1:
        lines.append(f"rollouts run in {p['rollout_chunks']} chunks of groups (rollout.chunk_groups): the key/value "
                     "cache gets what the rest leaves; fewer chunks decode faster")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help=f"one of {sorted(PRESETS)}, or a config.json / model folder")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--gpu_gib", type=float, default=80)
    ap.add_argument("--prompt_tokens", type=int, default=0, help="prompt length (default: max_prompt_length)")
    args, rest = ap.parse_known_args(argv)
    from minirl.config import parse_config
    cfg = parse_config(rest)
    print(table(cfg, model_sizes(args.model), args.gpus, args.gpu_gib, args.prompt_tokens or cfg.max_prompt_length))


if __name__ == "__main__":
    main()
