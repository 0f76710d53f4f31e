"""The Tinker SDK's wire formats, for minirl/sessions/server.py: JSON for most calls, protobuf for the
forward_backward request and the forward_backward and sample results (the SDK reads those as protobuf only).

The protobuf schema is the SDK's own (`tinker.proto.tinker_public_pb2`, as SkyRL's skyrl-tx server uses it),
so serving needs `pip install tinker` on the server too. Tokens travel as int32 bytes, floats as float32 bytes;
a batch of per-datum arrays is one buffer plus int64 byte offsets (a `BatchedTensor`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from minirl.sessions.types import (AdamParams, Datum, EncodedTextChunk, ForwardBackwardOutput, ModelInput,
                                   SampleResponse, SamplingParams, TensorData)

PROTO = "application/x-protobuf"


def _pb():
    try:
        from tinker.proto import tinker_public_pb2
    except ImportError as e:
        raise ImportError("the Tinker HTTP protocol uses the SDK's protobuf schema: pip install tinker") from e
    return tinker_public_pb2


# --- requests ------------------------------------------------------------------------------------------------

def forward_backward_request(body: bytes, encoding: str = "") -> dict:
    """A protobuf ForwardBackwardRequest (zstd-compressed when `encoding` says so) as plain values."""
    if encoding == "zstd":
        import zstandard
        body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    pb = _pb()
    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(body)
    data = []
    for d in msg.data:
        chunks = []
        for chunk in d.model_input:
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise ValueError("only text model inputs are supported (no images or audio)")
            chunks.append(EncodedTextChunk(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()))
        inputs = {name: _tensor(t, pb) for name, t in d.loss_fn_inputs.items()}
        data.append(Datum(ModelInput(chunks), inputs))
    config = {k: (v.text if v.WhichOneof("value") == "text" else v.number) for k, v in msg.loss_fn_config_v2.items()}
    config = config or dict(msg.loss_fn_config)
    return {"model_id": msg.model_id, "data": data, "loss_fn": msg.loss_fn, "loss_fn_config": config,
            "forward_only": msg.forward_only}


def _tensor(t, pb) -> TensorData:
    if t.HasField("sparse_csr"):
        raise ValueError("sparse (2-D) loss_fn_inputs are not supported")
    int64 = t.dtype == pb.DTYPE_INT64
    values = np.frombuffer(t.dense, dtype=np.int64 if int64 else np.float32).tolist()
    return TensorData(values, "int64" if int64 else "float32", list(t.shape) or None)


def sampling_params(d: dict) -> SamplingParams:
    return SamplingParams(d.get("max_tokens"), d.get("seed"), d.get("stop"), float(d.get("temperature", 1.0)),
                          int(d.get("top_k", -1)), float(d.get("top_p", 1.0)))


def model_input(d: dict) -> ModelInput:
    chunks = []
    for c in d["chunks"]:
        if c.get("type", "encoded_text") != "encoded_text":
            raise ValueError("only text model inputs are supported (no images or audio)")
        chunks.append(EncodedTextChunk(list(c["tokens"])))
    return ModelInput(chunks)


def adam_params(d: dict) -> AdamParams:
    if d.get("type", "adam") not in ("adam", None):
        raise ValueError(f"only the Adam optimizer is supported, not {d.get('type')!r}")
    fields = {f.name for f in dataclasses.fields(AdamParams)}
    return AdamParams(**{k: v for k, v in d.items() if k in fields})


# --- results -------------------------------------------------------------------------------------------------

def forward_backward_output(out: ForwardBackwardOutput) -> bytes:
    pb = _pb()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type=out.loss_fn_output_type)
    for k, v in out.metrics.items():
        msg.metrics[k] = float(v)
    record = msg.loss_fn_outputs.add(num_datums=len(out.loss_fn_outputs))
    if out.loss_fn_outputs:
        arrays = [np.asarray(o["logprobs"].data, dtype=np.float32) for o in out.loss_fn_outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        record.fields["logprobs"].CopyFrom(pb.BatchedTensor(data=np.concatenate(arrays).tobytes(),
                                                             offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32))
    return msg.SerializeToString()


def sample_response(res: SampleResponse) -> bytes:
    pb = _pb()
    msg = pb.SampleResponse()
    for s in res.sequences:
        msg.sequences.add(stop_reason=pb.STOP_REASON_STOP if s.stop_reason == "stop" else pb.STOP_REASON_LENGTH,
                          tokens=np.asarray(s.tokens, dtype=np.int32).tobytes(),
                          logprobs=np.asarray(s.logprobs, dtype=np.float32).tobytes())
    if res.prompt_logprobs is not None:  # undefined entries (the first token) travel as NaN
        values = [float("nan") if v is None else v for v in res.prompt_logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    return msg.SerializeToString()


def to_json(obj):
    """A result dataclass (ours) as the JSON the SDK's pydantic models read."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
