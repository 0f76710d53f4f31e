"""The trainer's side of the optional vLLM rollout engine (`rollout_engine: vllm`): a client of
minirl/engines/vllm_server.py, which runs in vLLM's own environment and process (`make vllm` builds it).

    engine = VLLMEngine("path/to/model")          # starts the server (tens of seconds), or VLLMEngine(url=...)
    rollout = engine.sample(policy, tokenizer, prompts, group_size=8, max_new_tokens=256, temperature=1.0)
    engine.close()

`sample` has rollout.sample's arguments and returns the same Rollout. Per call it:
1. pushes the policy's weights when any of them changed since the last push (after each optimizer step): the
   full weights, LoRA merged in, go to a safetensors file that the server reloads in place (vLLM's
   `reload_weights`, then `reset_prefix_cache`, whose entries hold the old weights' keys and values);
2. sends the prompts as token ids with one seed per prompt. vLLM samples child i of a request with seed s+i,
   so prompt j of a call gets s = base + j*G and base moves on by B*G: no two rows of a run share a seed;
3. builds the Rollout from the returned token ids (rollout.make_rollout: EOS and stop strings end rows as in
   rollout.sample).
The trainer recomputes every log-prob it uses from the Rollout's tokens (train.prepare_batch), as with HF, so
the PPO ratio stays exact: vLLM only picks the tokens. Its sampling distribution is the policy's own up to
float rounding (fp32 on both sides). What it leaves out: FSDP (one process holds full weights), and more than
one client per server.

Shapes: B prompts, G rows per prompt, N = B*G rows, R' response tokens (right-padded).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import urllib.request
from pathlib import Path

import torch

from minirl.rollout import Rollout, encode_prompts, eos_token_ids, make_rollout, row_budgets

SERVER = Path(__file__).with_name("vllm_server.py")
SEED_STRIDE = 1 << 40      # each process's seeds start this far apart (a rank never reaches the next one's)


class VLLMEngine:
    """A vLLM server for rollouts: started (and stopped by close) here unless `url` names a running one."""

    def __init__(self, model_path: str = "", python: str = ".venv-vllm/bin/python", url: str = "",
                 max_model_len: int = 2048, seed: int = 0, rank: int = 0, threads: int = 0,
                 start_timeout_s: float = 900.0):
        self.process = None
        self.next_seed = seed * 1000 * SEED_STRIDE + rank * SEED_STRIDE
        self._pushed_version = None
        self.weights_dir = tempfile.mkdtemp(prefix="minirl-vllm-weights-")
        self.url = url.rstrip("/") or self._start(python, model_path, max_model_len, seed, threads,
                                                  start_timeout_s)
        self.push_seconds: list[float] = []   # the cost of each weight push (docs/rollout.md)

    def _start(self, python: str, model_path: str, max_model_len: int, seed: int, threads: int,
               timeout_s: float) -> str:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads or os.cpu_count() or 1))  # vLLM drops to 1 thread else
        env.pop("PYTHONPATH", None)           # the server imports vLLM's environment only
        self.process = subprocess.Popen([python, str(SERVER), "--model", str(model_path), "--port", "0",
                                         "--max-model-len", str(max_model_len), "--seed", str(seed)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines: list[str] = []
        timer = threading.Timer(timeout_s, self.process.kill)
        timer.start()
        try:
            for line in self.process.stdout:
                if line.startswith("minirl-vllm listening on "):
                    port = int(line.split()[-1])
                    break
                lines.append(line)
            else:
                raise RuntimeError("the vLLM server exited before listening; its last output:\n"
                                   + "".join(lines[-30:]))
        finally:
            timer.cancel()
        # keep draining its output (vLLM logs), or the pipe fills and the server blocks
        threading.Thread(target=lambda: [None for _ in self.process.stdout], daemon=True).start()
        return f"http://127.0.0.1:{port}"

    def _post(self, route: str, body: dict) -> dict:
        request = urllib.request.Request(self.url + route, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=3600) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"vLLM server {route}: {json.loads(e.read()).get('error')}") from None

    def push_weights(self, model) -> float:
        """Send the model's current weights to the engine; returns the seconds the push took there."""
        from safetensors.torch import save_file
        save_file(merged_state_dict(model), os.path.join(self.weights_dir, "model.safetensors"))
        seconds = self._post("/load_weights", {"path": self.weights_dir})["seconds"]
        self._pushed_version = weights_version(model)
        self.push_seconds.append(seconds)
        return seconds

    @torch.no_grad()
    def sample(self, model, tokenizer, prompts: list[str] | list[list[int]], group_size: int, max_new_tokens: int,
               temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, greedy: bool = False,
               stop: list[str] | None = None) -> Rollout:
        """rollout.sample's contract, with vLLM picking the tokens (module docstring)."""
        if weights_version(model) != self._pushed_version:
            self.push_weights(model)
        enc = encode_prompts(tokenizer, prompts, "cpu")
        B, G = len(enc.input_ids), group_size
        eos_ids = eos_token_ids(tokenizer, model)
        seeds = [self.next_seed + j * G for j in range(B)]
        self.next_seed += B * G
        reply = self._post("/generate", {
            "prompts": [ids[mask.bool()].tolist() for ids, mask in zip(enc.input_ids, enc.attention_mask)],
            "n": G, "max_tokens": row_budgets(model, enc.attention_mask, max_new_tokens).tolist(),  # its own room
            "temperature": 0.0 if greedy else temperature, "top_p": 1.0 if greedy else top_p,
            "top_k": 0 if greedy else top_k, "seeds": seeds, "stop": list(stop or []), "stop_token_ids": eos_ids})
        rows = [row for children in reply["completions"] for row in children]
        width = max(1, max(len(r) for r in rows))
        response_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])      # (N, R')
        device = next(model.parameters()).device
        rollout = make_rollout(tokenizer, enc.input_ids.repeat_interleave(G, 0),
                               enc.attention_mask.repeat_interleave(G, 0), response_ids, eos_ids, G, stop)
        return Rollout(*(t.to(device) for t in (rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids,
                                               rollout.response_mask, rollout.truncated)), rollout.texts, G)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.weights_dir, ignore_errors=True)


def weights_version(model) -> int:
    """Changes whenever any parameter is written in place (an optimizer step): the sum of autograd's
    per-tensor version counters."""
    return sum(p._version for p in model.parameters())


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's weights under its own checkpoint names, a LoRA adapter merged into them (W + scale * B A),
    fp32 on CPU: what vLLM's loader reads from a checkpoint."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model    # peft: the model it wraps
    state = {name.replace(".base_layer.", "."): t for name, t in inner.state_dict().items() if "lora_" not in name}
    for name, module in inner.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
            state[f"{name}.weight"] = module.base_layer.weight + delta
    return {name: t.detach().float().cpu().contiguous().clone() for name, t in state.items()}


_ENGINES: dict[tuple, VLLMEngine] = {}


def engine_for(cfg) -> VLLMEngine:
    """This process's engine for the run, started on first use and closed at exit (train.py asks for it at
    every rollout): its .sample has rollout.sample's signature."""
    import atexit

    from transformers import AutoConfig

    from minirl.distributed import rank as process_rank
    from minirl.models import resolve_model_path
    rank = process_rank()
    key = (cfg.model_name_or_path, cfg.vllm_python, cfg.vllm_url, cfg.seed, rank)
    if key not in _ENGINES:
        path = resolve_model_path(cfg.model_name_or_path)
        context = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None) or 1 << 20
        engine = VLLMEngine(path, cfg.vllm_python, cfg.vllm_url, seed=cfg.seed, rank=rank,
                            max_model_len=min(context, cfg.max_prompt_length + cfg.max_new_tokens))
        atexit.register(engine.close)
        _ENGINES[key] = engine
    return _ENGINES[key]
