"""FSDP at the scale of a 7B model, on 2 CPU processes (torchrun, gloo): the policy loaded once and sharded as it
is read (never a full copy per process), sharded checkpoints that resume bit for bit, and a resume that cannot
split (each process sees a different output folder: the run stops and says which folder, never starts afresh).

Each test launches torchrun (~30-60 s on 2 shared cores); the checks of one launch are made together.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
MB = 2**20


def torchrun(*args, timeout=300) -> subprocess.CompletedProcess:
    """Run a script on 2 processes; its stderr has the error lines first (torchrun's summary hides them)."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    errors = [line for line in proc.stderr.splitlines() if "Error" in line or "SystemExit" in line]
    proc.stderr = "\n".join(errors[:20]) + "\n...\n" + proc.stderr
    return proc


@pytest.fixture(scope="module")
def model_125m(tmp_path_factory):
    """A random 125M-parameter Qwen2 saved in fp32 (500 MB): large enough that its copies show in the RSS."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=False)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model_125m")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def test_one_process_loads_on_meta_what_from_pretrained_loads(tiny_path, monkeypatch):
    """World size 1, in this process: read in small chunks, in one, or through from_pretrained when the files'
    names are not the model's (file_chunks' fallback), the weights, the tied LM head and the rotary buffers are
    those of a plain load."""
    from minirl.distributed import shard_and_load
    from minirl.models import empty_model, load_model, weights
    plain = load_model(str(tiny_path)).state_dict()
    sizes = {}
    real_chunks = weights.file_chunks

    def spy(*args):
        sizes["chunks"] = len(real_chunks(*args))
        return real_chunks(*args)

    monkeypatch.setattr(weights, "file_chunks", spy)
    for chunk_bytes in (1 << 16, 1 << 30):
        model = empty_model(str(tiny_path))
        shard_and_load(model, str(tiny_path), torch.device("cpu"), chunk_bytes=chunk_bytes)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        state = model.state_dict()
        assert state.keys() == plain.keys() and all(torch.equal(state[k], plain[k]) for k in plain)
        assert all(torch.equal(b, dict(load_model(str(tiny_path)).named_buffers())[n])
                   for n, b in model.named_buffers())
        assert sizes["chunks"] > 10 if chunk_bytes == 1 << 16 else sizes["chunks"] == 1
    assert real_chunks(tiny_path, [["model.embed_tokens.weight"]], 1 << 30) == [None]  # names differ
    monkeypatch.setattr(weights, "file_chunks", lambda *args: [None])
    model = empty_model(str(tiny_path))
    shard_and_load(model, str(tiny_path), torch.device("cpu"))
    assert all(torch.equal(model.state_dict()[k], plain[k]) for k in plain)


def test_one_process_loads_the_critic_on_meta_as_load_critic_does(tiny_path, monkeypatch):
    """PPO's critic under fsdp, world size 1: the files' `model.*` read in chunks into its body (their LM head
    not read, nothing through from_pretrained), its value head zeroed: the weights of a plain load_critic."""
    import functools

    from minirl.critic import load_critic
    from minirl.distributed import shard_and_load
    from minirl.models import weights
    cpu, real_chunks, seen = torch.device("cpu"), weights.file_chunks, []
    monkeypatch.setattr(weights, "file_chunks", lambda *args: seen.append(real_chunks(*args)) or seen[-1])
    plain = load_critic(str(tiny_path), torch.float32, "sdpa", False, cpu).state_dict()
    place = functools.partial(shard_and_load, device=cpu, chunk_bytes=1 << 16)
    state = load_critic(str(tiny_path), torch.float32, "sdpa", True, cpu, place=place).state_dict()
    assert len(seen[0]) > 10 and None not in seen[0]  # read in chunks, not the from_pretrained fallback
    assert state.keys() == plain.keys() and all(torch.equal(state[k], plain[k]) for k in plain)
    assert not state["value_head.weight"].any() and not state["value_head.bias"].any()


def test_sharded_load_equals_a_plain_load_without_a_full_copy_per_process(tmp_path, model_125m):
    """Process 0 reads the files 64 MB at a time (one tensor larger than that alone: the 98 MB embeddings) and
    broadcasts; each process keeps its half. Neither holds a full copy (500 MB) plus its shard (250 MB)."""
    proc = torchrun(ROOT / "tests" / "core" / "torchrun_load.py", model_125m, tmp_path, 64 * MB)
    assert proc.returncode == 0, proc.stderr[:3000]
    first, second = (json.loads((tmp_path / f"load{r}.json").read_text()) for r in (0, 1))
    assert first["same_keys"] and first["same_weights"] and first["same_logits"]
    full = first["full_bytes"]
    assert full > 100e6 * 4  # >= 100M fp32 parameters
    for info in (first, second):
        assert info["shard_bytes"] == pytest.approx(full / 2, rel=0.01)
        print(f"sharded load: +{info['sharded_load_bytes'] / MB:.0f} MB, with check_exact "
              f"+{info['with_check_bytes'] / MB:.0f} MB (full copy {full / MB:.0f} MB, shard "
              f"{info['shard_bytes'] / MB:.0f} MB)")
        assert info["sharded_load_bytes"] < 0.7 * (full + info["shard_bytes"])  # measured: ~0.4


FSDP_RUN = ["--fsdp", "true", "--max_steps", "4", "--save_every", "2", "--keep_last", "2", "--group_size", "4",
            "--prompts_per_step", "4", "--kl_coef", "0.05", "--val_files", "", "--temperature", "0.7"]


def training_rows(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    return [{k: v for k, v in r.items() if not k.startswith("timing_s/")} for r in rows]


def test_sharded_checkpoint_resumes_bit_for_bit_and_a_resume_never_splits(tmp_path, tiny_path):
    """A 4-step FSDP run; its step-2 checkpoint copied into a fresh folder and resumed there twice: once with
    process 1 looking in a folder of its own (as with node-local disks: the run stops, naming the folder), then
    with both seeing it (steps 3-4 and the final weights equal the straight run's, bit for bit; the process
    group's timeout is the configured dist_timeout_s)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    proc = torchrun(ROOT / "train.py", "--output_dir", straight, *FSDP_RUN)
    assert proc.returncode == 0, proc.stderr[:3000]
    ckpt = straight / "checkpoints" / "step_000002"
    assert {p.name for p in (ckpt / "sharded").iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert not (ckpt / "model").exists() and not (ckpt / "optimizer.pt").exists()  # nothing gathered
    shutil.copytree(ckpt, resumed / "checkpoints" / ckpt.name)
    shutil.copy(straight / "metrics.jsonl", resumed / "metrics.jsonl")

    split = torchrun(ROOT / "tests" / "core" / "torchrun_train.py", resumed, "own_output_dir", *FSDP_RUN,
                     "--resume", "auto")
    own = resumed / "rank1_own_output_dir" / "checkpoints" / ckpt.name
    assert split.returncode != 0
    assert f"process 1 on {os.uname().nodename} cannot read the checkpoint {own}" in split.stderr, split.stderr[-3000:]
    assert "the folder does not exist here" in split.stderr and "rsync -a" in split.stderr
    assert not (resumed / "model.safetensors").exists()  # neither process trained on

    proc = torchrun(ROOT / "tests" / "core" / "torchrun_train.py", resumed, "none", *FSDP_RUN, "--resume", "auto",
                    "--dist_timeout_s", "1234")
    assert proc.returncode == 0, proc.stderr[:3000]
    assert "resumed from" in proc.stdout + proc.stderr
    assert json.loads((resumed / "rank1.json").read_text())["timeout_s"] == 1234  # the collectives' timeout
    assert training_rows(resumed) == training_rows(straight)
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    from transformers import AutoModelForCausalLM
    ids = torch.tensor([[5, 17, 42, 8]])
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(resumed)(ids).logits,
                           AutoModelForCausalLM.from_pretrained(straight)(ids).logits)


def test_a_sharded_save_into_node_local_folders_stops_the_run(tmp_path, tiny_path):
    """Process 1 writes its shard into a folder of its own: process 0 finds it missing before renaming the
    checkpoint into place, and the run stops instead of leaving a checkpoint that cannot be resumed."""
    proc = torchrun(ROOT / "tests" / "core" / "torchrun_train.py", tmp_path, "own_output_dir", *FSDP_RUN,
                    "--max_steps", "1", "--save_every", "1")
    assert proc.returncode != 0
    assert "process 0 does not see the files ['__1_0.distcp']" in proc.stderr, proc.stderr[:3000]
    assert not (tmp_path / "checkpoints" / "step_000001").exists()  # nothing that looks complete


def test_one_process_with_fsdp_takes_the_same_path_and_resumes_exactly(tmp_path, tiny_path):
    """World size 1 with fsdp: the policy built on the meta device and filled from the files, one-shard
    checkpoints, and a resume from step 1 that ends on the same weights as the run that never stopped."""
    import train
    args = ["--fsdp", "true", "--max_steps", "2", "--save_every", "1", "--group_size", "4", "--prompts_per_step",
            "4", "--kl_coef", "0.05", "--val_files", ""]
    train.main(args + ["--output_dir", str(tmp_path / "straight")])
    ckpt = tmp_path / "straight" / "checkpoints" / "step_000001"
    assert {p.name for p in (ckpt / "sharded").iterdir()} == {".metadata", "__0_0.distcp"}
    shutil.copytree(ckpt, tmp_path / "resumed" / "checkpoints" / ckpt.name)
    shutil.copy(tmp_path / "straight" / "metrics.jsonl", tmp_path / "resumed" / "metrics.jsonl")
    train.main(args + ["--output_dir", str(tmp_path / "resumed"), "--resume", "auto"])
    assert training_rows(tmp_path / "resumed") == training_rows(tmp_path / "straight")
    a, b = (load_file(str(tmp_path / run / "model.safetensors")) for run in ("straight", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


UNSHARDED_INTO_SHARDED = """
import copy, os, sys, torch, torch.distributed as dist, transformers as T
from minirl.distributed import full_state_dict, load_full_state, shard
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
cfg = T.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, tie_word_embeddings=sys.argv[2] == "tied")
torch.manual_seed(0)
x, plain = torch.randint(0, 64, (2, 8)), T.LlamaForCausalLM(cfg)
opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
for i in range(2):
    if i == 1:  # what a plain (fsdp: false) checkpoint holds after step 1
        saved = ({k: v.clone() for k, v in plain.state_dict().items()}, copy.deepcopy(opt.state_dict()))
    plain(x, labels=x).loss.backward(); opt.step(); opt.zero_grad()
model = T.LlamaForCausalLM(cfg); shard(model)
opt2 = torch.optim.AdamW(model.parameters(), lr=1e-2)
load_full_state(model, opt2, *saved)
model(x, labels=x).loss.backward(); opt2.step()
got = full_state_dict(model)
assert all(torch.equal(v, got[k]) for k, v in plain.state_dict().items()), "weights differ after the resumed step"
print("same")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("tied", ["tied", "untied"])
def test_a_plain_checkpoint_resumed_under_fsdp_takes_its_numbered_optimizer_state(tied):
    """optimizer.pt of a run without fsdp numbers its parameters; resumed into a sharded model (a group of one
    process here) it gives the next step of the run that never stopped, bit for bit (set_optimizer_state_dict
    raised KeyError 'state.0.step' on the numbered form)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-c", UNSHARDED_INTO_SHARDED, str(port), tied], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("same"), proc.stderr[-3000:]
