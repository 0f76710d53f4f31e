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
