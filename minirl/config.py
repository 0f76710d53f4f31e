"""One flat config for a training run: defaults here, then a YAML file (`--config f.yaml`), then `--key value`.

    python train.py                                   # the built-in toy run
    python train.py --config recipes/gsm8k.yaml --lr 2e-6 --max_steps 50

Every field is a plain value whose meaning the comment gives. A field typed `Literal[...]` accepts only those
strings; an unknown key, a value of the wrong type or a choice outside the list raises `ConfigError` naming
the key and what it accepts.
"""
from __future__ import annotations

import dataclasses
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


@dataclass
class Config:
    # --- model ---------------------------------------------------------------------------------------------
    model_name_or_path: str = "tiny"      # a folder `from_pretrained` reads; "tiny": the built-in toy model
    # compute dtype (weights stay fp32); auto: bf16 on GPU, fp32 on CPU; float16 is refused (no loss scaling)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # the final model's dtype; auto: as its config says
    save_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # auto: flash-attn where it is installed, on CUDA, with dtype bfloat16/float16 (it takes no fp32); else sdpa
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = "auto"
    gradient_checkpointing: bool = False  # recompute activations in backward (generation keeps the KV cache)
    fsdp: bool = False                    # shard the policy with FSDP2 across processes (full fine-tuning)
    load_in_bits: Literal[0, 4, 8] = 0    # 4/8-bit base weights, bitsandbytes (CUDA only; needs lora_rank > 0)
    lora_rank: int = 0                    # > 0: train a LoRA adapter (peft) instead of all weights
    lora_alpha: int = 32                  # LoRA scaling numerator (scale = alpha / rank)
    lora_dropout: float = 0.0             # must be 0 for RL (see check)
    keep_dropout: bool = False            # keep the model's own dropout (off by default: sampling runs without it)
    lora_target_modules: str = "all-linear"  # peft's "all-linear", or comma-separated names (q_proj,v_proj)
    save_merged: bool = False             # with LoRA, also save the merged model to <output_dir>/merged
    # --- data ----------------------------------------------------------------------------------------------
    train_files: str = "data/arith_train.jsonl"  # comma-separated .jsonl/.json/.parquet in veRL's row format
    val_files: str = "data/arith_test.jsonl"     # held-out rows for accuracy before/after (and every val_every)
    val_max_samples: int = 200            # cap on held-out rows scored (0 = all)
    max_prompt_length: int = 512          # prompts longer than this (in tokens) are dropped, and counted
    code_reward_style: Literal["codefu", "binary"] = "codefu"  # rows with ability "code", see rewards.py
    answer_extraction: Literal["strict", "flexible"] = "strict"  # GSM8K-style rows: the number after '####',
                                          # or the last number anywhere (veRL's two methods; rewards.py)
    reward_fn: str = ""                   # path/to/file.py:function scoring every row instead of the built-in
                                          # rewards: function(data_source, solution_str, ground_truth,
                                          # extra_info) -> float (veRL's custom_reward_function)
    judge_workers: int = 0                # parallel sandboxed programs for code rewards (0 = all cores)
    judge_isolation: Literal["strict", "weak"] = "strict"  # "weak": also judge where the sandbox cannot build its
                                          # namespaces (no root: programs run as the trainer's uid, can read and
                                          # write its files; root without namespaces: they see the host's files)
    judge_backend: Literal["local", "remote", "ray"] = "local"  # where code is judged: this host's sandbox,
                                          # judge servers over HTTP, or a Ray cluster (docs/judge_backends.md)
    judge_urls: str = ""                  # remote: comma-separated http(s):// servers (minirl's or SandboxFusion);
                                          # ray: the cluster's address ("" = join the one `ray start` made, or start one)
    max_judge_error_share: float = 0.1    # stop the run when more than this share of a step's programs got a judge
                                          # error (JE: a dead server, a crashed worker); below it they leave the loss
    # --- rollout -------------------------------------------------------------------------------------------
    prompts_per_step: int = 16            # B: prompts per training step (per process)
    group_size: int = 8                   # G: completions sampled per prompt; GRPO compares within a group
    max_new_tokens: int = 8               # response budget; a completion that hits it is "truncated"
    temperature: float = 1.0              # sampling temperature of rollouts (1.0: the policy's own distribution)
    top_p: float = 1.0
    top_k: int = 0                        # 0 disables top-k
    rollout_engine: Literal["hf", "vllm"] = "hf"  # hf: minirl's decode loop / HF generate; vllm: a vLLM server
                                          # process fed the weights after every step (docs/rollout.md, `make vllm`)
    vllm_python: str = ".venv-vllm/bin/python"  # the interpreter of vLLM's own environment (it starts the server)
    vllm_url: str = ""                    # an already running minirl vLLM server (http://127.0.0.1:PORT); "" = start one
    rollout_kv_budget_gb: float = 0.0     # hf engine: the groups decode in chunks whose key/value cache fits this many
                                          # GB (prompt + max_new_tokens a row); 0 = 60% of the GPU's free memory, on
                                          # CPU one chunk (rollout.chunk_groups); the tokens are one batch's either way
    rollout_is_cap: float = 0.0           # > 0: weight each token's policy loss by min(pi_old / pi_sampler, cap), the
                                          # truncated importance sampling of Yao et al. 2025 (verl's rollout_is; 2.0
                                          # typical) for a sampler whose numerics differ (bf16); 0 = off. The mismatch
                                          # is logged either way (rollout_corr/*; hf engine only: loss.sampler_mismatch)
    # --- algorithm -----------------------------------------------------------------------------------------
    algorithm: Literal["grpo", "ppo"] = "grpo"  # grpo: critic-free, advantages from the group; ppo: critic + GAE
    adv_estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"  # see loss.group_advantages
    adv_std: Literal["unbiased", "population"] = "unbiased"     # verl and TRL: unbiased (torch.std's default)
    adv_eps: float = 1e-6                 # added to the group std (verl 1e-6, TRL 1e-4)
    policy_loss: Literal["ppo", "cispo", "importance_sampling"] = "ppo"  # see loss.policy_loss
    clip_low: float = 0.2                 # ratio clipped to [1-clip_low, 1+clip_high] (Schulman et al. 2017)
    clip_high: float = 0.2                # DAPO's clip-higher uses 0.28 (Yu et al. 2025)
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                           "seq-sum-token-sum-norm"] = "token-mean"  # see loss.aggregate; Dr. GRPO:
                                          # seq-mean-token-sum-norm; verl's batch-summed one: seq-sum-token-sum-norm
    dual_clip: float = 0.0                # PPO dual-clip constant c (Ye et al. 2020; verl uses 3.0); 0 = off
    kl_coef: float = 0.0                  # weight of the KL-to-reference term; 0 = no reference model at all
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # Schulman's estimators, see loss.kl_penalty
    kl_in_reward: bool = False            # fold -kl_coef*KL into the rewards, not the loss (verl's
                                          # use_kl_in_reward; GRPO: a sequence's reward - kl_coef * its summed KL)
    # --- PPO with a critic (algorithm: ppo) ----------------------------------------------------------------
    critic_model_path: str = ""           # "" = a copy of the policy's starting weights with a value head
    critic_lr: float = 1e-3               # the toy critic's rate; ~1e-5 for 1-7B models
    gae_gamma: float = 1.0                # discount; 1.0 for outcome rewards
    gae_lambda: float = 0.95              # GAE lambda (Schulman et al. 2016)
    value_clip: float = 0.5               # clip range of the value loss around the old values (verl: 0.5)
    # --- DAPO switches (Yu et al. 2025), all off by default ------------------------------------------------
    dynamic_sampling: bool = False        # drop groups whose rewards are all equal; resample to fill the batch
    max_sampling_rounds: int = 4          # bound on sampling rounds per step with dynamic_sampling
    overlong_buffer: int = 0              # soft overlong punishment over the budget's last N tokens (0 = off)
    overlong_penalty: float = 1.0         # the punishment at the budget (reward - this, linearly ramped)
    mask_truncated: bool = False          # truncated completions get no loss (overlong filtering)
    ppo_epochs: int = 1                   # passes over each rollout batch
    mini_batches: int = 1                 # optimizer steps per pass; > 1: later steps are off-policy (ratio != 1)
    micro_batch_size: int = 32            # sequences per forward/backward; changes memory, not the result
    micro_batch_tokens: int = 0           # > 0: size micro-batches by a token budget (sequences x padded length;
                                          # with pack_sequences, the real tokens run: a group's prompt once)
    pack_sequences: bool = False          # training passes without padding: each micro-batch's rows packed end to
                                          # end, a group's prompt run once (minirl/packing.py); equal log-probs up
                                          # to float rounding, so off by default (recipes' metrics stay bitwise)
    # --- optimizer -----------------------------------------------------------------------------------------
    lr: float = 2e-4                      # the toy model's rate; full fine-tuning of a 1-7B model wants ~1e-6
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    warmup_steps: int = 5                 # linear warm-up of the learning rate, then constant
    max_grad_norm: float = 1.0            # clip the global gradient norm (0 disables)
    # --- run -----------------------------------------------------------------------------------------------
    max_steps: int = 120                  # training steps (each: sample -> score -> update)
    seed: int = 0
    output_dir: str = "runs/default"      # metrics.jsonl and the final model go here
    val_every: int = 20                   # held-out validation every N steps, and before and after (0: only those)
    val_greedy: bool = True               # validation decodes greedily; False samples with `temperature`
    report_to: str = ""                   # extra trackers (accelerate): tensorboard, mlflow, wandb, comma-separated
    save_every: int = 0                   # checkpoint every N steps (0 = only at the end); see checkpoint.py
    keep_last: int = 2                    # complete checkpoints kept
    log_sample_groups: int = 2            # groups of each step (the first process's) written to
                                          # <output_dir>/samples.jsonl: prompt, completions, verdict or answer,
                                          # reward, advantage (scripts/read_samples.py); 0 = none
    resume: str = ""                      # "auto": newest checkpoint in output_dir; or a checkpoint folder
    dist_timeout_s: int = 1800            # how long a collective waits for the slowest process (a big save)


class ConfigError(ValueError):
    """A bad config key or value; the message names the key and what it accepts."""


def _field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config)}


def _convert(key: str, value: Any, typ: Any) -> Any:
    """Check/convert one value (from YAML or a command-line string) against the field's type."""
    if typing.get_origin(typ) is Literal:
        choices = typing.get_args(typ)
        if isinstance(choices[0], int) and isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        if value not in choices:
            raise ConfigError(f"config key '{key}': {value!r} is not one of {list(choices)}")
        return value
    from_cli = isinstance(value, str)
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            if from_cli and value.lower() in ("true", "1", "yes"):
                return True
            if from_cli and value.lower() in ("false", "0", "no"):
                return False
            raise ValueError
        if typ is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if typ is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if typ is str:
            if isinstance(value, (list, tuple)):  # YAML lists of files are accepted for *_files
                return ",".join(map(str, value))
            return str(value)
    except (TypeError, ValueError):
        pass
    raise ConfigError(f"config key '{key}': expected {typ.__name__}, got {value!r}")


def _apply(cfg: Config, overrides: dict[str, Any], where: str) -> None:
    types = _field_types()
    for key, value in overrides.items():
        key = key.replace("-", "_")
        if key not in types:
            import difflib
            close = difflib.get_close_matches(key, types, n=3)
            hint = f" Did you mean {close}?" if close else f" Valid keys: {sorted(types)}"
            raise ConfigError(f"unknown config key '{key}' ({where}).{hint}")
        setattr(cfg, key, _convert(key, value, types[key]))


def check(cfg: Config) -> None:
    """Range checks that types alone cannot express."""
    positive = ["prompts_per_step", "group_size", "max_new_tokens", "micro_batch_size", "ppo_epochs",
                "mini_batches", "max_prompt_length", "max_sampling_rounds"]
    for key in positive:
        if getattr(cfg, key) < 1:
            raise ConfigError(f"config key '{key}' must be >= 1, got {getattr(cfg, key)}")
    if cfg.overlong_buffer >= cfg.max_new_tokens:
        raise ConfigError(f"config key 'overlong_buffer' ({cfg.overlong_buffer}) must be < max_new_tokens "
                          f"({cfg.max_new_tokens})")
    if cfg.dual_clip and cfg.dual_clip <= 1:
        raise ConfigError(f"config key 'dual_clip' must be 0 (off) or > 1, got {cfg.dual_clip}")
    if cfg.load_in_bits and cfg.lora_rank == 0:
        raise ConfigError("config key 'load_in_bits' needs 'lora_rank' > 0: quantised weights cannot be trained, "
                          "only a LoRA adapter on top of them")
    for tracker in [t.strip() for t in cfg.report_to.split(",") if t.strip()]:
        if tracker not in ("tensorboard", "mlflow", "wandb"):
            raise ConfigError(f"config key 'report_to': {tracker!r} not among ['tensorboard', 'mlflow', 'wandb']")
        import importlib.util  # accelerate silently drops a tracker whose package is missing; say so instead
        if importlib.util.find_spec(tracker) is None:
            raise ConfigError(f"config key 'report_to': {tracker!r} is not installed (pip install {tracker}); "
                              "metrics.jsonl is written regardless")
    if cfg.fsdp and (cfg.lora_rank or cfg.load_in_bits):
        raise ConfigError("config key 'fsdp' supports full fine-tuning only in this version; for LoRA use plain "
                          "data parallelism (fsdp: false): a LoRA policy's trainable weights are small")
    if cfg.lora_rank < 0 or cfg.lora_alpha < 1:
        raise ConfigError("config keys 'lora_rank' must be >= 0 and 'lora_alpha' >= 1")
    if cfg.lora_dropout != 0:
        raise ConfigError("config key 'lora_dropout' must be 0 for RL: generation runs without dropout, so with "
                          "it the trained policy is not the one that sampled (the PPO ratio is not 1 on-policy); "
                          "TRL's GRPO disables dropout for the same reason")
    if cfg.keep_dropout and (cfg.mini_batches > 1 or cfg.ppo_epochs > 1):
        raise ConfigError("config key 'keep_dropout' needs mini_batches: 1 and ppo_epochs: 1: with dropout the old "
                          "log-probs are not those of the policy that sampled (ratio != 1 from the first "
                          "mini-batch); only on-policy, where old_logp = logp.detach(), is it mere noise")
    if cfg.dtype == "float16":
        raise ConfigError("config key 'dtype': float16 needs loss scaling, which minirl does not do (small "
                          "gradients underflow to 0); use bfloat16 (A100, H100, recent CPUs) or float32 (V100, T4)")
    if cfg.dist_timeout_s < 1:
        raise ConfigError(f"config key 'dist_timeout_s' must be >= 1 (seconds), got {cfg.dist_timeout_s}")
    for key in ["max_steps", "val_max_samples", "val_every", "save_every", "keep_last", "warmup_steps",
                "micro_batch_tokens", "judge_workers", "log_sample_groups"]:
        # counts: 0 means "off" or "all", negative means nothing
        if getattr(cfg, key) < 0:
            raise ConfigError(f"config key '{key}' must be >= 0, got {getattr(cfg, key)}")
    for key in ["lr", "kl_coef", "clip_low", "clip_high", "max_grad_norm", "adv_eps", "weight_decay", "critic_lr",
                "value_clip", "overlong_buffer", "overlong_penalty", "rollout_kv_budget_gb", "rollout_is_cap"]:
        if getattr(cfg, key) < 0:
            raise ConfigError(f"config key '{key}' must be >= 0, got {getattr(cfg, key)}")
    _validate_judge(cfg)
    if not 0 <= cfg.max_judge_error_share <= 1:
        raise ConfigError(f"config key 'max_judge_error_share' must be in [0, 1], got {cfg.max_judge_error_share}")
    if cfg.kl_in_reward and cfg.kl_coef <= 0:
        raise ConfigError("config key 'kl_in_reward' needs 'kl_coef' > 0 (the weight of the KL folded into the "
                          "rewards); set kl_coef, or kl_in_reward: false")
    if cfg.temperature <= 0 or not 0 < cfg.top_p <= 1:
        raise ConfigError("config keys 'temperature' must be > 0 and 'top_p' in (0, 1]")
    if cfg.algorithm == "grpo" and cfg.adv_estimator in ("grpo", "rloo") and cfg.group_size < 2:
        raise ConfigError(f"config key 'group_size' must be >= 2 for adv_estimator={cfg.adv_estimator!r}")
    if cfg.rollout_engine == "vllm" and cfg.rollout_is_cap > 0:
        raise ConfigError("config key 'rollout_is_cap' needs the sampler's own log-probs, which the vLLM engine does "
                          "not return yet; use rollout_engine: hf, or rollout_is_cap: 0")
    if cfg.rollout_engine == "vllm" and cfg.fsdp:
        raise ConfigError("config key 'rollout_engine': vllm takes full weights from one process; with fsdp use "
                          "rollout_engine: hf (or plain data parallelism)")
    if cfg.rollout_engine == "vllm" and not cfg.vllm_url and not Path(cfg.vllm_python).exists():
        raise ConfigError(f"config key 'vllm_python': {cfg.vllm_python} does not exist; build vLLM's environment "
                          "with `make vllm`, or set vllm_url to a running server")
    if cfg.prompts_per_step % cfg.mini_batches:
        raise ConfigError(f"config key 'mini_batches' ({cfg.mini_batches}) must divide 'prompts_per_step' "
                          f"({cfg.prompts_per_step}) so that groups are not split across optimizer steps")


def _validate_judge(cfg: Config) -> None:
    urls = [u.strip() for u in cfg.judge_urls.split(",") if u.strip()]
    if cfg.judge_backend == "remote":
        if not urls:
            raise ConfigError("config key 'judge_urls' must name at least one server for judge_backend: remote, "
                              "e.g. http://127.0.0.1:8080 (start one with python -m minirl.judge.server)")
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise ConfigError(f"config key 'judge_urls': {bad[0]!r} is not an http:// or https:// URL")
    elif cfg.judge_backend == "ray" and len(urls) > 1:
        raise ConfigError("config key 'judge_urls' takes one Ray address for judge_backend: ray (or none to join "
                          f"the cluster of `ray start`), got {len(urls)}")
    elif cfg.judge_backend == "local" and urls:
        raise ConfigError("config key 'judge_urls' is for judge_backend remote or ray; set judge_backend, or "
                          "leave judge_urls empty")


def check_launcher(cfg: Config, env: typing.Mapping[str, str], on_gpu: bool) -> list[str]:
    """Honour or refuse what `accelerate launch` asked for. minirl never calls `accelerator.prepare()`: it shards
    with its own FSDP2 (`--fsdp true`) and computes in `--dtype` under its own autocast, so accelerate's plugins
    would otherwise be silently ignored (an FSDP config without --fsdp true would run replicated data parallel
    and run out of memory at 7B). `accelerate launch` passes its config to the processes as ACCELERATE_*
    variables (accelerate/utils/launch.py); each is checked here, before any model is loaded. Returns notes to
    print for settings that minirl applies in its own way."""
    def on(name: str) -> bool:
        return env.get(name, "false").strip().lower() in ("1", "true", "yes")
    notes = []
    if on("ACCELERATE_USE_DEEPSPEED"):
        raise ConfigError("the accelerate config asks for DeepSpeed, which minirl does not use; set "
                          "distributed_type: MULTI_GPU in it and pass --fsdp true (minirl shards with FSDP2)")
    for name, what in [("ACCELERATE_USE_MEGATRON_LM", "Megatron-LM"),
                       ("ACCELERATE_USE_PARALLELISM_CONFIG", "tensor/context parallelism")]:
        if on(name):
            raise ConfigError(f"the accelerate config asks for {what}, which minirl does not do; use "
                              "distributed_type: MULTI_GPU and --fsdp true")
    if on("ACCELERATE_USE_FSDP"):
        if not cfg.fsdp:
            raise ConfigError("the accelerate config asks for FSDP, but minirl shards only with --fsdp true (its own "
                              "FSDP2; accelerate's plugin is not used): pass --fsdp true, and set "
                              "distributed_type: MULTI_GPU in the accelerate config (scripts/accelerate/)")
        notes.append("accelerate: FSDP is minirl's own FSDP2 (--fsdp true); the fsdp_* settings of the accelerate "
                     "config (sharding strategy, offload, wrap policy) are not read")
    mixed = env.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    on_gpu = on_gpu and not on("ACCELERATE_USE_CPU")  # `use_cpu: true` runs on CPU, where dtype auto is fp32
    dtype = {"auto": "bfloat16" if on_gpu else "float32"}.get(cfg.dtype, cfg.dtype)
    if mixed in ("fp16", "fp8"):
        raise ConfigError(f"the accelerate config asks for mixed_precision: {mixed}, which minirl does not do "
                          "(no loss scaling, no fp8 kernels); set mixed_precision: 'no' and choose --dtype "
                          "bfloat16 (or float32)")
    if mixed == "bf16" and dtype != "bfloat16":
        raise ConfigError(f"the accelerate config asks for mixed_precision: bf16, but --dtype {cfg.dtype} computes in "
                          f"{dtype}; pass --dtype bfloat16 (minirl's own autocast), or set mixed_precision: 'no'")
    if mixed not in ("no", "bf16", ""):
        raise ConfigError(f"the accelerate config's mixed_precision: {mixed} is not one minirl knows; set 'no' and "
                          "choose --dtype")
    if env.get("ACCELERATE_DYNAMO_BACKEND", "NO").strip().upper() not in ("NO", ""):
        raise ConfigError("the accelerate config asks for torch.compile (dynamo_backend: "
                          f"{env['ACCELERATE_DYNAMO_BACKEND']}), which minirl does not apply; set dynamo_backend: 'NO'")
    return notes


def key_comments() -> list[tuple[str, str | None, str]]:
    """(section, key, comment) in the order of Config's source: each key's comment read from this file (comment
    lines above a key, its comment on the key's line, and the comment lines indented under that one), so --help
    can never drift from the documentation. A section banner ("# --- model ---") is (section, None, "")."""
    import inspect
    import io
    import tokenize
    lines = inspect.getsource(Config).splitlines(keepends=True)
    comments: dict[int, tuple[int, str]] = {}  # line -> (column, text) of its comment
    code: set[int] = set()                     # lines with code on them
    for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code.update(range(tok.start[0], tok.end[0] + 1))
    names = {f.name for f in dataclasses.fields(Config)}
    out: list[tuple[str, str | None, str]] = []
    section, above, last, indent = "", [], None, 4
    for n, line in enumerate(lines, 1):
        key = line.split(":")[0].strip()
        if n in code and key in names:
            text = above + ([comments[n][1]] if n in comments else [])
            out.append((section, key, " ".join(text)))
            above, last, indent = [], len(out) - 1, len(line) - len(line.lstrip())
        elif n in comments and n in code and last is not None:  # a key's type or default spans lines
            s, k, c = out[last]
            out[last] = (s, k, f"{c} {comments[n][1]}".strip())
        elif n in comments and n not in code:
            col, text = comments[n]
            if text.startswith("---"):
                section, above, last = text.strip("- "), [], None
                out.append((section, None, ""))
            elif last is not None and col > indent:      # indented under the key's comment: more of it
                s, k, c = out[last]
                out[last] = (s, k, f"{c} {text}".strip())
            else:                                        # on its own line above the next key
                above.append(text)
                last = None
        elif n not in code:
            last = None
    return out


def help_text() -> str:
    """What `python train.py --help` prints: this module's docstring, then every key by section with its type,
    default and comment."""
    import textwrap
    types, defaults = _field_types(), {f.name: f.default for f in dataclasses.fields(Config)}
    out = [__doc__.strip(), ""]
    for section, key, comment in key_comments():
        if key is None:
            out.append(f"\n{section}:")
            continue
        typ = types[key]
        kind = "|".join(map(str, typing.get_args(typ))) if typing.get_origin(typ) is Literal else typ.__name__
        out.append(f"  --{key} {kind} (default: {defaults[key]!r})")
        if comment:
            out += textwrap.wrap(comment, 108, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(out)


def parse_config(argv: list[str] | None = None) -> Config:
    """Defaults <- `--config file.yaml` <- `--key value` pairs (later wins)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = Config()
    if any(a in ("-h", "--help") for a in argv):  # anywhere: `train.py --config x.yaml --help` too
        print(help_text())
        raise SystemExit(0)
    pairs: dict[str, str] = {}
    config_file = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"expected --key value, got {arg!r}")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise ConfigError(f"config key '{key}' has no value")
            value, i = argv[i + 1], i + 1
        i += 1
        if key == "config":
            config_file = value
        else:
            pairs[key] = value
    if config_file is not None:
        import yaml
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of key: value")
        _apply(cfg, data, f"in {path}")
    _apply(cfg, pairs, "on the command line")
    check(cfg)
    return cfg
