"""The model side of the server: requests collected for a short window, those whose sampling parameters agree
run as one `rollout.sample` (one `generate`, the trainer's sampler), then, only for the requests that ask for
log-probs, one teacher-forced pass of the trainer's log-prob path (logprobs.py) over prompt and completion.

    engine = Engine(model, tokenizer)                       # or Engine(..., run=a session worker's queue)
    job = Job([[1, 2, 3]], Sampling(max_tokens=16, greedy=True), top_logprobs=1)
    engine.submit(job); job.done.wait(); job.outputs        # [Output(tokens, finish_reason, logprobs, top)]

Batching: one thread waits for the first request, waits `window_s` more (or until `max_batch_rows` rows are
pending), then runs each group of agreeing requests; requests that arrive meanwhile wait for the next round,
so under load every generate is as full as the traffic allows. A seeded sampling request runs in a generate of
its own: the noise a row gets depends on the rows around it, so only alone does its seed fix its samples; and
it draws from a torch.Generator of its own, which other threads (training, other servers) do not draw from.

Dropping: a cancelled job (the client hung up) is skipped if it has not started; if every job of a running
generate is cancelled, a hook on the decoder ends it at the next step. A generate with live requests left runs
on (its rows cannot leave a running `generate`).

Log-probs are of the model's own distribution (temperature 1, no top-p/top-k), as vLLM reports them by default.
A row ends at its EOS, at the token completing a stop string, or at its own budget (its own prompt's room in
the context: rollout.row_budgets), whatever else shares its generate.

Shapes: N rows (prompts x n samples), P prefix tokens (left-padded), R scored tokens (right-padded), H hidden,
K top log-probs.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minirl.logprobs import batched_logprobs, chunked_logprobs, final_logits_transform, states_before_responses
from minirl.rollout import sample


@dataclass(frozen=True)
class Sampling:
    """What must agree for requests to share a generate."""
    max_tokens: int                # 0: no generation (scoring only)
    temperature: float = 1.0       # ignored when greedy
    top_p: float = 1.0
    top_k: int = 0                 # 0 = off
    greedy: bool = False
    stop: tuple[str, ...] = ()     # generation ends at the token that completes one
    n: int = 1                     # samples per prompt
    seed: int | None = None


@dataclass
class Output:
    """One choice: a prompt's sample."""
    prompt: int                    # which of the job's prompts
    tokens: list[int]              # generated, up to and including the EOS or the token completing a stop string
    finish_reason: str             # "stop" (EOS or stop string) or "length"
    logprobs: list[float] | None = None                # per scored token: with echo the prompt's from its 2nd
    top: list[list[tuple[int, float]]] | None = None   # token on, then the completion's; else the completion's


class Job:
    """One HTTP request's work and, once `done` is set, its outputs (prompt-major: prompt i's n samples) or
    its error."""

    def __init__(self, prompts: list[list[int]], sampling: Sampling, top_logprobs: int | None = None,
                 echo: bool = False):
        self.prompts, self.sampling, self.top_logprobs, self.echo = prompts, sampling, top_logprobs, echo
        self.outputs: list[Output] | None = None
        self.error: str | None = None
        self.done, self.cancelled = threading.Event(), threading.Event()
        self.arrived = time.monotonic()

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.sampling.n

    def key(self) -> tuple:
        alone = self.sampling.seed is not None and not self.sampling.greedy
        return self.sampling, id(self) if alone else None


class _Gone(Exception):
    """Every client of the running batch has hung up."""


class Engine:
    """The batching thread in front of one model. `run(fn)` runs fn where the model lives (a session's worker
    thread, so that requests interleave with training operations) and returns its result; `adapter()` is the
    context a LoRA sampler runs in."""

    def __init__(self, model, tokenizer, run: Callable[[Callable], object] | None = None,
                 adapter: Callable[[], contextlib.AbstractContextManager] | None = None,
                 window_s: float = 0.02, max_batch_rows: int = 64, micro_batch_size: int = 16):
        self.model, self.tokenizer = model, tokenizer
        self.run = run or (lambda fn: fn())
        self.adapter = adapter or contextlib.nullcontext
        self.window_s, self.max_batch_rows, self.micro_batch_size = window_s, max_batch_rows, micro_batch_size
        self._pending: list[Job] = []
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="minirl-serve-batcher")
        self._thread.start()

    def submit(self, job: Job) -> Job:
        with self._cv:
            self._pending.append(job)
            self._cv.notify()
        return job

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()

    # -- the batching loop
    def _loop(self) -> None:
        while True:
            groups = self._next_groups()
            if groups is None:
                return
            for jobs in groups:
                try:
                    self.run(lambda jobs=jobs: self._run(jobs))
                except Exception as e:  # noqa: BLE001  (e.g. the session's worker failed before running it)
                    for job in jobs:
                        job.error = job.error or f"{type(e).__name__}: {e}"
                        job.done.set()

    def _next_groups(self) -> list[list[Job]] | None:
        """Wait for a request and the window after it, then take the pending jobs, grouped by key in order of
        arrival, each group at most max_batch_rows rows (a job larger than that runs alone)."""
        with self._cv:
            self._cv.wait_for(lambda: self._pending or self._closed)
            if self._closed:
                return None
            full = lambda: sum(j.rows for j in self._pending) >= self.max_batch_rows  # noqa: E731
            deadline = self._pending[0].arrived + self.window_s
            while not full() and not self._closed and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(left)
            jobs, self._pending = self._pending, []
        groups: dict[tuple, list[list[Job]]] = {}
        for job in jobs:
            if job.cancelled.is_set():
                job.done.set()
                continue
            batches = groups.setdefault(job.key(), [[]])
            if batches[-1] and sum(j.rows for j in batches[-1]) + job.rows > self.max_batch_rows:
                batches.append([])
            batches[-1].append(job)
        return [batch for batches in groups.values() for batch in batches]

    # -- one batch, on the model's thread
    def _run(self, jobs: list[Job]) -> None:
        jobs = [j for j in jobs if not j.cancelled.is_set()]
        try:
            if jobs:
                s = jobs[0].sampling
                prompts = [p for j in jobs for p in j.prompts]
                with self.adapter(), _stop_when_gone(self.model, jobs):
                    rows = self._generate(prompts, s)
                    outputs = [[Output(i, *rows[(first + i) * s.n + k]) for i in range(len(j.prompts))
                                for k in range(s.n)] for j, first in zip(jobs, _offsets(jobs))]
                    self._score(jobs, outputs)
                for job, out in zip(jobs, outputs):
                    job.outputs = out
        except _Gone:
            pass
        except Exception as e:  # noqa: BLE001  (a failed batch fails its requests, not the server)
            for job in jobs:
                job.error = f"{type(e).__name__}: {e}"
        finally:
            for job in jobs:
                job.done.set()

    def _generate(self, prompts: list[list[int]], s: Sampling) -> list[tuple[list[int], str]]:
        """(tokens, finish_reason) of each of the N = len(prompts) * n rows, prompt-major."""
        if s.max_tokens == 0:
            return [([], "length")] * (len(prompts) * s.n)
        device = _device(self.model)
        generator = None if s.seed is None or s.greedy else torch.Generator(device).manual_seed(s.seed)
        ro = sample(self.model, self.tokenizer, prompts, s.n, s.max_tokens, 1.0 if s.greedy else s.temperature,
                    s.top_p, s.top_k, greedy=s.greedy, stop=list(s.stop) or None, generator=generator)
        lengths = ro.response_mask.sum(1).tolist()
        return [(ro.response_ids[i, :n].tolist(), "length" if ro.truncated[i] else "stop")
                for i, n in enumerate(lengths)]

    def _score(self, jobs: list[Job], outputs: list[list[Output]]) -> None:
        """Fill in the log-probs of the jobs that asked, one pass for all of their rows."""
        rows = [(j, o) for j, outs in zip(jobs, outputs) if j.top_logprobs is not None for o in outs]
        prefixes, targets = [], []
        for job, o in rows:
            prompt = job.prompts[o.prompt]
            cut = 1 if job.echo else len(prompt)  # with echo every prompt token after the first is scored too
            prefixes.append(prompt[:cut])
            targets.append(prompt[cut:] + o.tokens)
        scored = [i for i, t in enumerate(targets) if t]
        for job, o in rows:  # an empty target (no echo, nothing generated) scores nothing
            o.logprobs, o.top = [], []
        if not scored:
            return
        K = max(job.top_logprobs for job, _ in rows)
        logp, top = score(self.model, [prefixes[i] for i in scored], [targets[i] for i in scored], K,
                          self.micro_batch_size)
        for i, lp, tp in zip(scored, logp, top):
            job, o = rows[i]
            o.logprobs = lp
            o.top = [pos[:job.top_logprobs] for pos in tp] if job.top_logprobs else [[] for _ in lp]


def _offsets(jobs: list[Job]) -> list[int]:
    """Index of each job's first prompt in the batch's prompt list."""
    starts, total = [], 0
    for j in jobs:
        starts.append(total)
        total += len(j.prompts)
    return starts


def _device(model) -> torch.device:
    return next(model.parameters()).device


@contextlib.contextmanager
def _stop_when_gone(model, jobs: list[Job]):
    """End the batch at the decoder's next call once every one of its clients has hung up."""
    def check(module, args):
        if all(j.cancelled.is_set() for j in jobs):
            raise _Gone
    handle = model.get_decoder().register_forward_pre_hook(check)
    try:
        yield
    finally:
        handle.remove()


# --- scoring: the trainer's log-prob path, plus the most likely tokens ------------------------------------------

@torch.no_grad()
def score(model, prefixes: list[list[int]], targets: list[list[int]], top: int = 0, micro_batch_size: int = 16
          ) -> tuple[list[list[float]], list[list[list[tuple[int, float]]]]]:
    """log p(target_t | prefix, target_<t) for each target token, and the `top` most likely tokens at each of
    those positions as (token, log p). The layout is the trainer's (prefixes left-padded, targets right-padded),
    and the log-probs come from its functions: logprobs.batched_logprobs, or with `top` its two halves
    (states_before_responses, chunked_logprobs) so that the top tokens come from the same hidden states."""
    N, P, R = len(prefixes), max(map(len, prefixes)), max(map(len, targets))
    ids = torch.zeros(N, P + R, dtype=torch.long)  # padding: any real token id (the mask hides it)
    attn = torch.zeros(N, P + R, dtype=torch.long)
    for i, (p, t) in enumerate(zip(prefixes, targets)):
        ids[i, P - len(p):P + len(t)] = torch.tensor(p + t)
        attn[i, P - len(p):P + len(t)] = 1
    ids, attn = ids.to(_device(model)), attn.to(_device(model))
    if not top:
        logp, _ = batched_logprobs(model, ids, attn, R, micro_batch_size)                          # (N, R)
        return [logp[i, :len(t)].tolist() for i, t in enumerate(targets)], [[] for _ in targets]
    head, transform = model.get_output_embeddings(), final_logits_transform(model)
    logps, tops = [], []
    for s in range(0, N, micro_batch_size):
        hidden = states_before_responses(model, ids[s:s + micro_batch_size], attn[s:s + micro_batch_size], R)
        y = ids[s:s + micro_batch_size, -R:]                                                         # (n, R)
        logp, _ = chunked_logprobs(hidden, y, head, transform=transform)                             # (n, R)
        values, tokens = top_logprobs(hidden, head, top, transform)                                  # (n, R, K)
        # a token in both lists gets the one number, so "is the target the most likely token" compares equals
        values = torch.where(tokens == y[..., None], logp[..., None], values)
        logps.append(logp)
        tops.append((values, tokens))
    logp = torch.cat(logps)
    values, tokens = torch.cat([v for v, _ in tops]), torch.cat([t for _, t in tops])
    return ([logp[i, :len(t)].tolist() for i, t in enumerate(targets)],
            [[list(zip(tokens[i, r].tolist(), values[i, r].tolist())) for r in range(len(t))]
             for i, t in enumerate(targets)])


def top_logprobs(hidden: torch.Tensor, lm_head: torch.nn.Module, k: int, transform=None, chunk_tokens: int = 128
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest log_softmax(transform(lm_head(hidden))) entries at each position (the logits as
    logprobs.chunked_logprobs computes them), chunk by chunk: never the whole (N, R, V) at once.
    (N, R, H) -> values (N, R, K) fp32, token ids (N, R, K)"""
    N, R, H = hidden.shape
    flat = hidden.reshape(N * R, H)
    values, tokens = [], []
    for s in range(0, N * R, chunk_tokens):
        logits = lm_head(flat[s:s + chunk_tokens]).float()                                         # (n, V)
        logp = torch.log_softmax(logits if transform is None else transform(logits), dim=-1)
        v, t = logp.topk(k, dim=-1)
        values.append(v)
        tokens.append(t)
    return torch.cat(values).view(N, R, k), torch.cat(tokens).view(N, R, k)
