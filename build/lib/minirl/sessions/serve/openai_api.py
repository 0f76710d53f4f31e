"""The OpenAI wire format: request bodies checked field by field into a `Request`, and the JSON replies (whole
or as Server-Sent Event chunks) built from the engine's outputs.

Every field is either honoured or refused with a 400 that names it: the fields below, plus those OpenAI
clients send at a value that changes nothing (`presence_penalty: 0`, `logit_bias: {}`, ...), which are
accepted at that value only. `top_k`, `repetition_penalty` and `do_sample` are vLLM's and lm-eval's extensions.
Log-probs are the model's own (temperature 1), `top_logprobs` at most MAX_TOP_LOGPROBS.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from minirl.sessions.serve.engine import Output, Sampling

MAX_N = 16
MAX_PROMPTS = 64           # prompts in one /v1/completions request
MAX_STOP = 16              # OpenAI allows 4; lm-eval sends a task's stop strings plus the EOS string
MAX_TOP_LOGPROBS = 20

SAMPLING_FIELDS = {"model", "stream", "stream_options", "n", "max_tokens", "temperature", "top_p", "top_k", "seed",
                   "stop", "do_sample", "user"}
FIELDS = {"chat": SAMPLING_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"},
          "completions": SAMPLING_FIELDS | {"prompt", "echo", "logprobs"}}
# accepted only at the value that leaves the model's distribution as it is
NO_OP = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "logit_bias": {}, "best_of": 1,
         "suffix": "", "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
         "parallel_tool_calls": False}


class RequestError(ValueError):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


@dataclass
class Request:
    kind: str                      # "chat" or "completions"
    prompts: list[list[int]]       # token ids (chat: the chat-templated conversation)
    sampling: Sampling
    top_logprobs: int | None       # None: no log-probs; else each token's and the k most likely
    echo: bool = False             # completions: the prompt's text and log-probs come first
    stream: bool = False
    include_usage: bool = False


def _number(body: dict, name: str, default, lo: float, hi: float, kind=float):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (kind is int and value != int(value)):
        raise RequestError(f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}", name)
    if not lo <= value <= hi:
        raise RequestError(f"'{name}' must be between {lo} and {hi}, got {value}", name)
    return kind(value)


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"'{name}' must be true or false, got {value!r}", name)
    return bool(value)


def _check_fields(kind: str, body: dict) -> None:
    for name, value in body.items():
        if name in FIELDS[kind] or value is None:
            continue
        if name not in NO_OP:
            raise RequestError(f"'{name}' is not supported by this server", name)
        if value != NO_OP[name]:
            raise RequestError(f"'{name}' is not supported except at {NO_OP[name]!r} (no effect), got {value!r}",
                               name)


def parse_request(kind: str, body: dict, tokenizer, model_name: str, max_tokens_limit: int,
                  vocab_size: int, context: int | None) -> Request:
    """A /v1/chat/completions (kind "chat") or /v1/completions body, or RequestError naming the bad field."""
    if body.get("model") not in (None, model_name):
        raise RequestError(f"model {body['model']!r} does not exist; this server serves {model_name!r}", "model",
                           404)
    _check_fields(kind, body)
    if kind == "chat":
        prompts = [_chat_prompt(body.get("messages"), tokenizer)]
        top = _number(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS, int) if _flag(body, "logprobs") else None
        if body.get("top_logprobs") is not None and top is None:
            raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        default_max, min_max = min(256, max_tokens_limit), 1
    else:
        prompts = _completion_prompts(body.get("prompt"), tokenizer, vocab_size)
        top = _number(body, "logprobs", None, 0, MAX_TOP_LOGPROBS, int)
        max_tokens = body.get("max_tokens")
        default_max, min_max = min(16, max_tokens_limit), 0  # OpenAI's default; 0 scores the prompt (with echo)
    max_tokens = _number({"max_tokens": max_tokens}, "max_tokens", default_max, min_max, max_tokens_limit, int)
    field = "messages" if kind == "chat" else "prompt"
    if context is not None and any(len(p) + min(max_tokens, 1) > context for p in prompts):
        raise RequestError(f"a prompt of {max(map(len, prompts))} tokens leaves no room in the model's context "
                           f"of {context} tokens", field)
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise RequestError("'stream_options' supports only {\"include_usage\": bool}", "stream_options")
    if options is not None and not _flag(body, "stream"):
        raise RequestError("'stream_options' is only allowed with 'stream': true", "stream_options")
    return Request(kind, prompts, _sampling(body, max_tokens), top, echo=_flag(body, "echo"),
                   stream=_flag(body, "stream"), include_usage=_flag(options or {}, "include_usage"))


def _sampling(body: dict, max_tokens: int) -> Sampling:
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(f"'stop' must be a string or a list of at most {MAX_STOP} non-empty strings", "stop")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    do_sample = body.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise RequestError(f"'do_sample' must be true or false, got {do_sample!r}", "do_sample")
    if do_sample and temperature == 0:
        raise RequestError("'do_sample': true needs a temperature above 0", "do_sample")
    top_k = _number(body, "top_k", 0, -1, 1 << 30, int)
    seed = _number(body, "seed", None, -(1 << 63), (1 << 64) - 1, int)
    return Sampling(max_tokens=max_tokens, temperature=temperature, top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
                    top_k=max(top_k, 0), greedy=temperature == 0 or do_sample is False, stop=tuple(stop),
                    n=_number(body, "n", 1, 1, MAX_N, int), seed=None if seed is None else seed % (1 << 63))


def _chat_prompt(messages, tokenizer) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", "messages")
    chat = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role' and text 'content'",
                               "messages")
        extra = sorted(k for k, v in m.items() if k not in ("role", "content") and v is not None)
        if extra:  # a name, tool calls, ...: refused rather than dropped
            raise RequestError(f"messages[{i}]: {extra} not supported (only 'role' and 'content')", "messages")
        chat.append({"role": m["role"], "content": content})
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids  # the template holds the special tokens


def _completion_prompts(prompt, tokenizer, vocab_size: int) -> list[list[int]]:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    def is_ids(p) -> bool:
        return isinstance(p, list) and bool(p) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
    if isinstance(prompt, str) or is_ids(prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or len(prompt) > MAX_PROMPTS or \
            not all((isinstance(p, str) and p) or is_ids(p) for p in prompt):
        raise RequestError(f"'prompt' must be a non-empty string or list of token ids, or a list of at most "
                           f"{MAX_PROMPTS} of them", "prompt")
    ids = [tokenizer(p).input_ids if isinstance(p, str) else p for p in prompt]
    if any(not 0 <= t < vocab_size for p in ids for t in p):
        raise RequestError(f"'prompt' holds a token id outside the vocabulary [0, {vocab_size})", "prompt")
    if not all(ids):
        raise RequestError("'prompt' holds a string that tokenizes to nothing", "prompt")
    return ids


# --- replies -------------------------------------------------------------------------------------------------

def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """The text before the first stop string (the stop string is not part of the reply, as in OpenAI's)."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[:min(hits)] if hits else text


def usage(req: Request, outputs: list[Output]) -> dict:
    prompt, completion = sum(map(len, req.prompts)), sum(len(o.tokens) for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _reported(req: Request, o: Output) -> tuple[list[int], list | None, list | None]:
    """A choice's tokens with their log-probs and top tokens as replied: with echo the prompt's come first, its
    first token with none (nothing precedes it)."""
    prompt = req.prompts[o.prompt] if req.echo else []
    if o.logprobs is None:
        return prompt + o.tokens, None, None
    head = [None] if prompt else []
    return prompt + o.tokens, head + o.logprobs, head + o.top


def logprobs_json(req: Request, tokenizer, tokens: list[int], logps: list | None, tops: list | None,
                  offset: int = 0) -> dict | None:
    """choices[i].logprobs. Chat: {"content": [{token, logprob, bytes, top_logprobs}]}. Completions (the
    legacy format): tokens, token_logprobs, top_logprobs (dicts that always hold the token itself, as vLLM's),
    text_offset (from `offset`, the characters streamed before these tokens)."""
    if logps is None:
        return None
    pieces = [tokenizer.decode([t]) for t in tokens]
    if req.kind == "chat":
        entry = lambda s, lp: {"token": s, "logprob": lp, "bytes": list(s.encode())}  # noqa: E731
        return {"content": [{**entry(s, lp), "top_logprobs": [entry(tokenizer.decode([t]), v) for t, v in top]}
                            for s, lp, top in zip(pieces, logps, tops)], "refusal": None}
    top_dicts = [None if top is None else {**{tokenizer.decode([t]): v for t, v in top}, s: lp}
                 for s, lp, top in zip(pieces, logps, tops)]
    offsets = [offset + sum(map(len, pieces[:i])) for i in range(len(pieces))]
    return {"tokens": pieces, "token_logprobs": logps, "top_logprobs": top_dicts, "text_offset": offsets}


def _texts(req: Request, o: Output, tokenizer) -> tuple[str, str]:
    """(the echoed prompt's text or "", the completion's text, cut before the first stop string)."""
    prompt = tokenizer.decode(req.prompts[o.prompt]) if req.echo else ""  # as sent: special tokens kept
    return prompt, cut_at_stop(tokenizer.decode(o.tokens, skip_special_tokens=True), req.sampling.stop)


def reply(req: Request, head: dict, outputs: list[Output], tokenizer) -> dict:
    """The whole (non-streamed) JSON reply."""
    choices = []
    for i, o in enumerate(outputs):
        prompt_text, text = _texts(req, o, tokenizer)
        choice = {"index": i, "finish_reason": o.finish_reason,
                  "logprobs": logprobs_json(req, tokenizer, *_reported(req, o))}
        if req.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = prompt_text + text
        choices.append(choice)
    kind = "chat.completion" if req.kind == "chat" else "text_completion"
    return {**head, "object": kind, "choices": choices, "usage": usage(req, outputs)}


def stream_chunks(req: Request, head: dict, outputs: list[Output], tokenizer):
    """The chunks of a streamed reply. Per choice: (chat) a role chunk, (echo) the prompt, then the text piece
    by piece as its tokens decode (a piece carries the log-probs of the tokens it completes; a multi-byte
    character waits for its last token), then the finish_reason; last, with include_usage, a chunk with no
    choices and the usage (every other chunk then says "usage": null)."""
    kind = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    extra = {"usage": None} if req.include_usage else {}

    def chunk(i: int, text: str | None, finish: str | None = None, lp: dict | None = None) -> dict:
        if req.kind == "chat":
            delta = {"role": "assistant", "content": ""} if text is None else {"content": text} if text else {}
            choice = {"index": i, "delta": delta, "finish_reason": finish, "logprobs": lp}
        else:
            choice = {"index": i, "text": text or "", "finish_reason": finish, "logprobs": lp}
        return {**head, "object": kind, "choices": [choice], **extra}

    for i, o in enumerate(outputs):
        tokens, logps, tops = _reported(req, o)
        lp = lambda a, b, offset: logprobs_json(req, tokenizer, tokens[a:b], logps and logps[a:b],  # noqa: E731
                                                tops and tops[a:b], offset)
        prompt_text, text = _texts(req, o, tokenizer)
        if req.kind == "chat":
            yield chunk(i, None)
        start = len(tokens) - len(o.tokens)          # tokens[:start]: the echoed prompt
        if start:
            yield chunk(i, prompt_text, lp=lp(0, start, 0))
        sent, pending = "", start
        for t in range(1, len(o.tokens) + 1):
            piece = tokenizer.decode(o.tokens[:t], skip_special_tokens=True)[:len(text)]
            if len(piece) > len(sent) and not piece.endswith("\ufffd"):
                yield chunk(i, piece[len(sent):], lp=lp(pending, start + t, len(prompt_text) + len(sent)))
                sent, pending = piece, start + t
        rest = lp(pending, len(tokens), len(prompt_text) + len(sent)) if pending < len(tokens) else None
        yield chunk(i, "", o.finish_reason, rest)
    if req.include_usage:
        yield {**head, "object": kind, "choices": [], "usage": usage(req, outputs)}
