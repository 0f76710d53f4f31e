"""scripts/gpu_check.sh's dry run: its checks on CPU at toy sizes, so that the first GPU it meets finds no bug in
the script itself. On CPU the same code paths run with gloo for NCCL and CPU bf16 autocast for CUDA's; the
`pytest` check (the device-branch tests, already in this suite) is left out here."""
import subprocess

from conftest import ROOT


def test_the_gpu_acceptance_script_passes_its_dry_run_on_cpu(tmp_path):
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--only",
                          "train,exact,fsdp,memory", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=900, cwd=ROOT)
    lines = [line for line in run.stdout.splitlines() if line.startswith(("PASS ", "FAIL "))]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    names = {line.split()[1].rstrip(":") for line in lines}
    for name in ["train/full/sdpa", "train/lora/sdpa", "exact/logprobs/fp32", "exact/logprobs/bf16",
                 "exact/decode", "fsdp/shard", "fsdp/resume", "fsdp/final_model", "memory"]:
        assert name in names, (name, lines)
    assert not [line for line in lines if line.startswith("FAIL")]
    assert run.stdout.strip().splitlines()[-1].endswith(f"{len(lines)} passed, 0 failed")
