"""Rollout engines other than minirl's own (rollout.sample): vllm_engine.py, a client of a vLLM server
process (vllm_server.py) that runs in vLLM's own environment. Nothing here imports vLLM."""
