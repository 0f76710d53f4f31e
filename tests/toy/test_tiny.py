import json

from tokenizers import Tokenizer

from conftest import shared_file


def test_auto_tokenizer_tokenises_exactly_like_the_trained_tokenizer(tiny_path, tiny_tokenizer):
    """AutoTokenizer picks Qwen2Tokenizer for model_type=qwen2 and rebuilds its pre-tokenizer; the toy
    tokenizer is trained with that same pipeline, so ids must be identical on arbitrary text."""
    raw = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    texts = ["What is 47+38?", "#### 85", "  spaces\tand\nnew lines 12,345.67 don't"]
    texts += [json.loads(line)["question"] for line in list(shared_file("gsm8k/test_200.jsonl").open())[:20]]
    for t in texts:
        assert tiny_tokenizer(t, add_special_tokens=False).input_ids == raw.encode(t, add_special_tokens=False).ids
        assert tiny_tokenizer.decode(raw.encode(t).ids) == t
    assert tiny_tokenizer.padding_side == "left" and tiny_tokenizer.pad_token_id != tiny_tokenizer.eos_token_id


def test_tiny_model_loads_with_plain_from_pretrained(tiny_path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    assert model.config.model_type == "qwen2" and sum(p.numel() for p in model.parameters()) < 2_000_000
