"""The vLLM engine's request, checked without vLLM (tests/engines/test_vllm.py needs its environment)."""
def test_each_prompt_gets_its_own_budget_whatever_else_is_in_the_request(tiny_path, tiny_tokenizer, monkeypatch):
    """Issue 32's per-row budget on the vLLM engine, without vLLM: the client sends each prompt's own room in
    the context (rollout.row_budgets), and the server gives each prompt's SamplingParams its own max_tokens.
    A stub stands in for the vllm package, so this runs wherever the rest of this file is skipped."""
    import sys
    import types

    from minirl.engines import vllm_server
    from minirl.engines.vllm_engine import VLLMEngine
    from minirl.models import load_model
    from minirl.rollout import encode_prompts
    model = load_model(str(tiny_path))
    context = model.config.max_position_embeddings
    short, long = "What is 1+1?", "1+" * ((context - 40) // 2) + "1?"
    posted = {}
    eng = VLLMEngine.__new__(VLLMEngine)                       # no server: _post answers in this process
    eng.next_seed, eng._pushed_version = 0, None
    eng.push_weights = lambda m: None
    eng._post = lambda route, body: posted.update(body) or {"completions": [[[5], [5]] for _ in body["prompts"]]}
    eng.sample(model, tiny_tokenizer, [short, long], group_size=2, max_new_tokens=100)
    lengths = encode_prompts(tiny_tokenizer, [short, long], "cpu").attention_mask.sum(1).tolist()
    assert lengths[1] > context - 100 and posted["max_tokens"] == [100, context - lengths[1]]

    made = []
    stub = types.SimpleNamespace(SamplingParams=lambda **kw: made.append(kw) or kw,
                                 TokensPrompt=lambda prompt_token_ids: prompt_token_ids)
    monkeypatch.setitem(sys.modules, "vllm", stub)
    out = types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[7])] * 2)
    llm = types.SimpleNamespace(generate=lambda prompts, sampling, use_tqdm: [out] * len(prompts))
    vllm_server.generate(llm, {**posted, "temperature": 0.7})
    assert [kw["max_tokens"] for kw in made] == posted["max_tokens"]
