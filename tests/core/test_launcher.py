"""`accelerate launch`'s config is honoured or refused, never silently ignored (config.check_launcher).

minirl never calls `accelerator.prepare()`, so accelerate's FSDP, DeepSpeed, mixed-precision and dynamo settings
would change nothing; each is checked before any model is loaded. `on_gpu=True` runs the branch a GPU takes
(`dtype: auto` is bf16 there)."""
import subprocess
import sys

import pytest

from conftest import ROOT
from minirl.config import Config, ConfigError, check_launcher


@pytest.mark.device_branch("train/launcher")
@pytest.mark.parametrize("env, match", [
    ({"ACCELERATE_USE_FSDP": "true"}, "--fsdp true"),
    ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed"),
    ({"ACCELERATE_USE_MEGATRON_LM": "true"}, "Megatron"),
    ({"ACCELERATE_USE_PARALLELISM_CONFIG": "true"}, "parallelism"),
    ({"ACCELERATE_MIXED_PRECISION": "fp16"}, "--dtype"),
    ({"ACCELERATE_MIXED_PRECISION": "fp8"}, "--dtype"),
    ({"ACCELERATE_DYNAMO_BACKEND": "INDUCTOR"}, "dynamo_backend"),
])
def test_plugins_minirl_does_not_apply_are_refused(env, match):
    with pytest.raises(ConfigError, match=match):
        check_launcher(Config(), env, on_gpu=True)


@pytest.mark.device_branch("train/launcher")
def test_bf16_mixed_precision_must_agree_with_dtype():
    env = {"ACCELERATE_MIXED_PRECISION": "bf16"}
    assert check_launcher(Config(), env, on_gpu=True) == []              # auto is bf16 on a GPU: honoured
    assert check_launcher(Config(dtype="bfloat16"), env, on_gpu=False) == []
    with pytest.raises(ConfigError, match="--dtype bfloat16"):
        check_launcher(Config(), env, on_gpu=False)                      # auto is fp32 on a CPU
    with pytest.raises(ConfigError, match="--dtype bfloat16"):
        check_launcher(Config(dtype="float32"), env, on_gpu=True)
    with pytest.raises(ConfigError, match="--dtype bfloat16"):  # `accelerate launch --cpu` on a GPU host:
        check_launcher(Config(), {**env, "ACCELERATE_USE_CPU": "True"}, on_gpu=True)  # auto is fp32 there


def test_fsdp_with_minirls_own_fsdp_is_honoured_with_a_note():
    notes = check_launcher(Config(fsdp=True), {"ACCELERATE_USE_FSDP": "true"}, on_gpu=True)
    assert len(notes) == 1 and "not read" in notes[0]


def test_the_shipped_accelerate_configs_pass():
    plain = {"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_USE_FSDP": "false"}
    assert check_launcher(Config(fsdp=True), plain, on_gpu=True) == []
    assert check_launcher(Config(), {}, on_gpu=False) == []


def test_accelerate_launch_with_an_fsdp_config_stops_before_loading(tmp_path):
    """The real launcher: an FSDP accelerate config without --fsdp true ends with the message and status 2."""
    config = tmp_path / "fsdp.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_machines: 1\n"
                      "num_processes: 1\nuse_cpu: true\nmixed_precision: 'no'\nfsdp_config:\n  fsdp_version: 2\n")
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    run = subprocess.run([*launcher, str(ROOT / "train.py"), "--max_steps", "1", "--output_dir",
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode != 0
    assert "error: the accelerate config asks for FSDP" in run.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing ran
