"""Tensors the sessions build on worker threads are float32 whatever the process-wide default dtype (a
from_pretrained of a bf16 model on another thread sets it while it loads)."""
import torch

from minirl.sessions import Datum
from minirl.sessions.batches import collate
from minirl.sessions.types import tensor_of


def test_collate_and_tensor_of_are_float32_under_a_bf16_default():
    datums = [Datum([1, 2, 3], [4, 5], [-0.123456, -1.5], advantages=0.3),
              Datum([1, 2], [6, 7, 8], [-0.5, -0.25, -2.0], advantages=-0.7)]
    expected = collate(datums, "importance_sampling", 0, torch.device("cpu"))
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        batch = collate(datums, "importance_sampling", 0, torch.device("cpu"))
        lp = tensor_of([-0.123456, 1.0])
    finally:
        torch.set_default_dtype(old)
    assert lp.dtype == torch.float32 and lp[0].item() == torch.tensor(-0.123456).item()
    for name, v in expected.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            assert batch[name].dtype == torch.float32, name
            assert torch.equal(batch[name], v), name
