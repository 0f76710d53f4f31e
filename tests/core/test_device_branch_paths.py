"""The GPU's side of small device branches, forced on CPU (the inventory: tests/core/test_device_branches.py).

Each test selects what a CUDA machine would run: `torch.cuda` functions replaced by recorders, a `cuda` device
object (which a CPU build can name but not allocate on), or the dtype the GPU branch picks (bf16 weights)."""
import threading

import pytest
import torch

import eval as eval_script
import train
from conftest import ROOT
from minirl.engines import hf_generate


@pytest.mark.device_branch("train/peak-memory")
def test_peak_memory_is_logged_on_cuda_and_not_on_cpu(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: seen.append(d) or 3 * 2**30)
    assert train.peak_memory(torch.device("cuda", 1)) == {"perf/max_memory_allocated_gb": 3.0}
    assert seen == [torch.device("cuda", 1)]                    # the process's own GPU, not cuda:0
    assert train.peak_memory(torch.device("cpu")) == {}


@pytest.mark.device_branch("generate/cuda-generator")
def test_unseeded_generate_noise_replays_the_generator_of_its_own_gpu(monkeypatch):
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    monkeypatch.setattr(torch.cuda, "default_generators", gens, raising=False)
    assert hf_generate.global_generator(torch.device("cuda", 2)) is gens[2]
    assert hf_generate.global_generator(torch.device("cuda")) is gens[0]
    assert hf_generate.global_generator(torch.device("cpu")) is torch.default_generator


@pytest.mark.device_branch("sessions/worker-device")
def test_a_sessions_worker_thread_sets_its_gpu_before_running(monkeypatch):
    from minirl.sessions.worker import _Worker
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append((d, threading.current_thread().name)))
    worker = _Worker(torch.device("cuda", 1), torch.float32)
    assert worker.submit("probe", lambda: 7).result() == 7
    assert calls == [(torch.device("cuda", 1), "minirl-session")]  # in the worker's own thread


@pytest.mark.device_branch("sessions/process-state")
def test_a_sessions_client_joins_accelerates_gpu_state_when_cuda_is_there(monkeypatch):
    import accelerate
    from minirl.sessions import client
    asked = []

    class FakeState:
        def __init__(self, cpu: bool):
            asked.append(cpu)
            self.process_index, self.num_processes, self.device = 0, 1, torch.device("cpu")

    monkeypatch.setattr(accelerate, "PartialState", FakeState)
    for cuda in (True, False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        client.ServiceClient()
    assert asked == [False, True]                  # on a GPU machine accelerate picks the GPU and the backend


@pytest.mark.device_branch("eval/device")
def test_eval_with_the_gpus_bf16_weights_scores_the_toy_task(monkeypatch, tmp_path):
    """On a GPU eval.py loads the weights in bf16 (pick_dtype "auto"); the same load on CPU."""
    picked = []
    monkeypatch.setattr(eval_script, "pick_dtype", lambda name, device: picked.append(name) or torch.bfloat16)
    summary = eval_script.main(["--model", "tiny", "--data", str(ROOT / "data" / "arith_test.jsonl"), "--limit",
                                "24", "--max_new_tokens", "8", "--output", str(tmp_path / "toy")])
    assert picked == ["auto"]
    assert 0.0 < summary["toy_arithmetic"]["greedy_accuracy"] <= 1.0


@pytest.mark.device_branch("checkpoint/cuda-rng")
def test_a_checkpoint_saves_and_restores_every_gpus_random_stream(monkeypatch):
    from minirl import checkpoint
    streams, restored = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3], dtype=torch.uint8)], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: streams)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    state = checkpoint.rng_state()
    assert state["cuda"] is streams
    checkpoint.set_rng_state(state)
    assert restored == [streams]


@pytest.mark.device_branch("distributed/nccl-device")
def test_collectives_run_on_the_current_gpu_under_nccl(monkeypatch):
    from minirl import distributed
    monkeypatch.setattr(distributed.dist, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert distributed._device() == torch.device("cuda", 3)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda: "gloo")
    assert distributed._device() == torch.device("cpu")


@pytest.mark.device_branch("models/quantized")
def test_a_quantised_base_is_loaded_with_bitsandbytes_onto_the_current_gpu(monkeypatch, tiny_path):
    import importlib.util

    import transformers
    from minirl.models import _load_model, lora
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU and the bitsandbytes package"):
        lora.quantization_config(4)                               # this machine: a clear refusal
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "bitsandbytes"
                        else real_find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    configs = []
    monkeypatch.setattr(transformers, "BitsAndBytesConfig", lambda **kw: configs.append(kw) or kw)
    seen = {}
    real = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda path, **kw: seen.update(kw) or real(path, dtype=kw["dtype"]))
    _load_model(str(tiny_path), torch.bfloat16, "sdpa", False, 4)
    assert seen["device_map"] == {"": 2} and seen["quantization_config"]["load_in_4bit"]
    assert configs[0]["bnb_4bit_compute_dtype"] == torch.bfloat16
    _load_model(str(tiny_path), torch.bfloat16, "sdpa", False, 8)
    assert configs[1] == {"load_in_8bit": True}


@pytest.mark.device_branch("models/rng-devices")
def test_a_lora_init_forks_the_random_streams_of_the_gpus_holding_the_model():
    from types import SimpleNamespace

    from minirl.models import cuda_indices
    on = lambda *devices: SimpleNamespace(parameters=lambda: [SimpleNamespace(device=torch.device(*d))  # noqa
                                                              for d in devices])
    assert cuda_indices(on(("cuda", 1), ("cuda", 1), ("cuda", 0))) == [0, 1]
    assert cuda_indices(on(("cpu",))) == []
