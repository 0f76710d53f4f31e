"""Training sessions with Tinker's programming model: a live model behind sample / forward_backward /
optim_step / save_state, returning futures, so that users write their own loops. client.py holds the
training and service clients, sampling.py the sampling client, types.py the data types (Tinker's), worker.py
the futures and the worker thread, batches.py the datum layout and the loss pass, server.py Tinker's HTTP
protocol, serve.py an OpenAI-compatible server."""
from minirl.sessions.client import SamplingClient, ServiceClient, TrainingClient
from minirl.sessions.types import (AdamParams, Datum, EncodedTextChunk, ForwardBackwardOutput, Future, ModelInput,
                                   OptimStepResponse, SampledSequence, SampleResponse, SamplingParams, SessionError,
                                   TensorData)

__all__ = ["SamplingClient", "ServiceClient", "TrainingClient", "AdamParams", "Datum", "EncodedTextChunk",
           "ForwardBackwardOutput", "Future", "ModelInput", "OptimStepResponse", "SampledSequence",
           "SampleResponse", "SamplingParams", "SessionError", "TensorData"]
