"""The parts of the sessions API (minirl/sessions/client.py) that are not the clients: the data that crosses the API,
the futures, the worker thread that runs a client's operations in call order, and the collation of datums into
the batch layout update.forward_backward takes.

Why one worker thread per client: operations must run in the order they were called (an optim_step after its
forward_backward), while the caller is free to queue the next ones (Tinker's futures). `sample` calls are held
back until something else is submitted or any result is awaited; then the calls whose parameters agree become
one batch, so the batch does not depend on how fast the worker was, and runs are reproducible.

Shapes: N datums, P prompt tokens (left-padded), R completion tokens (right-padded).
"""
from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from minirl.models import autocast

# --- the data that crosses the API ---------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0      # 0 decodes greedily
    top_p: float = 1.0
    top_k: int = -1               # Tinker's "off"
    seed: int | None = None       # a fixed seed makes the call's samples independent of what ran before it


@dataclass(frozen=True)
class AdamParams:                 # Tinker's defaults; grad_clip_norm 0 = no clipping
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0     # decoupled (AdamW)
    grad_clip_norm: float = 0.0


@dataclass
class Datum:
    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float] | None = None            # the sampler's, one per completion token (RL losses)
    advantages: float | list[float] = 0.0           # one per sequence, or one per completion token
    weights: list[float] | None = None              # per completion token; None = all 1


@dataclass
class SampledSequence:
    tokens: list[int]             # up to and including the stop token
    logprobs: list[float]         # log pi_T of each token at the sampling temperature
    stop_reason: str              # "stop" (an EOS) or "length" (max_tokens)
    entropy: list[float] = field(default_factory=list)  # of pi_T at each position (a metric, as train.py's)


@dataclass
class SampleResponse:
    sequences: list[SampledSequence]
    policy_version: int           # optimizer steps applied to the weights that sampled (for staleness checks)


@dataclass
class ForwardBackwardOutput:
    loss: float
    metrics: dict[str, float] = field(default_factory=dict)


class SessionError(RuntimeError):
    """An operation failed; raised by .result() naming the operation and the original error."""


# --- futures and the worker ----------------------------------------------------------------------------------

class Future:
    """The result of a queued operation. .result() first releases held-back `sample` calls (see module doc)."""

    def __init__(self, name: str, worker: "_Worker"):
        self.name, self._worker, self._future = name, worker, concurrent.futures.Future()

    def result(self, timeout: float | None = None):
        if threading.current_thread() is self._worker._thread and not self._future.done():
            # e.g. a forward_backward_custom loss waiting for a sample: the worker would wait for itself forever
            raise SessionError(f"{self.name}: .result() called inside another operation of the same session, "
                               "which runs on the thread this result waits for; get results before or after it")
        self._worker.flush()
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise
        except Exception as e:
            raise SessionError(f"{self.name} failed: {type(e).__name__}: {e}") from e

    def done(self) -> bool:
        return self._future.done()


class _Worker:
    """One thread that runs a client's operations in call order, on the client's device, each forward pass in
    the client's autocast (both are thread-local: the thread enters them itself). Autocast is entered per
    operation and never around an optimizer step: it caches the low-precision copy of each weight until its
    context exits, so a forward pass after optim_step in the same context would see stale weights."""

    def __init__(self, device: torch.device, dtype: torch.dtype):
        self.device, self.dtype = device, dtype
        self._queue: list = []
        self._held: list = []   # sample calls not yet queued: (key, future, prompt, run_batch)
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True, name="minirl-session")
        self._thread.start()

    def submit(self, name: str, fn: Callable, *args, autocast: bool = True) -> Future:
        self.flush()
        fut = Future(name, self)
        self._put([fut], lambda: [fn(*args)], autocast)
        return fut

    def submit_sample(self, key: tuple, prompt: list[int], run_batch: Callable) -> Future:
        fut = Future("sample", self)
        with self._cv:
            self._held.append((key, fut, prompt, run_batch))
        return fut

    def flush(self) -> None:
        """Queue the held sample calls, one batch per distinct key, in order of first appearance."""
        with self._cv:
            held, self._held = self._held, []
        batches: dict[tuple, list] = {}
        for item in held:
            batches.setdefault(item[0], []).append(item)
        for items in batches.values():
            prompts, run_batch = [p for _, _, p, _ in items], items[0][3]
            self._put([f for _, f, _, _ in items], lambda prompts=prompts, run_batch=run_batch: run_batch(prompts))

    def _put(self, futures: list[Future], fn: Callable | None, autocast: bool = True) -> None:
        with self._cv:
            self._queue.append((futures, fn, autocast))
            self._cv.notify()

    def _run(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue)
                futures, fn, low_precision = self._queue.pop(0)
            if fn is None:
                return
            try:
                with autocast(self.device, self.dtype if low_precision else torch.float32):
                    results = fn()
                for f, r in zip(futures, results):
                    f._future.set_result(r)
            except BaseException as e:  # surfaces at .result(), naming the operation
                for f in futures:
                    f._future.set_exception(e)

    def stop(self) -> None:
        self.flush()
        self._put([], None)
        self._thread.join()


# --- batches from datums -------------------------------------------------------------------------------------

def collate(datums: list[Datum], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The layout update.forward_backward takes (rollout.py's): prompts left-padded, completions right-padded.
    response_mask carries the weights; attention covers every real token, weight 0 or not."""
    N, P, R = len(datums), max(len(d.prompt_tokens) for d in datums), max(len(d.completion_tokens) for d in datums)
    ids = torch.full((N, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros(N, P + R, dtype=torch.long)
    weights, old_logp, adv = torch.zeros(N, R), torch.zeros(N, R), torch.zeros(N, R)
    for i, d in enumerate(datums):
        p, c = len(d.prompt_tokens), len(d.completion_tokens)
        ids[i, P - p:P + c] = torch.tensor(d.prompt_tokens + d.completion_tokens, dtype=torch.long)
        attn[i, P - p:P + c] = 1
        weights[i, :c] = torch.tensor(d.weights, dtype=torch.float32) if d.weights is not None else 1.0
        if d.logprobs is not None:
            old_logp[i, :c] = torch.tensor(d.logprobs, dtype=torch.float32)
        adv[i, :c] = torch.tensor(d.advantages, dtype=torch.float32)
    scalar = all(isinstance(d.advantages, (int, float)) for d in datums)  # (N,), exactly as train.py passes them
    batch = {"input_ids": ids, "attention_mask": attn, "response_mask": weights, "old_logp": old_logp,
             "advantages": adv[:, 0] if scalar else adv}
    return {k: v.to(device) for k, v in batch.items()}


LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo")
