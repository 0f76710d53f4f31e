"""The LoRA adapter's init: build_policy leaves the caller's global random stream where it was, and
init_adapter's draws replay peft's own init after torch.manual_seed(seed)."""
import torch

from minirl.models import add_lora, build_policy, init_adapter, load_model

LORA = {"rank": 4, "alpha": 8}


def test_a_lora_build_leaves_the_callers_random_stream_alone(tiny_path):
    torch.manual_seed(123)
    build_policy(str(tiny_path), torch.device("cpu"), torch.float32, lora=LORA, seed=7)
    after_build = torch.rand(5)
    torch.manual_seed(123)
    assert torch.equal(after_build, torch.rand(5))


def test_init_adapter_replays_peft_after_manual_seed(tiny_path):
    seed = 11
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_own = add_lora(load_model(str(tiny_path)), LORA["rank"], LORA["alpha"])  # peft's init, global RNG
    ours = add_lora(load_model(str(tiny_path)), LORA["rank"], LORA["alpha"])
    init_adapter(ours, seed)
    theirs = {k: v for k, v in peft_own.state_dict().items() if "lora_" in k}
    mine = {k: v for k, v in ours.state_dict().items() if "lora_" in k}
    assert theirs and theirs.keys() == mine.keys()
    assert [k for k in theirs if not torch.equal(theirs[k], mine[k])] == []
    assert any(bool((v != 0).any()) for k, v in mine.items() if "lora_A" in k)
