"""Rollout engines other than minirl's own (rollout.sample): vllm.py, a client of a vLLM server process
(vllm_server.py) that runs in vLLM's own environment. Nothing here imports vLLM."""
from __future__ import annotations


def vllm_engine(cfg):
    """This process's vLLM engine for the run (started on first use, closed at exit): its .sample has
    rollout.sample's signature."""
    from minirl.distributed import rank
    from minirl.engines.vllm_engine import engine_for
    return engine_for(cfg, rank())
