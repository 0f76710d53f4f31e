"""The futures of the sessions API and the worker thread that runs a client's operations in call order.

Futures are Tinker's APIFuture: `.result(timeout)`, `await fut`, `await fut.result_async()`, `.future()` (a
concurrent.futures.Future), `.done()`. Calls that create a client return a `ClientFuture`: a future of the
client that also forwards attribute access to it, so both `svc.create_lora_training_client(...).result()` and
the older `tc = svc.create_lora_training_client(...)` work, as with the SDK.

Why one worker thread per client: operations must run in the order they were called (an optim_step after its
forward_backward), while the caller is free to queue the next ones. `sample` calls are held back until
something else is submitted or any result is awaited; then the calls whose parameters agree become one batch,
so the batch does not depend on how fast the worker was, and runs are reproducible.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable

import torch

from minirl.models import autocast


class SessionError(RuntimeError):
    """An operation failed; raised by .result() naming the operation and the original error."""


class Future:
    """The result of a queued operation. .result() first releases held-back `sample` calls (module doc)."""

    def __init__(self, name: str, worker: "_Worker | None"):
        self.name, self._worker, self._future = name, worker, concurrent.futures.Future()

    def result(self, timeout: float | None = None):
        if self._worker is not None:
            if threading.current_thread() is self._worker._thread and not self._future.done():
                # e.g. a forward_backward_custom loss waiting for a sample: the worker would wait for itself
                raise SessionError(f"{self.name}: .result() called inside another operation of the same "
                                   "session, which runs on the thread this result waits for; get results before "
                                   "or after it")
            self._worker.flush()
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise
        except SessionError:
            raise
        except Exception as e:
            raise SessionError(f"{self.name} failed: {type(e).__name__}: {e}") from e

    async def result_async(self, timeout: float | None = None):
        return await asyncio.wait_for(asyncio.to_thread(self.result), timeout)

    def __await__(self):
        return self.result_async().__await__()

    def future(self) -> concurrent.futures.Future:
        if self._worker is not None:
            self._worker.flush()
        return self._future

    def done(self) -> bool:
        return self._future.done()

    @classmethod
    def completed(cls, name: str, value) -> "Future":
        fut = cls(name, None)
        fut._future.set_result(value)
        return fut


class ClientFuture(Future):
    """A future of a client that is also the client: attribute access goes to the result (module doc)."""

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.result(), name)


def ready(client) -> ClientFuture:
    """A client as an already-completed ClientFuture (the SDK's client-creating calls return futures)."""
    fut = ClientFuture(type(client).__name__, None)
    fut._future.set_result(client)
    return fut


def add_async_variants(cls, plain: list[str], creating: list[str]) -> None:
    """The SDK's `*_async` methods: coroutines that return what the plain method returns (a future), or, for
    the calls that create a client, the client itself."""
    def make(name: str, creates_client: bool):
        async def variant(self, *args, **kwargs):
            out = getattr(self, name)(*args, **kwargs)
            return await out if creates_client else out
        variant.__name__ = f"{name}_async"
        return variant
    for name in plain + creating:
        setattr(cls, f"{name}_async", make(name, name in creating))


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
        if self.device.type == "cuda":  # device-branch: sessions/worker-device
            torch.cuda.set_device(self.device)  # the thread's own current device (NCCL and kernels use it)
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
