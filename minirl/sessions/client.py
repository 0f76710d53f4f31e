"""Training sessions: sample / forward_backward / optim_step as futures on a live model (the Tinker API, and the
SageMaker AI training-session APIs modelled on it), run locally on this process and its accelerate peers.

    svc = ServiceClient()
    tc = svc.create_lora_training_client("tiny", rank=32, alpha=64)    # or create_training_client (all weights)
    sc = tc.create_sampling_client()
    res = sc.sample(prompt_tokens, 8, SamplingParams(max_tokens=256, temperature=0.7)).result()
    fb = tc.forward_backward(datums, loss_fn="ppo"); op = tc.optim_step(AdamParams(learning_rate=1e-5))
    fb.result(), op.result()

Every operation is a thin wrapper over the function train.py uses for the same stage: `rollout.sample`,
`logprobs.batched_logprobs`, `update.forward_backward` (whose losses are `loss.policy_loss`), `update.optim_step`,
`checkpoint`. What the session adds is ordering: a client's operations run in call order on one background
thread, so a loop can submit `optim_step` before `forward_backward` has finished; `sample` calls submitted
together run as one `generate` where their parameters agree (minirl/sessions/types.py: the worker, the futures
and the data types).

Conventions, and where they differ from Tinker's:
- A `Datum` is (prompt tokens, completion tokens) plus per-completion-token `logprobs`, `advantages` (a number or
  one per token) and `weights`; Tinker's model_input/target_tokens shift is done here. Weight-0 tokens stay in
  the context but out of the loss (tool outputs in a multi-turn episode).
- Losses are token means over the call's weighted tokens, all processes together, as train.py's (Tinker sums over
  tokens: pass loss_fn_config={"loss_agg_mode": "sum"}). Several calls before one optim_step: pass the step's
  total as loss_fn_config={"num_tokens": n} to each, and the gradient is the one-call gradient.
- PPO/CISPO clip ranges: loss_fn_config clip_low_threshold / clip_high_threshold, Tinker's ratio bounds (0.8, 1.2).
- Sampled log-probs are the trainer's own teacher-forced log-probs of the sampled tokens at the sampling
  temperature (one extra forward pass), so on-policy ratios are exactly 1.
- Under `accelerate launch` / torchrun every process runs the same loop on its share of the data (SPMD); the
  gradients are summed across processes at `optim_step`, as train.py sums them. FSDP is not supported here.
Left out: a remote service, async/await variants, top-p-aware log-probs, stop strings.

Shapes: N datums, P prompt tokens (left-padded), R completion tokens (right-padded).
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from minirl import checkpoint
from minirl.distributed import (all_reduce_sum, barrier, rank, shutdown, sum_gradients_across_processes,
                                sum_over_processes)
from minirl.logprobs import batched_logprobs
from minirl.models import (adapter_disabled, build_policy, config_dtype, load_model, load_tokenizer,
                           pick_attn_implementation, pick_dtype, resolve_model_path)
from minirl.rollout import sample
from minirl.sessions.types import (LOSS_FNS, AdamParams, Datum, ForwardBackwardOutput, Future, SampledSequence,
                                 SampleResponse, SamplingParams, SessionError, _Worker, collate)
from minirl.update import LossSettings, forward_backward, optim_step

__all__ = ["ServiceClient", "TrainingClient", "SamplingClient", "SamplingParams", "AdamParams", "Datum",
           "SampledSequence", "SampleResponse", "ForwardBackwardOutput", "Future", "SessionError"]


# --- clients -------------------------------------------------------------------------------------------------

class SamplingClient:
    """Samples from, and scores with, a model. From a training client it shares that client's worker, so its
    calls run in order with training calls, on the live weights; `use_adapter=False` runs the LoRA base model
    (the reference of KL penalties, DPO and KTO) without a second copy."""

    def __init__(self, model, tokenizer, worker: _Worker, version: Callable[[], int], micro_batch_size: int = 32,
                 use_adapter: bool = True):
        self.model, self.tokenizer, self._worker, self._version = model, tokenizer, worker, version
        self.micro_batch_size, self.use_adapter = micro_batch_size, use_adapter

    def _adapter(self):
        return contextlib.nullcontext() if self.use_adapter else adapter_disabled(self.model)

    def sample(self, prompt: list[int], num_samples: int = 1, sampling_params: SamplingParams | None = None) -> Future:
        params = sampling_params or SamplingParams()
        run = lambda prompts: self._sample_batch(prompts, num_samples, params)  # noqa: E731
        return self._worker.submit_sample((id(self), num_samples, params), list(prompt), run)

    def _sample_batch(self, prompts: list[list[int]], G: int, params: SamplingParams) -> list[SampleResponse]:
        """One generate for all prompts (rollout.sample), then the sampled tokens' log-probs at the sampling
        temperature from the trainer's forward pass (what train.py's prepare_batch computes as old_logp)."""
        greedy = params.temperature == 0
        seeded = torch.random.fork_rng(devices=[self._worker.device] if self._worker.device.type == "cuda" else [],
                                       enabled=params.seed is not None)
        with self._adapter(), seeded:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            rollout = sample(self.model, self.tokenizer, prompts, G, params.max_tokens, params.temperature or 1.0,
                             params.top_p, max(params.top_k, 0), greedy=greedy)
            R = rollout.response_ids.shape[1]
            # with the entropy, exactly as train.py's prepare_batch: the same old log-probs to the last bit
            logp, entropy = batched_logprobs(self.model, rollout.input_ids, rollout.attention_mask, R,
                                             self.micro_batch_size, params.temperature or 1.0, with_entropy=True)
        lengths, version = rollout.response_mask.sum(1).tolist(), self._version()                # logp: (N, R)
        seqs = [SampledSequence(rollout.response_ids[i, :n].tolist(), logp[i, :n].tolist(),
                                "length" if rollout.truncated[i] else "stop", entropy[i, :n].tolist())
                for i, n in enumerate(lengths)]
        return [SampleResponse(seqs[b * G:(b + 1) * G], version) for b in range(len(prompts))]

    def compute_logprobs(self, sequences: list[list[int]]) -> Future:
        """log p(token_t | tokens_<t) for each token of each sequence (temperature 1); the first is None."""
        return self._worker.submit("compute_logprobs", self._compute_logprobs, [list(s) for s in sequences])

    def _compute_logprobs(self, sequences: list[list[int]]) -> list[list[float | None]]:
        datums = [Datum(s[:1], s[1:]) for s in sequences]  # the first token is the "prompt"
        batch = collate(datums, self.tokenizer.pad_token_id, self._worker.device)
        R = batch["response_mask"].shape[1]
        with self._adapter():
            logp, _ = batched_logprobs(self.model, batch["input_ids"], batch["attention_mask"], R,
                                       self.micro_batch_size)                                  # (N, R)
        return [[None] + logp[i, :len(s) - 1].tolist() for i, s in enumerate(sequences)]


class TrainingClient:
    """A live policy (full weights or a LoRA adapter), its AdamW state and its step count (`policy_version`)."""

    def __init__(self, service: "ServiceClient", base_model: str, lora: dict | None, seed: int = 0,
                 micro_batch_size: int = 32, gradient_checkpointing: bool = False):
        self.service, self.micro_batch_size, self.policy_version = service, micro_batch_size, 0
        self.base_path = resolve_model_path(base_model)
        self.spec = {"base_model": base_model, "lora": lora, "seed": seed, "micro_batch_size": micro_batch_size,
                     "gradient_checkpointing": gradient_checkpointing}
        dtype, device = service.dtype, service.device
        self.tokenizer = load_tokenizer(self.base_path)
        self.model = build_policy(self.base_path, device, dtype, service.attn_implementation,
                                  lora and {**lora, "dropout": 0.0}, gradient_checkpointing, seed=seed)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=AdamParams.learning_rate)
        self._worker = _Worker(device, dtype)

    # -- reading the model
    def get_tokenizer(self):
        return self.tokenizer

    def create_sampling_client(self, use_adapter: bool = True) -> SamplingClient:
        if not use_adapter and not hasattr(self.model, "disable_adapter"):
            raise ValueError("use_adapter=False needs a LoRA training client; for full fine-tuning load the "
                             "reference with ServiceClient.create_sampling_client(model_path=base_model)")
        return SamplingClient(self.model, self.tokenizer, self._worker, lambda: self.policy_version,
                              self.micro_batch_size, use_adapter)

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> SamplingClient:
        """A sampler on the weights as they are once every call submitted so far has run (it waits for them)."""
        self._worker.submit("save_weights_and_get_sampling_client", lambda: None).result()
        return self.create_sampling_client()

    # -- the loss and its gradient
    def forward(self, datums: list[Datum], loss_fn: str = "cross_entropy",
                loss_fn_config: dict | None = None) -> Future:
        """The loss and metrics of forward_backward, without gradients."""
        return self._worker.submit("forward", self._loss, list(datums), loss_fn, loss_fn_config or {}, False)

    def forward_backward(self, datums: list[Datum], loss_fn: str | Callable = "cross_entropy",
                         loss_fn_config: dict | None = None) -> Future:
        """Accumulate the loss's gradient into the weights' .grad (applied by optim_step). loss_fn: one of
        LOSS_FNS, or a callable fn(datums, logprobs) -> (loss, metrics) as forward_backward_custom."""
        if callable(loss_fn):
            return self.forward_backward_custom(datums, loss_fn)
        return self._worker.submit("forward_backward", self._loss, list(datums), loss_fn, loss_fn_config or {}, True)

    def forward_backward_custom(self, datums: list[Datum], fn: Callable) -> Future:
        return self._worker.submit("forward_backward_custom", self._custom, list(datums), fn)

    def _loss(self, datums: list[Datum], loss_fn: str, config: dict, grad: bool) -> ForwardBackwardOutput:
        if loss_fn not in LOSS_FNS:
            raise ValueError(f"unknown loss_fn {loss_fn!r}; use one of {list(LOSS_FNS)} or a callable")
        unknown = set(config) - {"clip_low_threshold", "clip_high_threshold", "loss_agg_mode", "num_tokens",
                                 "temperature"}
        if unknown:
            raise ValueError(f"unknown loss_fn_config keys {sorted(unknown)}")
        batch = collate(datums, self.tokenizer.pad_token_id, self._worker.device)
        if loss_fn == "cross_entropy":
            batch["advantages"] = torch.ones_like(batch["advantages"])  # -weight * logp; the weights are the mask
        counts = all_reduce_sum(torch.tensor([float(batch["response_mask"].sum()), float(len(datums))],
                                             device=self._worker.device))
        num_tokens = 1.0 if config.get("loss_agg_mode") == "sum" else config.get("num_tokens", float(counts[0]))
        settings = LossSettings(policy_loss=loss_fn, clip_low=1 - config.get("clip_low_threshold", 0.8),
                                clip_high=config.get("clip_high_threshold", 1.2) - 1,
                                temperature=config.get("temperature", 1.0))
        try:
            with torch.set_grad_enabled(grad):
                m = forward_backward(self.model, batch, settings, self.micro_batch_size, max(num_tokens, 1.0),
                                     float(counts[1]), backward=torch.Tensor.backward if grad else lambda t: None)
        except BaseException:
            if grad:  # the step's gradients are incomplete: never let optim_step apply half a batch
                self.optimizer.zero_grad(set_to_none=True)
            raise
        m = sum_over_processes({k: v for k, v in m.items() if k != "kl_loss"})
        if loss_fn == "cross_entropy":
            m = {"pg_loss": m["pg_loss"]}  # the ratio metrics mean nothing without sampler log-probs
        return ForwardBackwardOutput(loss=m["pg_loss"], metrics=m)

    def _custom(self, datums: list[Datum], fn: Callable) -> ForwardBackwardOutput:
        """Tinker's forward_backward_custom: log-probs without a graph, the user's loss on them, dL/dlogp by
        autograd; then a second pass backpropagates the linear surrogate sum_t (dL/dlogp_t) * logp_t, which has
        the same gradient and runs in micro-batches (loss.policy_loss "cross_entropy" with A = -dL/dlogp)."""
        batch = collate(datums, self.tokenizer.pad_token_id, self._worker.device)
        R = batch["response_mask"].shape[1]
        logp, _ = batched_logprobs(self.model, batch["input_ids"], batch["attention_mask"], R,
                                   self.micro_batch_size)                                      # (N, R)
        leaves = [logp[i, :len(d.completion_tokens)].detach().requires_grad_() for i, d in enumerate(datums)]
        with torch.enable_grad():
            loss, metrics = fn(datums, leaves)
            loss.backward()
        dlogp = torch.zeros_like(logp)
        for i, leaf in enumerate(leaves):
            dlogp[i, :len(leaf)] = leaf.grad if leaf.grad is not None else 0.0
        real = batch["attention_mask"][:, -R:].float()  # every completion token; the user's loss did the weighting
        batch.update(advantages=-dlogp, response_mask=real)
        forward_backward(self.model, batch, LossSettings(policy_loss="cross_entropy"), self.micro_batch_size,
                         num_tokens=1.0, num_seqs=float(len(datums)))
        return ForwardBackwardOutput(loss=float(loss.detach()), metrics={k: float(v) for k, v in metrics.items()})

    def optim_step(self, params: AdamParams | None = None) -> Future:
        return self._worker.submit("optim_step", self._optim_step, params or AdamParams(), autocast=False)

    def _optim_step(self, p: AdamParams) -> dict[str, float]:
        sum_gradients_across_processes(self.model)  # each process holds its share of the step's gradient
        for group in self.optimizer.param_groups:
            group.update(lr=p.learning_rate, betas=(p.beta1, p.beta2), eps=p.eps, weight_decay=p.weight_decay)
        grad_norm = optim_step(self.model, self.optimizer, None, p.grad_clip_norm)
        self.policy_version += 1
        return {"grad_norm": grad_norm, "lr": p.learning_rate, "policy_version": self.policy_version}

    # -- saving
    def save_state(self, path: str | Path) -> Future:
        """Weights (fp32, unchanged), optimizer state, step count and every process's RNG: an exact resume point
        (ServiceClient.create_training_client_from_state_with_optimizer)."""
        return self._worker.submit("save_state", self._save_state, Path(path))

    def _save_state(self, folder: Path) -> str:
        if rank() == 0:
            folder.mkdir(parents=True, exist_ok=True)
        barrier()
        checkpoint.save_process_state(folder, rank())
        if rank() == 0:
            checkpoint.save_shared_state(folder, self.model, self.optimizer, None, self.policy_version, 0, self.spec)
        barrier()
        return str(folder)

    def save_weights_for_sampler(self, path: str | Path, merge_weights: bool = True) -> Future:
        """A folder that from_pretrained loads: with LoRA and merge_weights, the adapter merged into an fp32 copy
        of the base (checkpoint.save_merged; the live adapter is untouched), else the adapter alone; saved in the
        base's own dtype."""
        return self._worker.submit("save_weights_for_sampler", self._save_weights, Path(path), merge_weights)

    def _save_weights(self, folder: Path, merge: bool) -> str:
        if rank() == 0:
            if merge and hasattr(self.model, "peft_config"):  # into an fp32 copy of the base, as train.py does
                checkpoint.save_merged(self.model, self.base_path, folder, config_dtype(self.base_path))
            else:
                checkpoint.save_model(self.model, folder, config_dtype(self.base_path))
            self.tokenizer.save_pretrained(folder)
        barrier()
        return str(folder)

    def stop(self) -> None:
        self._worker.stop()


class ServiceClient:
    """Creates clients on this process (and, under accelerate launch / torchrun, its peers: SPMD)."""

    def __init__(self, dtype: str = "auto", attn_implementation: str = "auto"):
        from accelerate import PartialState
        # joins the process group when launched with several processes (on CPU only when told to: else each
        # process would be a world of one)
        state = PartialState(cpu=not torch.cuda.is_available())
        self.process_index, self.num_processes, self.device = state.process_index, state.num_processes, state.device
        self.dtype = pick_dtype(dtype, self.device)
        self.attn_implementation = pick_attn_implementation(attn_implementation)

    def create_lora_training_client(self, base_model: str, rank: int = 32, alpha: int = 32, seed: int = 0,
                                    target_modules: str = "all-linear", **kwargs) -> TrainingClient:
        return TrainingClient(self, base_model, {"rank": rank, "alpha": alpha, "target_modules": target_modules},
                              seed, **kwargs)

    def create_training_client(self, base_model: str, **kwargs) -> TrainingClient:
        """Full fine-tuning: every weight trains (fp32 weights and optimizer state)."""
        return TrainingClient(self, base_model, None, **kwargs)

    def create_training_client_from_state_with_optimizer(self, path: str | Path) -> TrainingClient:
        folder = Path(path)
        if not (folder / "trainer_state.json").exists():
            raise FileNotFoundError(f"{folder} holds no session state; write one with TrainingClient.save_state")
        state = json.loads((folder / "trainer_state.json").read_text())
        spec = state["config"]
        tc = TrainingClient(self, spec["base_model"], spec["lora"], spec["seed"], spec["micro_batch_size"],
                            spec["gradient_checkpointing"])
        checkpoint.load_checkpoint(folder, self.process_index, tc.model, tc.optimizer, None)
        tc.policy_version = state["step"]
        return tc

    def create_sampling_client(self, model_path: str, micro_batch_size: int = 32) -> SamplingClient:
        """A sampler on saved weights (save_weights_for_sampler's folder, an adapter folder, or a base model)."""
        path = resolve_model_path(model_path)
        model = load_model(path, self.dtype, self.attn_implementation).to(self.device).eval()
        return SamplingClient(model, load_tokenizer(path), _Worker(self.device, self.dtype), lambda: 0,
                              micro_batch_size)

    def shutdown(self) -> None:
        """Leave the process group (all processes together); call once at the end of a multi-process loop."""
        shutdown()
