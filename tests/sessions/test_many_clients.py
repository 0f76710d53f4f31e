"""What only shows when several requests share a process, one fix each: rows that end on a stop string return
no padding (sessions and serve), RL losses score at the temperature that sampled the data whatever ran in
between, seeded sampling and LoRA initialisation draw from generators of their own, models are built one at a
time, and clear errors for an unknown tinker:// path and for weights on only some datums. The same requests run
by many clients at once: test_concurrency.py."""
import threading

import pytest
import torch

from minirl.sessions import AdamParams, Datum, ModelInput, SamplingParams, ServiceClient, SessionError
from minirl.sessions.serve.engine import Engine, Job, Sampling

IM_START, EOS = 1, 2          # the toy tokenizer's <|im_start|> (a special token, not an EOS) and <|im_end|>


@pytest.fixture(scope="module")
def svc():
    return ServiceClient()


@pytest.fixture(scope="module")
def random_folder(tmp_path_factory, tiny_tokenizer):
    """A random-weights tiny model on disk (its greedy continuations run on: no early EOS)."""
    from minirl.toy.tiny import build_model
    folder = tmp_path_factory.mktemp("random_model")
    build_model(len(tiny_tokenizer), seed=0, eos_id=EOS, pad_id=tiny_tokenizer.pad_token_id).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return str(folder)


def steer(model, rules: dict[int, int], banned: tuple[int, ...] = ()):
    """Logits hook: after input token a the next token is rules[a]; `banned` tokens are never the argmax."""
    def hook(module, args, kwargs, out):
        ids = kwargs["input_ids"][:, -out.logits.shape[1]:]
        for after, token in rules.items():
            out.logits[..., token] += 1e4 * (ids == after)
        for token in banned:
            out.logits[..., token] -= 1e4
        return out
    return model.register_forward_hook(hook, with_kwargs=True)


def global_draws(model):
    """Another thread's use of torch's global generator, made deterministic: a draw before every forward."""
    return model.register_forward_pre_hook(lambda module, args: [torch.rand(3)] and None)


def toy_prompt(tok, i: int = 0) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": f"What is {i}+{i + 3}?"}], tokenize=True,
                                   add_generation_prompt=True, return_dict=False)


# --- 1. a row that ends on a stop string ---------------------------------------------------------------------

def test_a_session_sample_ending_on_a_special_token_stop_returns_no_padding_and_stop_reason_stop(svc, random_folder):
    sc = svc.create_sampling_client(random_folder).result()
    hook = steer(sc.model, {30: IM_START}, banned=(EOS,))
    params = SamplingParams(max_tokens=6, temperature=0, stop=["<|im_start|>"])
    futures = [sc.sample(ModelInput.from_ints(p), 1, params) for p in ([272, 270, 30], [272, 270, 31])]
    stopped, other = [f.result().sequences[0] for f in futures]           # one batch: the other row ran on
    hook.remove()
    assert (stopped.tokens, stopped.stop_reason, len(stopped.logprobs)) == ([IM_START], "stop", 1)
    assert len(other.tokens) == 6 and other.stop_reason == "length"


def test_a_served_row_ending_on_a_stop_string_finishes_with_stop_and_counts_no_padding(svc, random_folder):
    sc = svc.create_sampling_client(random_folder).result()
    hook = steer(sc.model, {30: IM_START}, banned=(EOS,))
    engine = Engine(sc.model, sc.tokenizer)
    job = engine.submit(Job([[272, 270, 30], [272, 270, 31]], Sampling(max_tokens=6, greedy=True,
                                                                       stop=("<|im_start|>",))))
    job.done.wait()
    engine.close()
    hook.remove()
    assert job.error is None
    assert [(o.tokens, o.finish_reason) for o in job.outputs][0] == ([IM_START], "stop")
    assert len(job.outputs[1].tokens) == 6 and job.outputs[1].finish_reason == "length"


# --- 3. the temperature that sampled the data ----------------------------------------------------------------

def _datums(seqs, prompt) -> list[Datum]:
    return [Datum(prompt, s.tokens, s.logprobs, advantages=float(i) - 1.5) for i, s in enumerate(seqs)]


def test_a_sample_queued_before_an_optim_step_ran_is_scored_at_its_own_temperature(svc, tiny_path):
    """The sample is submitted while an optim_step (lr 0) waits to run: its datums still score at T=0.7."""
    tc = svc.create_lora_training_client(str(tiny_path), rank=4).result()
    prompt = toy_prompt(tc.get_tokenizer())
    sc = tc.save_weights_and_get_sampling_client(kind="inflight").result()
    release = threading.Event()
    tc._worker.submit("hold", release.wait)                    # the worker runs nothing until released
    tc.forward_backward([Datum(prompt, [5, 6, 7])], "cross_entropy")
    step = tc.optim_step(AdamParams(learning_rate=0.0))
    fut = sc.sample(ModelInput.from_ints(prompt), 4, SamplingParams(max_tokens=6, temperature=0.7))
    release.set()
    step.result()
    out = tc.forward(_datums(fut.result().sequences, prompt), "importance_sampling").result()
    tc.stop()
    assert abs(out.metrics["ppo_kl:mean"]) < 1e-5, out.metrics


def test_a_sampler_on_saved_weights_scores_its_samples_at_their_temperature(svc, tiny_path):
    """save_weights_for_sampler then create_sampling_client(model_path): the SDK's way over HTTP."""
    tc = svc.create_lora_training_client(str(tiny_path), rank=4).result()
    prompt = toy_prompt(tc.get_tokenizer(), 1)
    sc = svc.create_sampling_client(model_path=tc.save_weights_for_sampler("t07").result().path).result()
    seqs = sc.sample(ModelInput.from_ints(prompt), 4, SamplingParams(max_tokens=6, temperature=0.7)).result().sequences
    out = tc.forward(_datums(seqs, prompt), "importance_sampling").result()
    tc.stop()
    sampled = torch.tensor([lp for s in seqs for lp in s.logprobs])
    trained = torch.cat([o["logprobs"].to_torch()[-len(s.tokens):] for o, s in zip(out.loss_fn_outputs, seqs)])
    assert (trained - sampled).abs().max() < 1e-4 * sampled.abs().max()    # the merged copy's rounding only


def test_a_batch_of_samples_at_two_temperatures_raises_naming_the_fix(svc, tiny_path):
    tc = svc.create_training_client(str(tiny_path)).result()
    prompt = toy_prompt(tc.get_tokenizer(), 2)
    sc = tc.save_weights_and_get_sampling_client().result()
    seqs = [s for T in (0.7, 1.3) for s in sc.sample(ModelInput.from_ints(prompt), 2,
                                                      SamplingParams(max_tokens=5, temperature=T)).result().sequences]
    with pytest.raises(SessionError, match=r"temperatures \[0.7, 1.3\].*loss_fn_config"):
        tc.forward(_datums(seqs, prompt), "importance_sampling").result()
    assert tc.forward(_datums(seqs[:2], prompt), "importance_sampling").result().metrics["ppo_kl:mean"] < 1e-5
    tc.stop()


# --- 4. per-request generators -------------------------------------------------------------------------------

def test_a_seeded_session_sample_is_unchanged_by_other_draws_from_the_global_generator(svc, random_folder):
    sc = svc.create_sampling_client(random_folder).result()
    ask = lambda: sc.sample(ModelInput.from_ints([272, 270, 31]), 3,  # noqa: E731
                            SamplingParams(max_tokens=8, temperature=1.5, seed=11)).result().sequences
    alone = [s.tokens for s in ask()]
    hook = global_draws(sc.model)
    crowded = [s.tokens for s in ask()]
    hook.remove()
    assert crowded == alone and len({tuple(t) for t in alone}) > 1


def test_a_seeded_served_request_is_unchanged_by_other_draws_from_the_global_generator(svc, random_folder):
    sc = svc.create_sampling_client(random_folder).result()
    engine = Engine(sc.model, sc.tokenizer)
    outputs = []
    for noisy in (False, True):
        hook = global_draws(sc.model) if noisy else None
        job = engine.submit(Job([[272, 270, 31]], Sampling(max_tokens=8, temperature=1.5, n=3, seed=11)))
        job.done.wait()
        outputs.append([o.tokens for o in job.outputs])
        hook and hook.remove()
    engine.close()
    assert outputs[0] == outputs[1] and len({tuple(t) for t in outputs[0]}) > 1


def test_a_lora_adapter_of_a_seed_is_the_same_whatever_else_draws_meanwhile(tiny_path, monkeypatch):
    from minirl.models import build_policy
    build = lambda: build_policy(str(tiny_path), torch.device("cpu"), torch.float32,  # noqa: E731
                                 lora=dict(rank=4, alpha=8), seed=1)
    adapter = lambda m: {n: p.detach().clone() for n, p in m.named_parameters() if "lora_A" in n}  # noqa: E731
    alone = adapter(build())
    kaiming = torch.nn.init.kaiming_uniform_
    monkeypatch.setattr(torch.nn.init, "kaiming_uniform_", lambda *a, **k: [torch.rand(5)] and kaiming(*a, **k))
    crowded = adapter(build())
    assert alone.keys() == crowded.keys() and len(alone) > 0
    assert all(torch.equal(alone[n], crowded[n]) for n in alone)


# --- 5, 6, 7 -------------------------------------------------------------------------------------------------

def test_models_are_built_one_at_a_time_however_many_clients_create_them(svc, tiny_path, monkeypatch):
    """from_pretrained patches torch process-wide while it builds: two at once crashed on meta tensors."""
    import transformers
    real, inside, peak, both = transformers.AutoModelForCausalLM.from_pretrained, [0], [0], threading.Event()
    count = threading.Lock()

    def spy(*args, **kwargs):
        with count:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            if inside[0] == 2:
                both.set()
        both.wait(timeout=2)              # unserialised, the other thread is in here well within this
        try:
            return real(*args, **kwargs)
        finally:
            with count:
                inside[0] -= 1
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    clients = [None, None]
    make = [lambda: svc.create_lora_training_client(str(tiny_path), rank=4, seed=1).result(),
            lambda: svc.create_sampling_client(base_model=str(tiny_path)).result()]
    threads = [threading.Thread(target=lambda i=i: clients.__setitem__(i, make[i]())) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert peak[0] == 1 and all(c is not None for c in clients)
    clients[0].stop()


def test_a_sampler_on_an_unknown_tinker_path_raises_naming_the_path(svc):
    with pytest.raises(FileNotFoundError, match="tinker://nobody:train:0/sampler_weights/x does not exist"):
        svc.create_sampling_client("tinker://nobody:train:0/sampler_weights/x")


def test_cross_entropy_weights_on_only_some_datums_raise_instead_of_weighing_the_others_zero(svc, tiny_path):
    tc = svc.create_training_client(str(tiny_path)).result()
    prompt = toy_prompt(tc.get_tokenizer())
    weighted = Datum(prompt, [5, 6, 7])
    plain = Datum(ModelInput.from_ints(prompt + [5, 6]), {"target_tokens": prompt[1:] + [5, 6, 7]})
    with pytest.raises(SessionError, match="1 of 2 datums carry loss_fn_inputs 'weights', datum 1 does not"):
        tc.forward([weighted, plain], "cross_entropy").result()
    assert tc.forward([plain, plain], "cross_entropy").result().metrics["loss:sum"] > 0
    tc.stop()
