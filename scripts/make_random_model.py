"""Write a randomly initialised Qwen2-shaped model (with the toy tokenizer) for speed checks without downloads.

    python scripts/make_random_model.py --out runs/random-0.5b --size 0.5b

Its outputs are noise, but its shapes (hidden size, layers, heads, 152k vocabulary) are those of the real
model, so generation and training throughput are representative.
"""
import argparse

SIZES = {  # Qwen2.5 shapes
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    args = ap.parse_args()
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from minirl.toy.tiny import tiny_model_path
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    config = Qwen2Config(vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=4096,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **SIZES[args.size])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main()
