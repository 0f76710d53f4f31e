"""SampledTemperatures: samples whose log-probs are all 0.0 are found by their tokens, and a datum it does not
know raises (naming loss_fn_config's temperature) where the temperature is ambiguous or a record was evicted."""
import pytest
import torch

from minirl.sessions import Datum
from minirl.sessions.sampling import SampledTemperatures


def datum(prompt, tokens, logprobs):
    return Datum(prompt, tokens, logprobs, advantages=1.0)


def test_all_zero_logprobs_are_recorded_by_their_tokens():
    st = SampledTemperatures()
    st.record(torch.tensor([5, 2]), torch.tensor([0.0, 0.0]), 0.02)
    st.record(torch.tensor([7, 8, 9]), torch.tensor([-0.5, -1.0, -2.0]), 1.0)  # another sample, another T
    assert st.of([datum([1, 3, 4], [5, 2], [0.0, 0.0])]) == 0.02
    assert st.of([datum([1, 3, 4], [7, 8, 9], [-0.5, -1.0, -2.0])]) == 1.0
    with pytest.raises(ValueError, match="temperatures"):
        st.of([datum([1], [5, 2], [0.0, 0.0]), datum([1], [7, 8, 9], [-0.5, -1.0, -2.0])])


def test_unknown_datum_raises_when_ambiguous_or_evicted():
    st = SampledTemperatures(capacity=4)
    st.record(torch.tensor([5, 6, 7]), torch.tensor([-1.25, -0.5, -2.0]), 1.0)
    assert st.of([datum([1], [5, 6, 7], [-1.25, -0.5, -2.0])]) == 1.0
    assert st.of([datum([1], [9, 9], [-0.25, -0.75])]) == 1.0  # unknown, one T recorded, nothing evicted
    for i in range(4):
        st.record(torch.tensor([i, 3]), torch.tensor([-0.1 - i, -0.2]), 0.5)
    with pytest.raises(ValueError, match="loss_fn_config=\\{'temperature': T\\}"):
        st.of([datum([1], [5, 6, 7], [-1.25, -0.5, -2.0])])  # evicted: not silently 0.5
    assert st.of([datum([1], [0, 3], [-0.1, -0.2])]) == 0.5  # still known
    fresh = SampledTemperatures()
    fresh.record(torch.tensor([5]), torch.tensor([-1.0]), 1.0)
    fresh.record(torch.tensor([6]), torch.tensor([-1.0]), 0.5)
    with pytest.raises(ValueError, match="loss_fn_config"):
        fresh.of([datum([1], [9, 9], [-0.25, -0.75])])
    assert SampledTemperatures().of([datum([1], [9], [-0.25])]) == 1.0  # nothing recorded: T=1
