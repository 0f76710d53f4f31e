"""Training sessions with Tinker's programming model, on this process (and its accelerate peers): the official
SDK's names, signatures, defaults, result types and losses, so a loop written for Tinker runs here unchanged.

    svc = ServiceClient()
    tc = svc.create_lora_training_client(base_model="tiny", rank=32).result()
    sc = tc.save_weights_and_get_sampling_client().result()            # a snapshot of the current weights
    res = sc.sample(ModelInput.from_ints(prompt), 8, SamplingParams(max_tokens=256)).result()
    fb = tc.forward_backward(datums, loss_fn="importance_sampling"); op = tc.optim_step(AdamParams(1e-5))
    fb.result().metrics["loss:sum"], op.result().metrics

Over HTTP, `python -m minirl.sessions.server` serves these clients to `tinker.ServiceClient(base_url=...)`.
Each operation is a thin wrapper over the function train.py uses for the same stage: `rollout.sample`,
`logprobs.batched_logprobs` / `token_logprobs` (sessions/batches.py: the datum layout and the loss pass over
sessions/losses.py), `update.optim_step`, `checkpoint`. A client's operations run in call order on one
thread (minirl/sessions/worker.py), so `optim_step` can be submitted before `forward_backward` has finished.

How minirl differs from the Tinker service, what is left out: docs/sessions.md (unsupported and result-changing
raises). Under accelerate/torchrun each process runs the loop on its data share; optim_step sums gradients.
"""
from __future__ import annotations

import copy
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

from minirl import checkpoint
from minirl.distributed import barrier, global_sum, rank, shutdown, sum_gradients_across_processes, world_size
from minirl.models import (build_policy, config_dtype, load_model, load_tokenizer, pick_attn_implementation,
                           pick_dtype, resolve_model_path, weights)
import minirl.sessions.batches as batches
from minirl.sessions.sampling import SampledTemperatures, SamplingClient
from minirl.sessions.types import (AdamParams, ForwardBackwardOutput, GetInfoResponse, LoadWeightsResponse,
                                   ModelData, OptimStepResponse, SaveWeightsForSamplerResponse,
                                   SaveWeightsResponse, adam_params_of)
from minirl.sessions.worker import ClientFuture, Future, SessionError, _Worker, add_async_variants, ready
from minirl.update import optim_step

__all__ = ["ServiceClient", "TrainingClient", "SamplingClient"]


class TrainingClient:
    """A live policy (full weights or a LoRA adapter), its AdamW state and its step count (`policy_version`)."""

    def __init__(self, service: "ServiceClient", base_model: str, lora: dict | None, seed: int = 0,
                 micro_batch_size: int = 32, gradient_checkpointing: bool = False):
        self.service, self.micro_batch_size, self.policy_version = service, micro_batch_size, 0
        self.model_id = f"{service.session_id}:train:{len(service.training_clients)}"
        service.training_clients.append(self)
        self.base_model, self.base_path = base_model, resolve_model_path(base_model)
        self.spec = {"base_model": base_model, "lora": lora, "seed": seed, "micro_batch_size": micro_batch_size,
                     "gradient_checkpointing": gradient_checkpointing}
        self.tokenizer = load_tokenizer(self.base_path)
        self.model = build_policy(self.base_path, service.device, service.dtype, service.attn_implementation,
                                  lora and {**lora, "dropout": 0.0}, gradient_checkpointing, seed=seed)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=AdamParams.learning_rate)
        self._worker = _Worker(service.device, service.dtype)
        self._step_error: BaseException | None = None  # a failed forward_backward poisons its step

    # -- reading the model
    def get_tokenizer(self):
        return self.tokenizer

    def get_info(self) -> GetInfoResponse:
        lora = self.spec["lora"]
        return GetInfoResponse(ModelData(type(self.model).__name__, self.base_model, self.base_path),
                               self.model_id, lora is not None, lora and lora["rank"], self.base_model)

    def create_sampling_client(self, model_path: str | None = None, retry_config=None,
                               record_stability_info: bool = False, *, use_adapter: bool = True) -> ClientFuture:
        """A sampler on saved weights (model_path), or with model_path None on the live weights, in this
        client's call order (minirl); use_adapter=False runs the LoRA base model (a KL or DPO reference)."""
        if model_path is not None:
            return self.service.create_sampling_client(model_path)
        if not use_adapter and not hasattr(self.model, "disable_adapter"):
            raise ValueError("use_adapter=False needs a LoRA training client; for full fine-tuning load the "
                             "reference with ServiceClient.create_sampling_client(base_model=...)")
        return ready(SamplingClient(self.model, self.tokenizer, self._worker, lambda: self.policy_version,
                                    self.micro_batch_size, use_adapter, self.service.temperatures))

    def save_weights_and_get_sampling_client(self, name: str | None = None, retry_config=None,
                                             record_stability_info: bool = False,
                                             kind: str = "snapshot") -> ClientFuture:
        """A sampler on the weights as they are once every call submitted so far has run: a copy that later
        steps leave alone ("snapshot"), or the live weights ("inflight")."""
        def make() -> SamplingClient:
            if kind == "inflight":
                return SamplingClient(self.model, self.tokenizer, self._worker, lambda: self.policy_version,
                                      self.micro_batch_size, temperatures=self.service.temperatures)
            snapshot = copy.deepcopy(self.model).eval().requires_grad_(False)
            version = self.policy_version
            return SamplingClient(snapshot, self.tokenizer, self._worker, lambda: version, self.micro_batch_size,
                                  temperatures=self.service.temperatures)
        if kind not in ("snapshot", "inflight"):
            raise ValueError(f"kind must be 'snapshot' or 'inflight', not {kind!r}")
        fut = self._worker.submit("save_weights_and_get_sampling_client", make)
        out = ClientFuture(fut.name, self._worker)
        out._future = fut._future
        return out

    # -- the loss and its gradient
    def forward(self, data: list, loss_fn: str = "cross_entropy", loss_fn_config: dict | None = None) -> Future:
        """The loss, metrics and per-token log-probs of forward_backward, without gradients."""
        return self._worker.submit("forward", self._loss, list(data), loss_fn, dict(loss_fn_config or {}), False)

    def forward_backward(self, data: list, loss_fn: str | Callable = "cross_entropy",
                         loss_fn_config: dict | None = None) -> Future:
        """Accumulate the loss's gradient into the weights' .grad (applied by optim_step)."""
        if callable(loss_fn):
            return self.forward_backward_custom(data, loss_fn)
        return self._worker.submit("forward_backward", self._loss, list(data), loss_fn, dict(loss_fn_config or {}),
                                   True)

    def forward_backward_custom(self, data: list, loss_fn: Callable) -> Future:
        return self._worker.submit("forward_backward_custom", self._custom, list(data), loss_fn)

    def _temperature(self, data: list, loss_fn: str, config: dict) -> float:
        """The RL losses' T: loss_fn_config's, else the one that sampled the data (SampledTemperatures)."""
        if "temperature" in config or loss_fn == "cross_entropy":
            return float(config.pop("temperature", 1.0))
        return self.service.temperatures.of(data)

    def _loss(self, data: list, loss_fn: str, config: dict, grad: bool) -> ForwardBackwardOutput:
        if grad and self._step_error is not None:
            raise SessionError(f"skipped: an earlier forward_backward of this step failed ({self._step_error})")
        try:
            T = self._temperature(data, loss_fn, config)
            batch = batches.collate(data, loss_fn, self.tokenizer.pad_token_id, self._worker.device)
            _, logp, metrics = batches.loss_pass(self.model, batch, loss_fn, config, self.micro_batch_size, grad, T)
        except BaseException as e:
            if grad:  # the step's gradients are incomplete: its optim_step must not apply them
                self._step_error = e
                self.optimizer.zero_grad(set_to_none=True)
            raise
        totals = global_sum(torch.tensor([*metrics.values()], dtype=torch.float32, device=self._worker.device)).tolist()
        metrics = {k: v / (world_size() if k.endswith(":mean") else 1) for k, v in zip(metrics, totals)}
        return ForwardBackwardOutput("TensorData", batches.outputs(batch, logp), metrics)

    def _custom(self, data: list, fn: Callable) -> ForwardBackwardOutput:
        """Tinker's forward_backward_custom: log-probs without a graph, the user's loss on them (one tensor per
        datum, at its positions), dL/dlogp by autograd; then a second pass backpropagates the linear surrogate
        sum_t (dL/dlogp_t) * logp_t, which has the same gradient ("cross_entropy" with weights -dL/dlogp)."""
        batch = batches.collate(data, "cross_entropy", self.tokenizer.pad_token_id, self._worker.device)
        with torch.no_grad():
            _, logp, _ = batches.loss_pass(self.model, batch, "cross_entropy", {}, self.micro_batch_size, False)
        rows = [out["logprobs"].to_torch().to(logp.device).requires_grad_() for out in batches.outputs(batch, logp)]
        with torch.enable_grad():
            loss, metrics = fn(data, rows)
            loss.backward()
        dlogp = torch.zeros_like(logp)
        for i, (row, s) in enumerate(zip(rows, batch["starts"])):
            if row.grad is not None:
                dlogp[i, :len(row) - s] = row.grad[s:]
        batch["weights"] = -dlogp * batch["mask"]
        batches.loss_pass(self.model, batch, "cross_entropy", {}, self.micro_batch_size, True)
        metrics = {k: float(v) for k, v in metrics.items()}
        return ForwardBackwardOutput("TensorData", batches.outputs(batch, logp), {"loss:sum": float(loss.detach()), **metrics})

    def optim_step(self, optim_params=None, *, adam_params=None) -> Future:
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both")
        p = adam_params_of(optim_params if optim_params is not None else adam_params)
        return self._worker.submit("optim_step", self._optim_step, p, autocast=False)

    def _optim_step(self, p: AdamParams) -> OptimStepResponse:
        if self._step_error is not None:
            error, self._step_error = self._step_error, None
            self.optimizer.zero_grad(set_to_none=True)
            raise SessionError(f"not applied: a forward_backward of this step failed ({error})")
        sum_gradients_across_processes(self.model)  # each process holds its share of the step's gradient
        for group in self.optimizer.param_groups:
            group.update(lr=p.learning_rate, betas=(p.beta1, p.beta2), eps=p.eps, weight_decay=p.weight_decay)
        grad_norm = optim_step(self.model, self.optimizer, None, p.grad_clip_norm)
        self.policy_version += 1
        return OptimStepResponse({"grad_norm": grad_norm, "lr": p.learning_rate,
                                  "policy_version": float(self.policy_version)})

    # -- saving and loading
    def save_state(self, name: str, ttl_seconds: int | None = None, overwrite: bool = False,
                   user_metadata: dict | None = None) -> Future:
        """Weights (fp32, unchanged), optimizer state, step count and every process's RNG: an exact resume point
        (ServiceClient.create_training_client_from_state_with_optimizer)."""
        path, folder = self.service.checkpoint_path(self.model_id, "weights", name)
        return self._worker.submit("save_state", self._save_state, folder, path)

    def _save_state(self, folder: Path, path: str) -> SaveWeightsResponse:
        if rank() == 0:
            folder.mkdir(parents=True, exist_ok=True)
        barrier()
        checkpoint.save_process_state(folder, rank())
        if rank() == 0:
            checkpoint.save_shared_state(folder, self.model, self.optimizer, None, self.policy_version, 0, self.spec)
        barrier()
        return SaveWeightsResponse(path)

    def load_state(self, path: str, weights_access_token: str | None = None) -> Future:
        return self._worker.submit("load_state", self._load_state, path, False)

    def load_state_with_optimizer(self, path: str, weights_access_token: str | None = None) -> Future:
        return self._worker.submit("load_state_with_optimizer", self._load_state, path, True)

    def _load_state(self, path: str, with_optimizer: bool) -> LoadWeightsResponse:
        folder = self.service.resolve(path)
        if not (folder / "trainer_state.json").exists():
            raise FileNotFoundError(f"{path} holds no training state; write one with TrainingClient.save_state")
        if with_optimizer:
            state = checkpoint.load_checkpoint(folder, rank(), self.model, self.optimizer, None)
            self.policy_version = state["step"]
        else:
            weights.load_weights(self.model, folder / "model")
        return LoadWeightsResponse(path)

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None, user_metadata: dict | None = None,
                                 merge_weights: bool = True) -> Future:
        """A folder that from_pretrained loads: with LoRA and merge_weights, the adapter merged into an fp32 copy
        of the base (models.weights.save_merged; the live adapter is untouched), else the adapter alone; saved in the
        base's own dtype."""
        path, folder = self.service.checkpoint_path(self.model_id, "sampler_weights", name)
        return self._worker.submit("save_weights_for_sampler", self._save_weights, folder, path, merge_weights)

    def _save_weights(self, folder: Path, path: str, merge: bool) -> SaveWeightsForSamplerResponse:
        if rank() == 0:
            if merge and hasattr(self.model, "peft_config"):
                weights.save_merged(self.model, self.base_path, folder, config_dtype(self.base_path))
            else:
                weights.save_model(self.model, folder, config_dtype(self.base_path))
            self.tokenizer.save_pretrained(folder)
        barrier()
        return SaveWeightsForSamplerResponse(path)

    def stop(self) -> None:
        self._worker.stop()


class ServiceClient:
    """Creates clients on this process (and, under accelerate launch / torchrun, its peers: SPMD).
    tinker.ServiceClient's arguments are accepted; base_url is the SDK's (point tinker.ServiceClient at
    `python -m minirl.sessions.server`)."""

    def __init__(self, user_metadata: dict | None = None, project_id: str | None = None, *,
                 display_name: str | None = None, base_url: str | None = None, api_key: str | None = None,
                 dtype: str = "auto", attn_implementation: str = "auto", checkpoint_dir: str | None = None,
                 **service_only):
        if base_url is not None:
            raise ValueError("minirl.sessions.ServiceClient runs the model in this process; for a server started "
                             "with `python -m minirl.sessions.server` use tinker.ServiceClient(base_url=...)")
        from accelerate import PartialState
        # joins the process group when launched with several processes (on CPU only when told to: else each
        # process would be a world of one)
        state = PartialState(cpu=not torch.cuda.is_available())  # device-branch: sessions/process-state
        self.process_index, self.num_processes, self.device = state.process_index, state.num_processes, state.device
        self.dtype = pick_dtype(dtype, self.device)
        self.attn_implementation = pick_attn_implementation(attn_implementation, self.dtype)
        default_dir = Path(os.environ.get("MINIRL_CACHE", "~/.cache/minirl")) / "sessions"   # minirl's cache root
        self.checkpoint_dir = Path(checkpoint_dir or os.environ.get("MINIRL_SESSIONS_DIR") or default_dir).expanduser()
        self.session_id, self.training_clients = uuid.uuid4().hex[:12], []
        self.temperatures = SampledTemperatures()  # what sampled which sequence: the RL losses' T

    def __enter__(self) -> "ServiceClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, status: str = "success", detail: str | None = None) -> Future:
        for tc in self.training_clients:
            tc.stop()
        self.training_clients.clear()
        return Future.completed("close", None)

    # -- paths: tinker://<model_id>/<kind>/<name>, or a plain folder
    def checkpoint_path(self, model_id: str, kind: str, name: str) -> tuple[str, Path]:
        if os.sep in name or name.startswith((".", "~")):  # a folder of the caller's choosing
            return str(Path(name).expanduser()), Path(name).expanduser()
        path = f"tinker://{model_id}/{kind}/{name}"
        return path, self.resolve(path)

    def resolve(self, path: str) -> Path:
        if path.startswith("tinker://"):
            return self.checkpoint_dir / path[len("tinker://"):].replace(":", "_")
        return Path(path).expanduser()

    # -- clients
    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True, train_unembed: bool = True,
                                    user_metadata: dict | None = None, optimizer=None, *, alpha: int = 32,
                                    target_modules: str = "all-linear", **kwargs) -> ClientFuture:
        if not (train_mlp and train_attn and train_unembed):
            raise ValueError("train_mlp/train_attn/train_unembed=False are not supported: pass target_modules "
                             "(peft module names) instead")
        lora = {"rank": rank, "alpha": alpha, "target_modules": target_modules}
        return ready(TrainingClient(self, base_model, lora, seed or 0, **kwargs))

    def create_training_client(self, base_model: str, seed: int = 0, **kwargs) -> ClientFuture:
        """Full fine-tuning (minirl): every weight trains (fp32 weights and optimizer state)."""
        return ready(TrainingClient(self, base_model, None, seed, **kwargs))

    def _from_state(self, path: str, with_optimizer: bool) -> TrainingClient:
        folder = self.resolve(path)
        if not (folder / "trainer_state.json").exists():
            raise FileNotFoundError(f"{path} holds no session state; write one with TrainingClient.save_state")
        spec = json.loads((folder / "trainer_state.json").read_text())["config"]
        tc = TrainingClient(self, spec["base_model"], spec["lora"], spec["seed"], spec["micro_batch_size"],
                            spec["gradient_checkpointing"])
        tc._load_state(path, with_optimizer)
        return tc

    def create_training_client_from_state(self, path: str, base_model: str | None = None, user_metadata=None,
                                          weights_access_token=None, optimizer=None) -> ClientFuture:
        """The saved weights with a fresh optimizer."""
        return ready(self._from_state(path, False))

    def create_training_client_from_state_with_optimizer(self, path: str, base_model: str | None = None,
                                                         user_metadata=None, weights_access_token=None) -> ClientFuture:
        """The saved weights, optimizer state, step count and RNG: training continues bit-identically."""
        return ready(self._from_state(path, True))

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               retry_config=None, record_stability_info: bool = False,
                               micro_batch_size: int = 32) -> ClientFuture:
        """A sampler on saved weights (save_weights_for_sampler's path, an adapter folder) or a base model."""
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided")
        name = model_path if model_path is not None else base_model
        source = str(self.resolve(name)) if name.startswith("tinker://") else resolve_model_path(name)
        if name.startswith("tinker://") and not Path(source).is_dir():
            raise FileNotFoundError(f"{name} does not exist: no checkpoint was saved under that path (write one "
                                    "with save_weights_for_sampler, and pass the path it returns)")
        model = load_model(source, self.dtype, self.attn_implementation).to(self.device).eval()
        return ready(SamplingClient(model, load_tokenizer(source), _Worker(self.device, self.dtype), lambda: 0,
                                    micro_batch_size, temperatures=self.temperatures))

    def shutdown(self) -> None:
        """Leave the process group (all processes together); call once at the end of a multi-process loop."""
        shutdown()


add_async_variants(TrainingClient, plain=["forward", "forward_backward", "forward_backward_custom", "optim_step",
                                         "save_state", "load_state", "load_state_with_optimizer",
                                         "save_weights_for_sampler"],
                   creating=["create_sampling_client", "save_weights_and_get_sampling_client"])
add_async_variants(ServiceClient, plain=[], creating=["create_lora_training_client", "create_training_client_from_state",
                                                      "create_training_client_from_state_with_optimizer",
                                                      "create_sampling_client"])
