import pytest

from minirl.config import Config, ConfigError, parse_config


def test_defaults_then_yaml_then_command_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: 1.0e-5\ngroup_size: 4\nadv_estimator: dr_grpo\ntrain_files: [a.jsonl, b.jsonl]\n")
    cfg = parse_config(["--config", str(f), "--group_size", "6", "--gradient_checkpointing", "true"])
    assert cfg.lr == 1e-5 and cfg.group_size == 6 and cfg.adv_estimator == "dr_grpo"
    assert cfg.gradient_checkpointing is True and cfg.train_files == "a.jsonl,b.jsonl"
    assert parse_config([]) == Config()
    assert parse_config(["--max_steps=3"]).max_steps == 3


def test_unknown_key_names_key_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown config key 'group_sise'.*group_size"):
        parse_config(["--group_sise", "4"])


def test_bad_choice_lists_valid_choices():
    with pytest.raises(ConfigError, match=r"'adv_estimator'.*'ppg'.*\['grpo', 'dr_grpo', 'rloo'\]"):
        parse_config(["--adv_estimator", "ppg"])


@pytest.mark.parametrize("args,match", [
    (["--group_size", "four"], "'group_size': expected int"),
    (["--lr", "fast"], "'lr': expected float"),
    (["--gradient_checkpointing", "maybe"], "'gradient_checkpointing': expected bool"),
    (["--group_size", "1"], "'group_size' must be >= 2"),
    (["--micro_batch_size", "0"], "'micro_batch_size' must be >= 1"),
    (["--mini_batches", "3"], "'mini_batches'"),
    (["--lr"], "has no value"),
    (["--dtype", "float16"], "loss scaling"),                       # fp16 gradients underflow without it
    (["--lora_rank", "8", "--lora_dropout", "0.1"], "'lora_dropout' must be 0"),  # ratio != 1 on-policy
    (["--kl_in_reward", "true"], "'kl_in_reward' needs 'kl_coef'"),
])
def test_bad_values_are_errors_naming_the_key(args, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(args)


def test_yaml_type_errors_and_missing_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("max_steps: 2.5\n")
    with pytest.raises(ConfigError, match="'max_steps': expected int"):
        parse_config(["--config", str(f)])
    with pytest.raises(ConfigError, match="does not exist"):
        parse_config(["--config", str(tmp_path / "missing.yaml")])


def test_help_prints_every_keys_comment_read_from_the_config_source(capsys):
    """--help's text is the dataclass's comments, parsed from the source: a comment above a key, on its line,
    continued on the lines under it, or on a later line of a key that spans lines."""
    import dataclasses

    from minirl.config import Config, key_comments, parse_config
    with pytest.raises(SystemExit) as done:
        parse_config(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # wrapping undone
    comments = {key: comment for _, key, comment in key_comments() if key}
    assert set(comments) == {f.name for f in dataclasses.fields(Config)}
    assert comments["dtype"].startswith("compute dtype (weights stay fp32)")                 # above the key
    assert comments["reward_fn"].endswith("(veRL's custom_reward_function)")                 # continued under it
    assert comments["loss_agg_mode"].startswith("see loss.aggregate; Dr. GRPO")               # a key over 2 lines
    assert comments["answer_extraction"].endswith("(veRL's two methods; rewards.py)")
    assert comments["top_p"] == ""                                                            # none: nothing else's
    for key, comment in comments.items():
        assert f"--{key} " in text and " ".join(comment.split()) in text, key
    assert sum(bool(c) for c in comments.values()) >= len(comments) - 8  # nearly every key is documented


def test_help_after_other_keys_prints_the_help_too(capsys):
    """`train.py --config x.yaml --help` (or --max_steps 1 --help): the help, not "config key 'help' has no value"."""
    from minirl.config import parse_config
    with pytest.raises(SystemExit) as done:
        parse_config(["--max_steps", "1", "--help"])
    assert done.value.code == 0 and "--max_judge_error_share" in capsys.readouterr().out
