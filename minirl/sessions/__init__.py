"""Training sessions: a live model behind sample / forward_backward / optim_step / save_state, returning
futures (the Tinker programming model), so that users write their own loops. client.py holds the clients,
types.py the data types, futures and the worker thread, serve.py an OpenAI-compatible server."""
from minirl.sessions.client import SamplingClient, ServiceClient, TrainingClient
from minirl.sessions.types import (LOSS_FNS, AdamParams, Datum, ForwardBackwardOutput, Future, SampledSequence,
                                   SampleResponse, SamplingParams, SessionError, collate)

__all__ = ["SamplingClient", "ServiceClient", "TrainingClient", "LOSS_FNS", "AdamParams", "Datum",
           "ForwardBackwardOutput", "Future", "SampledSequence", "SampleResponse", "SamplingParams", "SessionError",
           "collate"]
