"""Environments (minirl/agentic/env.py) and multi-turn episodes (minirl/agentic/episodes.py): the protocol, CodeEnv's tool and
rewards, and the token layout of a 2-turn episode checked token by token."""
import copy
import json

import pytest

from minirl.agentic.env import CodeEnv, MathEnv, parse_tool_calls
from minirl.agentic.episodes import episode_datum, episode_seed, prompt_tokens, render, reply_tokens, run_episodes
from minirl.judge import Judge
from minirl.sessions.batches import trainer_batch
from minirl.sessions.types import SampledSequence, SampleResponse, SamplingParams

AB_PY = "a, b = map(int, input().split())\nprint(a + b)\n"
# public test: 1 2 -> 3; private tests: also 5 7 -> 12. "print(3)" passes the public test and fails the private.
TRUTH = {"tests": [{"input": "1 2\n", "output": "3"}, {"input": "5 7\n", "output": "12"}],
         "public_tests": [{"input": "1 2\n", "output": "3"}], "language": "python", "time_limit_s": 2,
         "memory_limit_mb": 256}
ROW = {"data_source": "code/test", "ability": "code", "prompt": [{"role": "user", "content": "Print a+b."}],
       "reward_model": {"style": "rule", "ground_truth": json.dumps(TRUTH)}}

# A tools-aware ChatML template in the style of Qwen2.5's (tools in a system turn, calls as <tool_call> JSON,
# tool results as <tool_response> in a user turn). Test-only: the library never writes a format itself.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% elif m['role'] == 'assistant' and m.get('tool_calls') %}<|im_start|>assistant\n"
    "{% if m['content'] %}{{ m['content'] }}\n{% endif %}"
    "{% for c in m['tool_calls'] %}<tool_call>\n{{ {'name': c['function']['name'], "
    "'arguments': c['function']['arguments']} | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def judge():
    with Judge(workers=2) as j:
        yield j


def tool_call_text(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "check_solution", "arguments": {"code": code}}) + "\n</tool_call>"


def test_math_env_is_one_turn_scored_by_the_verifier():
    row = {"data_source": "toy_arithmetic", "prompt": [{"role": "user", "content": "What is 7+8?"}],
           "reward_model": {"ground_truth": "15"}}
    env = MathEnv()
    messages = env.reset(row)
    assert messages == row["prompt"] and env.tools is None
    assert env.step(messages, "#### 15") == (None, 1.0, {})
    assert env.step(messages, "#### 16")[:2] == (None, 0.0)


def test_code_env_tool_runs_public_tests_and_final_answer_is_scored_on_private_tests(judge, tiny_tokenizer):
    env = CodeEnv(judge, tiny_tokenizer, max_turns=2)
    messages = env.reset(ROW)
    assert messages == ROW["prompt"]
    new, reward, info = env.step(messages, "Let me test.\n" + tool_call_text("print(3)"))
    assert reward == 0.0 and info == {"turns": 1, "tool_verdict": "AC"}    # public test only: 1 2 -> 3 passes
    assert new[:1] == messages and [m["role"] for m in new[1:]] == ["assistant", "tool"]
    assert new[1]["content"] == "Let me test."
    assert new[1]["tool_calls"][0]["function"]["arguments"] == {"code": "print(3)"}
    assert new[2]["content"].startswith("AC: passed 1 of 1 example tests.")
    # the same program as the final answer fails the private tests; the right one passes; no code block: -0.1
    assert env.step(new, "```python\nprint(3)\n```")[:2] == (None, 0.0)
    assert env.step(new, f"```python\n{AB_PY}```") == (None, 1.0, {"turns": 2, "verdict": "AC"})
    assert env.step(messages, "no code here") == (None, -0.1, {"turns": 1, "verdict": "no code"})
    # a failing check names the test; in the last turn a tool call is a final answer (here without a code block)
    failing = env.step(messages, tool_call_text("print(4)"))[0][-1]["content"]
    assert failing.startswith("WA: passed 0 of 1") and "input of test 1:\n1 2\n" in failing
    assert env.step(new, tool_call_text(AB_PY))[:2] == (None, -0.1)
    # without public_tests the first test is the tool's
    env.reset({**ROW, "reward_model": {"ground_truth": json.dumps({**TRUTH, "public_tests": None})}})
    assert env.public == TRUTH["tests"][:1] and env.private == TRUTH["tests"]


def test_few_shot_assistant_messages_in_the_prompt_are_not_turns(judge, tiny_tokenizer):
    env = CodeEnv(judge, tiny_tokenizer, max_turns=2)
    shot = [{"role": "user", "content": "Print 1."}, {"role": "assistant", "content": "```python\nprint(1)\n```"}]
    messages = env.reset({**ROW, "prompt": shot + ROW["prompt"]})
    new, reward, info = env.step(messages, tool_call_text("print(3)"))  # turn 1 of 2: the tool still answers
    assert new is not None and info == {"turns": 1, "tool_verdict": "AC"}
    assert env.step(new, f"```python\n{AB_PY}```") == (None, 1.0, {"turns": 2, "verdict": "AC"})


def test_malformed_tool_calls_are_final_answers(tiny_tokenizer):
    assert parse_tool_calls(tiny_tokenizer, "<tool_call>{not json}</tool_call>") == []
    assert parse_tool_calls(tiny_tokenizer, '<tool_call>{"name": "f"}</tool_call>') == []
    assert parse_tool_calls(tiny_tokenizer, tool_call_text("x")) == [{"name": "check_solution",
                                                                     "arguments": {"code": "x"}}]
    # arguments given as a JSON string (some tokenizers' response schemas keep them so) are parsed too
    as_string = '<tool_call>{"name": "check_solution", "arguments": "{\\"code\\": \\"x\\"}"}</tool_call>'
    assert parse_tool_calls(tiny_tokenizer, as_string) == [{"name": "check_solution", "arguments": {"code": "x"}}]
    assert parse_tool_calls(tiny_tokenizer, '<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>') == []
    deep = "[" * 5000  # json.loads raises RecursionError, not JSONDecodeError, on this
    assert parse_tool_calls(tiny_tokenizer, f"<tool_call>{deep}</tool_call>") == []
    assert parse_tool_calls(tiny_tokenizer, f'<tool_call>{{"name": "f", "arguments": "{deep}"}}</tool_call>') == []


def test_tool_calls_from_a_response_schema_with_string_arguments(tiny_tokenizer):
    class SchemaTokenizer:
        response_schema = {"stub": True}

        def parse_response(self, text):
            return {"tool_calls": [{"type": "function", "function": {"name": "check_solution",
                                                                     "arguments": '{"code": "y"}'}}, "junk"]}
    assert parse_tool_calls(SchemaTokenizer(), "...") == [{"name": "check_solution", "arguments": {"code": "y"}}]


class ScriptedSampler:
    """Returns the given completions in order (log-prob -0.5 per token), recording the contexts it was given."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.contexts = tokenizer, list(texts), []

    def sample(self, prompt, n, params):
        self.contexts.append(list(prompt))
        tokens = self.tokenizer(self.texts.pop(0), add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]
        response = SampleResponse([SampledSequence(tokens, [-0.5] * len(tokens), "stop")], policy_version=3)
        return type("Done", (), {"result": lambda self: response})()


def test_two_turn_episode_masks_token_by_token(judge, tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = TOOLS_TEMPLATE
    env_factory = lambda: CodeEnv(judge, tok, max_turns=2)  # noqa: E731
    tools = CodeEnv.tools
    # turn 1 is a tool call written exactly as the template writes one; turn 2 the final program
    call = {"type": "function", "function": {"name": "check_solution", "arguments": {"code": "print(3)"}}}
    asked = render(tok, ROW["prompt"] + [{"role": "assistant", "content": "", "tool_calls": [call]}], tools, False)
    turn1 = asked[len(render(tok, ROW["prompt"], tools, True)):-len("<|im_end|>\n")]
    turn2 = f"```python\n{AB_PY}```"
    sampler = ScriptedSampler(tok, [turn1, turn2])
    [[ep]] = run_episodes(sampler, tok, env_factory, [ROW], 1, SamplingParams(max_tokens=64))
    assert ep.reward == 1.0 and ep.turns == 2 and ep.done and ep.policy_version == 3

    ids = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    eos = tok.eos_token_id
    c1, c2 = ids(turn1) + [eos], ids(turn2) + [eos]
    report = "AC: passed 1 of 1 example tests.\ntest 1: AC"
    reply = ids(f"\n<|im_start|>user\n<tool_response>\n{report}\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert ep.prompt_tokens == prompt_tokens(tok, ROW["prompt"], tools)
    assert tok.decode(ep.prompt_tokens).startswith("<|im_start|>system\nTools:\n{\"type\": \"function\"")
    assert ep.completion_tokens == c1 + reply + c2
    expected_weights = [1.0] * len(c1) + [0.0] * len(reply) + [1.0] * len(c2)
    for t, (w, lp, want) in enumerate(zip(ep.weights, ep.logprobs, expected_weights, strict=True)):
        assert w == want, t                                      # sampled tokens train, the tool's never do
        assert lp == (-0.5 if want else 0.0), t
    assert sampler.contexts == [ep.prompt_tokens, ep.prompt_tokens + c1 + reply]   # turn 2 saw turn 1 and the reply
    # the episode is the conversation exactly as the template renders it (the last turn-end newline aside)
    whole = ROW["prompt"] + [{"role": "assistant", "content": "", "tool_calls": [call]},
                             {"role": "tool", "name": "check_solution", "content": report},
                             {"role": "assistant", "content": turn2}]
    assert tok.decode(ep.prompt_tokens + ep.completion_tokens) + "\n" == render(tok, whole, tools, False)
    # and the trainer's batch keeps the reply in the context (attention) but out of the loss (weights)
    batch = trainer_batch([episode_datum(ep, 1.0)], tok.pad_token_id, "cpu")
    assert batch["response_mask"][0].tolist() == expected_weights
    assert batch["attention_mask"][0].sum() == len(ep.prompt_tokens) + len(ep.completion_tokens)


def test_default_tiny_template_renders_the_tool_reply_as_a_tool_turn(judge, tiny_tokenizer):
    """The tiny model's plain ChatML template ignores tools=; the reply is still its own rendering."""
    sampler = ScriptedSampler(tiny_tokenizer, [tool_call_text("print(3)"), "no code"])
    [[ep]] = run_episodes(sampler, tiny_tokenizer, lambda: CodeEnv(judge, tiny_tokenizer), [ROW], 1,
                          SamplingParams(max_tokens=64))
    assert ep.reward == -0.1 and ep.turns == 2
    text = tiny_tokenizer.decode(ep.completion_tokens)
    assert "<|im_end|>\n<|im_start|>tool\nAC: passed 1 of 1" in text and text.endswith("no code<|im_end|>")


def test_reply_closes_a_cut_off_turn_and_ignores_how_earlier_turns_are_rerendered(tiny_tokenizer):
    """A turn cut off by max_tokens gets its end-of-turn token from the reply (at weight 0); a template that
    renders the last assistant turn differently from earlier ones (as Qwen3's does) gives the same reply."""
    tok = copy.deepcopy(tiny_tokenizer)
    tool = [{"role": "tool", "content": "ok"}]
    ids = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    after_eos = "\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n"
    assert reply_tokens(tok, tool, None, None) == ids("<|im_end|>" + after_eos)
    assert reply_tokens(tok, tool, None, tok.eos_token_id) == ids(after_eos)
    tok.chat_template = tok.chat_template.replace("{{ m['content'] }}",
                                                  "{% if loop.last and m['role'] == 'assistant' %}<think></think>"
                                                  "{% endif %}{{ m['content'] }}")
    assert "<think>" in render(tok, [{"role": "user", "content": "."}, {"role": "assistant", "content": "x"}],
                               None, False)
    assert reply_tokens(tok, tool, None, tok.eos_token_id) == ids(after_eos)


def test_episode_seeds_are_never_shared_between_groups_turns_or_calls():
    """Groups are seeded seed, seed+1, ... (overlap.RolloutPool); a seed shared between two calls would make the
    session batch them or not depending on thread timing, and correlate their noise."""
    seeds = [episode_seed(group, turn, call) for group in range(20) for turn in range(4) for call in range(8)]
    assert len(set(seeds)) == len(seeds)
