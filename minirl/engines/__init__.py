"""The rollout engines: every way minirl generates rollouts. `rollout.sample` chooses between the first two.

- decode.py: minirl's own decode loop (each prompt prefilled once, finished rows out of the batch), for most
  models (checked on each model before use: decode.check_model); decode_cache.py: its KV cache and the
  attention over a prompt kept once for its group;
- hf_generate.py: Hugging Face `generate`, the readable reference path, for the models the loop cannot take;
- vllm_engine.py: a client of a vLLM server process (vllm_server.py) that runs in vLLM's own environment
  (`rollout_engine: vllm`). Nothing here imports vLLM.

The first two sample with minirl/sampler.py and import nothing of rollout.py, so the core reads without them.
"""
