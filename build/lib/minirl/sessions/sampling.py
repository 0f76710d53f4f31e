"""The sessions API's SamplingClient (Tinker's): `sample` and `compute_logprobs` on a model, as thin wrappers
over `rollout.sample` and `logprobs.batched_logprobs`.

`sample` calls submitted together run as one `generate` where their parameters agree (the worker's batching,
minirl/sessions/worker.py). Each sampled token's log-prob is the trainer's own teacher-forced log-prob of pi_T
at the sampling temperature (what train.py's prepare_batch computes as old_logp), so on-policy ratios are 1,
and an RL loss scores a datum at the temperature that sampled it (`SampledTemperatures`). The log-probs are of
the whole tempered distribution, also when top-p or top-k truncated what was sampled from (as the trainer's).
A seeded call draws from a torch.Generator of its own, so other threads' draws cannot change its samples.

Shapes: N = B*G sequences, P prompt tokens (left-padded), R completion tokens (right-padded).
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import threading
import uuid
from collections.abc import Callable

import torch

from minirl.logprobs import batched_logprobs
from minirl.models import adapter_disabled
from minirl.rollout import eos_token_ids, sample
from minirl.sessions.types import (SampledSequence, SampleResponse, SamplingParams, sampling_params_of, tensor_of,
                                   tokens_of)
from minirl.sessions.worker import Future, _Worker, add_async_variants


class SamplingClient:
    """Samples from, and scores with, a model. From a training client it shares that client's worker, so its
    calls run in order with training calls; `use_adapter=False` runs the LoRA base model (the reference of KL
    penalties, DPO and KTO) without a second copy."""

    def __init__(self, model, tokenizer, worker: _Worker, version: Callable[[], int], micro_batch_size: int = 32,
                 use_adapter: bool = True, temperatures: "SampledTemperatures | None" = None):
        self.model, self.tokenizer, self._worker, self._version = model, tokenizer, worker, version
        self.micro_batch_size, self.use_adapter, self.temperatures = micro_batch_size, use_adapter, temperatures

    def get_tokenizer(self):
        return self.tokenizer

    def get_base_model(self) -> str:
        return getattr(self.model.config, "_name_or_path", "")

    def _adapter(self):
        return contextlib.nullcontext() if self.use_adapter else adapter_disabled(self.model)

    def sample(self, prompt, num_samples: int = 1, sampling_params=None, include_prompt_logprobs: bool = False,
               topk_prompt_logprobs: int = 0, topk_sample_logprobs: int = 0, **unsupported) -> Future:
        """num_samples completions of `prompt` (a ModelInput, the SDK's, or a token list)."""
        if topk_prompt_logprobs or topk_sample_logprobs or any(unsupported.values()):
            raise ValueError("top-k log-probs, target_prompt_logprobs and prompt_alt_tokens are not supported")
        params = sampling_params_of(sampling_params)
        stop = self._stop_strings(params.stop)
        # calls that agree run as one generate; a seeded call runs alone, so that its samples depend on its seed
        # only, not on which calls arrived with it (over HTTP that is a race)
        alone = object() if params.seed is not None else None
        key = (id(self), num_samples, params.max_tokens, params.temperature, params.top_p, params.top_k,
               params.seed, tuple(stop), include_prompt_logprobs, alone)
        run = lambda prompts: self._sample_batch(prompts, num_samples, params, stop, include_prompt_logprobs)  # noqa: E731
        return self._worker.submit_sample(key, tokens_of(prompt), run)

    def _stop_strings(self, stop) -> list[str]:
        if stop is None:
            return []
        stop = [stop] if isinstance(stop, (str, int)) else list(stop)
        eos = set(eos_token_ids(self.tokenizer, self.model))
        if any(isinstance(s, int) and s not in eos for s in stop):
            raise ValueError(f"stop token ids other than EOS {sorted(eos)} are not supported; pass stop strings")
        return [s for s in stop if isinstance(s, str)]

    def _sample_batch(self, prompts: list[list[int]], G: int, params: SamplingParams, stop: list[str],
                      with_prompt_logprobs: bool) -> list[SampleResponse]:
        """One generate for all prompts (rollout.sample), then the sampled tokens' log-probs at the sampling
        temperature from the trainer's forward pass, with the entropy (exactly as train.py's prepare_batch)."""
        T, greedy = params.temperature or 1.0, params.temperature == 0
        generator = None if params.seed is None else torch.Generator(self._worker.device).manual_seed(params.seed)
        with self._adapter():
            rollout = sample(self.model, self.tokenizer, prompts, G, params.max_tokens or 256, T, params.top_p,
                             max(params.top_k, 0), greedy=greedy, stop=stop or None, generator=generator)
            R = rollout.response_ids.shape[1]
            logp, entropy = batched_logprobs(self.model, rollout.input_ids, rollout.attention_mask, R,
                                             self.micro_batch_size, T, with_entropy=True)              # (N, R)
        lengths, version = rollout.response_mask.sum(1).tolist(), self._version()
        seqs = [SampledSequence(rollout.response_ids[i, :n].tolist(), logp[i, :n].tolist(),
                                "length" if rollout.truncated[i] else "stop", uuid.uuid4().hex, entropy[i, :n].tolist())
                for i, n in enumerate(lengths)]
        if self.temperatures is not None:  # before the result is out: a loss on these samples finds their T
            for i, n in enumerate(lengths):
                self.temperatures.record(rollout.response_ids[i, :n], logp[i, :n], T)
        prompt_logprobs = self._compute_logprobs(prompts) if with_prompt_logprobs else [None] * len(prompts)
        return [SampleResponse(seqs[b * G:(b + 1) * G], prompt_logprobs[b], version) for b in range(len(prompts))]

    def compute_logprobs(self, prompt, prompt_logprobs_last_n: int | None = None) -> Future:
        """log p(token_t | tokens_<t) of each token (temperature 1); the first is None. A list of sequences
        gives a list of such lists (minirl)."""
        if prompt_logprobs_last_n is not None:
            raise ValueError("prompt_logprobs_last_n is not supported")
        many = isinstance(prompt, (list, tuple)) and len(prompt) > 0 and not isinstance(prompt[0], int)
        sequences = [tokens_of(p) for p in prompt] if many else [tokens_of(prompt)]
        fut = self._worker.submit("compute_logprobs", self._compute_logprobs, sequences)
        if many:
            return fut
        one = Future("compute_logprobs", self._worker)
        fut._future.add_done_callback(lambda f: one._future.set_exception(f.exception()) if f.exception()
                                      else one._future.set_result(f.result()[0]))
        return one

    def _compute_logprobs(self, sequences: list[list[int]]) -> list[list[float | None]]:
        """Each sequence as a one-token "prompt" and the rest as its response, in the rollout layout."""
        R = max(len(s) for s in sequences) - 1
        if R < 1:
            return [[None] * len(s) for s in sequences]
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(sequences), 1 + R), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, s in enumerate(sequences):
            ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
            attn[i, :len(s)] = 1
        device = self._worker.device
        with self._adapter():
            logp, _ = batched_logprobs(self.model, ids.to(device), attn.to(device), R, self.micro_batch_size)
        return [[None] + logp[i, :len(s) - 1].tolist() for i, s in enumerate(sequences)]


class SampledTemperatures:
    """Which temperature sampled which sequence, so that an RL loss scores each datum at its own sampling
    temperature whenever its forward_backward runs: the key is the sampled data itself (the tokens and their
    float32 log-probs, which a datum carries as target_tokens and logprobs), not the order of calls. A sample
    whose log-probs are all 0.0 (a confident one at a low T) is keyed by its tokens alone, found as the datum's
    last tokens. One per ServiceClient, shared by its samplers (those on saved weights too); it keeps the last
    `capacity` keys. A datum it does not know takes the one temperature recorded, if there is exactly one and
    nothing was evicted; otherwise it raises, naming loss_fn_config={'temperature': T}."""

    def __init__(self, capacity: int = 1 << 16):
        self.capacity, self._seen, self._lock = capacity, collections.OrderedDict(), threading.Lock()
        self._zero_lengths, self.evicted = collections.Counter(), False  # lengths of the tokens-only keys

    @staticmethod
    def _keys(tokens: torch.Tensor, logprobs: torch.Tensor) -> list[bytes]:
        """A key per run of positions with a log-prob (a datum's unsampled positions carry 0)."""
        tokens, logprobs = tokens.detach().cpu().long(), logprobs.detach().cpu().float()
        edges = torch.diff((logprobs != 0).long(), prepend=torch.zeros(1, dtype=torch.long),
                           append=torch.zeros(1, dtype=torch.long)).nonzero().squeeze(1).tolist()
        return [hashlib.blake2b(tokens[a:b].numpy().tobytes() + logprobs[a:b].numpy().tobytes(),
                                digest_size=16).digest() for a, b in zip(edges[::2], edges[1::2])]

    @staticmethod
    def _tokens_key(tokens: torch.Tensor) -> tuple:
        tokens = tokens.detach().cpu().long()
        return len(tokens), hashlib.blake2b(tokens.numpy().tobytes(), digest_size=16).digest()

    def record(self, tokens: torch.Tensor, logprobs: torch.Tensor, temperature: float) -> None:
        keys = self._keys(tokens, logprobs)
        if not keys and len(tokens):  # every log-prob is 0.0: the tokens alone
            keys = [self._tokens_key(tokens)]
        with self._lock:
            for key in keys:
                if isinstance(key, tuple) and key not in self._seen:
                    self._zero_lengths[key[0]] += 1
                self._seen[key] = float(temperature)
                self._seen.move_to_end(key)
            while len(self._seen) > self.capacity:
                key, _ = self._seen.popitem(last=False)
                self.evicted = True
                if isinstance(key, tuple):
                    self._zero_lengths[key[0]] -= 1
                    self._zero_lengths += collections.Counter()  # drops the lengths at 0

    def _temps(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> set[float]:
        keys = self._keys(tokens, logprobs)
        if not keys:  # no log-prob: a tokens-only key of its last n tokens, for each n recorded
            keys = [self._tokens_key(tokens[len(tokens) - n:]) for n in self._zero_lengths if n <= len(tokens)]
        return {self._seen[k] for k in keys if k in self._seen}

    def of(self, datums: list) -> float:
        """The temperature that sampled these datums; 1 for data no sampler here returned, if none recorded."""
        found, unknown = set(), False
        with self._lock:
            for d in datums:
                inputs = d.loss_fn_inputs
                if "logprobs" not in inputs or "target_tokens" not in inputs:
                    continue  # collate names what is missing
                temps = self._temps(tensor_of(inputs["target_tokens"]), tensor_of(inputs["logprobs"]))
                found |= temps
                unknown |= not temps
            recorded, evicted = set(self._seen.values()), self.evicted
        if unknown and (evicted or len(recorded | found) > 1):
            raise ValueError("this batch holds samples this server did not return, or no longer remembers "
                             f"(temperatures recorded: {sorted(recorded)}): pass the temperature that sampled "
                             "them as loss_fn_config={'temperature': T}")
        found |= recorded if unknown else set()
        if len(found) > 1:
            raise ValueError(f"this batch holds samples of temperatures {sorted(found)}: send one forward_backward "
                             "per temperature, or pass the one that sampled it as loss_fn_config={'temperature': T}")
        return next(iter(found), 1.0)


add_async_variants(SamplingClient, plain=[], creating=["sample", "compute_logprobs"])
