"""Episodes: run environments (minirl/agentic/env.py) with a sampler of the sessions API, turn by turn, as tokens.

    groups = run_episodes(sc, tokenizer, lambda: CodeEnv(judge, tokenizer), rows, group_size=8,
                          params=SamplingParams(max_tokens=512, temperature=1.0))
    datums = [episode_datum(ep, adv) for ...]        # ready for TrainingClient.forward_backward

Token in, token out: an episode is the prompt's tokens, then for each turn the tokens the model sampled
followed by the tokens of the environment's reply. The model's turns are never re-rendered (a template may
write a tool call differently from how the model did, and the loss must see what the model sampled); only the
messages the environment adds are rendered, by the tokenizer's own chat template (with `tools=`):

    reply text = what render([user, assistant "MARK"] + added, generation prompt) writes after MARK

that is, the end of the assistant turn, the added messages and the next assistant header, as the template
writes them (the end-of-turn token itself is left out when the model sampled it; a turn cut off by max_tokens
gets it here, at weight 0). Only the text after the assistant turn is used, so templates that render earlier
turns differently once they are no longer the last (Qwen3 drops their reasoning) work too.

One episode's training layout (a `Datum`):
    prompt_tokens      render(reset messages, generation prompt)
    completion_tokens  turn 1 | reply 1 | turn 2 | ... | last turn
    weights            1 ... | 0 ...   | 1 ... | ... | 1 ...       (the environment's tokens are out of the loss)
    logprobs           the sampler's on sampled tokens, 0 on the environment's (weight 0: never used)
Budgets: `params.max_tokens` per turn; the number of turns is the environment's (CodeEnv max_turns).
"""
from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from minirl.agentic.env import Env, Messages
from minirl.sessions.types import Datum, SamplingParams

_MARK = "MINIRL_TURN_END"  # a string no template writes by itself


def render(tokenizer, messages: Messages, tools: list[dict] | None, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def prompt_tokens(tokenizer, messages: Messages, tools: list[dict] | None = None) -> list[int]:
    return tokenizer(render(tokenizer, messages, tools, True), add_special_tokens=False).input_ids


def reply_tokens(tokenizer, added: Messages, tools: list[dict] | None, last_token: int | None) -> list[int]:
    """The tokens that follow a model turn ending in `last_token` (None: cut off mid-turn): the end of the
    assistant turn as the template writes it, the added messages, the next assistant header."""
    chat = [{"role": "user", "content": "."}, {"role": "assistant", "content": _MARK}] + added
    full = render(tokenizer, chat, tools, True)
    if full.count(_MARK) != 1:
        raise ValueError("the chat template does not write an assistant turn's content verbatim; multi-turn "
                         "episodes need one that does")
    text = full[full.index(_MARK) + len(_MARK):]                  # "<|im_end|>\n<|im_start|>tool\n..." (ChatML)
    eos_text = tokenizer.decode([last_token]) if last_token is not None else ""
    if eos_text and text.startswith(eos_text):
        text = text[len(eos_text):]                                 # the model already wrote it
    return tokenizer(text, add_special_tokens=False).input_ids


@dataclass
class Episode:
    env: Env
    messages: Messages
    prompt_tokens: list[int]
    completion_tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    done: bool = False
    policy_version: int = 0       # of the weights that sampled the first turn
    info: dict = field(default_factory=dict)

    @property
    def context(self) -> list[int]:
        return self.prompt_tokens + self.completion_tokens


def episode_datum(ep: Episode, advantage: float) -> Datum:
    return Datum(ep.prompt_tokens, ep.completion_tokens, ep.logprobs, advantages=advantage, weights=ep.weights)


def episode_seed(seed: int, turn: int, call: int) -> int:
    """A seed of its own for each (group seed, turn, call): groups seeded seed, seed+1, ... never share one."""
    return ((seed * 1_000_003 + turn) * 1_000_003 + call) % 2**63


def run_episodes(sampler, tokenizer, make_env: Callable[[], Env], problems: list[dict], group_size: int,
                 params: SamplingParams, seed: int | None = None) -> list[list[Episode]]:
    """`group_size` episodes per problem, run to the end. Each round samples the next turn of every live
    episode (all submitted before waiting), then steps their environments in parallel (the judge runs programs
    on its own threads). The first turn of a group whose prompts agree is one `sample(prompt, G)` call.
    With `seed`, every call carries its own seed (SamplingParams.seed), so the samples do not depend on what
    else the sampler ran meanwhile (other threads' groups). Returns one list of episodes per problem."""
    groups = []
    for problem in problems:
        group = []
        for _ in range(group_size):
            env = make_env()
            messages = env.reset(problem)
            group.append(Episode(env, messages, prompt_tokens(tokenizer, messages, env.tools)))
        groups.append(group)
    # round 1: one request per group when its prompts agree; later rounds one per episode (contexts differ)
    requests = [[g] if all(ep.prompt_tokens == g[0].prompt_tokens for ep in g) else [[ep] for ep in g]
                for g in groups]
    requests = [r for rs in requests for r in rs]
    with concurrent.futures.ThreadPoolExecutor(max(1, len(groups) * group_size)) as pool:
        turn = 0
        while requests:
            calls = [(eps, replace(params, seed=None if seed is None else episode_seed(seed, turn, i)))
                     for i, eps in enumerate(requests)]
            futures = [sampler.sample(eps[0].context, len(eps), p) for eps, p in calls]
            live, seqs, versions = [], [], []
            for (eps, _), f in zip(calls, futures):
                r = f.result()
                live += eps
                seqs += r.sequences
                versions += [r.policy_version] * len(eps)
            texts = [tokenizer.decode(s.tokens, skip_special_tokens=True) for s in seqs]
            steps = list(pool.map(lambda a: a[0].env.step(a[0].messages, a[1]), zip(live, texts)))
            for ep, version, s, (new_messages, reward, info) in zip(live, versions, seqs, steps):
                if ep.turns == 0:
                    ep.policy_version = version
                ep.turns += 1
                ep.completion_tokens += s.tokens
                ep.logprobs += s.logprobs
                ep.weights += [1.0] * len(s.tokens)
                ep.info = info
                ep.reward += reward  # CodeEnv's rewards come at the end; other environments may pay per turn
                if new_messages is None:
                    ep.done = True
                    continue
                last = s.tokens[-1] if s.stop_reason == "stop" and s.tokens else None
                reply = reply_tokens(tokenizer, new_messages[len(ep.messages) + 1:], ep.env.tools, last)
                ep.completion_tokens += reply
                ep.logprobs += [0.0] * len(reply)
                ep.weights += [0.0] * len(reply)
                ep.messages = new_messages
            requests, turn = [[ep] for ep in live if not ep.done], turn + 1
    return groups
