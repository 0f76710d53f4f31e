"""The data that crosses the sessions API (minirl/sessions/client.py), shaped as the official Tinker SDK's
`tinker.types`: the same class names, fields and defaults, so a loop written for Tinker builds its inputs the
same way. Every function that takes these also takes the SDK's own objects (duck typing: `to_ints()`,
`to_torch()`, `.loss_fn_inputs`, ...), so `tinker.types.Datum` and these are interchangeable.

A Datum follows Tinker's next-token alignment: `model_input` is the sequence without its last token, and
`loss_fn_inputs[k][i]` belongs to the prediction made at position i, i.e. of token i+1 of the full sequence
(`target_tokens[i]`). `Datum.from_completion` builds one from a prompt and a completion.

The futures and the worker thread live in minirl/sessions/worker.py (re-exported here).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minirl.sessions.worker import Future, SessionError, _Worker  # noqa: F401  (re-exported)

# --- inputs --------------------------------------------------------------------------------------------------

@dataclass
class EncodedTextChunk:
    tokens: list[int]
    type: str = "encoded_text"

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass
class ModelInput:
    """A token sequence, as a list of chunks (text only: images are left out)."""
    chunks: list[EncodedTextChunk] = field(default_factory=list)

    @classmethod
    def from_ints(cls, tokens: list[int]) -> "ModelInput":
        return cls([EncodedTextChunk(list(tokens))])

    @classmethod
    def empty(cls) -> "ModelInput":
        return cls([])

    def to_ints(self) -> list[int]:
        return [t for c in self.chunks for t in c.tokens]

    @property
    def length(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)

    def append(self, chunk) -> "ModelInput":
        return ModelInput(self.chunks + [EncodedTextChunk(list(chunk.tokens))])

    def append_int(self, token: int) -> "ModelInput":
        return self.append(EncodedTextChunk([token]))


@dataclass
class TensorData:
    """A flat tensor on the wire: `data` (a list), its dtype ("int64" | "float32") and shape."""
    data: list
    dtype: str = "float32"
    shape: list[int] | None = None

    @classmethod
    def from_torch(cls, t: torch.Tensor) -> "TensorData":
        dtype = "int64" if not t.is_floating_point() else "float32"
        return cls(t.reshape(-1).tolist(), dtype, list(t.shape))

    @classmethod
    def from_numpy(cls, a) -> "TensorData":
        return cls.from_torch(torch.from_numpy(a))

    def to_torch(self) -> torch.Tensor:
        t = torch.tensor(self.data, dtype=torch.long if self.dtype == "int64" else torch.float32)
        return t.view(*self.shape) if self.shape else t

    def tolist(self) -> list:
        return self.to_torch().tolist()


class Datum:
    """Tinker's Datum(model_input, loss_fn_inputs). Also built as Datum(prompt_tokens, completion_tokens,
    logprobs=None, advantages=None, weights=None) from two token lists: `from_completion`'s layout."""

    def __init__(self, model_input, loss_fn_inputs: dict | list | None = None, logprobs: list[float] | None = None,
                 advantages: float | list[float] | None = None, weights: list[float] | None = None):
        if isinstance(model_input, (list, tuple)):  # (prompt tokens, completion tokens)
            made = Datum.from_completion(list(model_input), list(loss_fn_inputs or []), logprobs, advantages, weights)
            model_input, loss_fn_inputs = made.model_input, made.loss_fn_inputs
        self.model_input, self.loss_fn_inputs = model_input, dict(loss_fn_inputs or {})

    def __repr__(self) -> str:
        return f"Datum(model_input={self.model_input!r}, loss_fn_inputs={self.loss_fn_inputs!r})"

    @classmethod
    def from_completion(cls, prompt: list[int], completion: list[int], logprobs: list[float] | None = None,
                        advantages: float | list[float] | None = None, weights: list[float] | None = None) -> "Datum":
        """A datum that scores `completion` after `prompt`, as tinker-cookbook's rl_loop builds one: the
        prompt's positions get target 0, weight and advantage 0 (so they are not scored, and the trainer can
        share the prompt's forward pass within a group). `advantages`: one number, or one per completion token."""
        P, C = len(prompt), len(completion)
        pad = [0.0] * (P - 1)
        inputs = {"target_tokens": TensorData([0] * (P - 1) + list(completion), "int64"),
                  "weights": TensorData(pad + (list(weights) if weights is not None else [1.0] * C))}
        if logprobs is not None:
            inputs["logprobs"] = TensorData(pad + list(logprobs))
        if advantages is not None:
            adv = [float(advantages)] * C if isinstance(advantages, (int, float)) else list(advantages)
            inputs["advantages"] = TensorData(pad + adv)
        return cls(ModelInput.from_ints(list(prompt) + list(completion)[:-1]), inputs)


@dataclass
class SamplingParams:
    max_tokens: int | None = None  # None: 256
    seed: int | None = None        # a fixed seed makes the call's samples independent of what ran before it
    stop: str | list[str] | list[int] | None = None  # strings, or token ids that end a sample
    temperature: float = 1.0       # 0 decodes greedily
    top_k: int = -1                # -1: off
    top_p: float = 1.0


@dataclass
class AdamParams:                  # Tinker's defaults; grad_clip_norm 0 = no clipping
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0      # decoupled (AdamW)
    grad_clip_norm: float = 0.0


# --- outputs -------------------------------------------------------------------------------------------------

@dataclass
class SampledSequence:             # Tinker's fields (minirl's positional order)
    tokens: list[int]              # up to and including the stop token
    logprobs: list[float]          # log pi_T of each token, at the sampling temperature
    stop_reason: str               # "stop" (an EOS or a stop sequence) or "length" (max_tokens)
    sequence_id: str = ""
    entropy: list[float] = field(default_factory=list)  # of pi_T at each position (a metric, as train.py's)


@dataclass
class SampleResponse:
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None = None
    policy_version: int = 0        # optimizer steps applied to the weights that sampled (a minirl extension)
    type: str = "sample"


@dataclass
class ForwardBackwardOutput:
    loss_fn_output_type: str
    loss_fn_outputs: list[dict[str, TensorData]]  # per datum: {"logprobs": p_theta of each target token}
    metrics: dict[str, float] = field(default_factory=dict)  # "loss:sum", and minirl's ratio metrics

    @property
    def loss(self) -> float:       # a minirl shorthand for metrics["loss:sum"]
        return self.metrics["loss:sum"]


@dataclass
class OptimStepResponse:
    metrics: dict[str, float] | None = None

    def __getitem__(self, key: str) -> float:  # optim_step(...).result()["grad_norm"], as a dict
        return self.metrics[key]


@dataclass
class SaveWeightsResponse:
    path: str
    type: str = "save_weights"


@dataclass
class SaveWeightsForSamplerResponse:
    path: str
    type: str = "save_weights_for_sampler"


@dataclass
class LoadWeightsResponse:
    path: str | None = None
    type: str = "load_weights"


@dataclass
class ModelData:
    arch: str | None = None
    model_name: str | None = None
    tokenizer_id: str | None = None


@dataclass
class GetInfoResponse:
    model_data: ModelData
    model_id: str
    is_lora: bool | None = None
    lora_rank: int | None = None
    model_name: str | None = None
    type: str = "get_info"


# --- reading the SDK's objects as well as ours ----------------------------------------------------------------

def tokens_of(x) -> list[int]:
    """A ModelInput (ours or the SDK's) or a plain token list, as ints."""
    if hasattr(x, "to_ints"):
        return list(x.to_ints())
    if hasattr(x, "chunks"):
        return [t for c in x.chunks for t in c.tokens]
    return [int(t) for t in x]


def tensor_of(x) -> torch.Tensor:
    """A TensorData (ours or the SDK's), a tensor, an array or a list, as a flat tensor; a list of floats as
    float32 by name (a from_pretrained on another thread sets the default dtype process-wide while it loads)."""
    if hasattr(x, "to_torch"):
        x = x.to_torch()
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
        x = x.astype(np.float32) if x.dtype.kind == "f" else x
    return torch.as_tensor(x).reshape(-1)


def sampling_params_of(p) -> SamplingParams:
    """Ours, the SDK's (pydantic) or None, as ours."""
    if p is None:
        return SamplingParams()
    if isinstance(p, SamplingParams):
        return p
    stop = getattr(p, "stop", None)
    return SamplingParams(p.max_tokens, p.seed, list(stop) if isinstance(stop, (list, tuple)) else stop,
                          float(p.temperature), int(p.top_k), float(p.top_p))


def adam_params_of(p) -> AdamParams:
    if p is None:
        return AdamParams()
    if type(p).__name__ != "AdamParams":
        raise TypeError(f"optim_step takes AdamParams (minirl's or tinker's), not {type(p).__name__}")
    return AdamParams(p.learning_rate, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_clip_norm)
