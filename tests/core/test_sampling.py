"""SamplingParams validation: each bad value is refused naming its field."""

from __future__ import annotations

import pytest

from pdserve.core.sampling import MAX_LOGIT_BIAS, MAX_LOGPROBS, SamplingParams, ValidationError


@pytest.mark.parametrize("field,bad", [
    ("logprobs", -1), ("logprobs", MAX_LOGPROBS + 1), ("prompt_logprobs", -1), ("prompt_logprobs", MAX_LOGPROBS + 1),
    ("presence_penalty", 2.5), ("presence_penalty", float("nan")), ("frequency_penalty", -2.01),
    ("frequency_penalty", float("inf")), ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("repetition_penalty", float("nan")), ("min_p", -0.1), ("min_p", 1.5), ("logit_bias", ((5, 101.0),)),
    ("logit_bias", ((-1, 1.0),)), ("logit_bias", ((3, float("nan")),)),
    ("logit_bias", tuple((t, 1.0) for t in range(MAX_LOGIT_BIAS + 1))),
])
def test_bad_values_name_their_field(field: str, bad: float) -> None:
    with pytest.raises(ValidationError) as info:
        SamplingParams(**{field: bad}).validate()
    assert info.value.field == field


@pytest.mark.parametrize("kw", [dict(logprobs=0), dict(logprobs=MAX_LOGPROBS), dict(prompt_logprobs=0), dict(presence_penalty=-2.0),
                                dict(frequency_penalty=2.0), dict(repetition_penalty=0.01), dict(min_p=1.0),
                                dict(logit_bias=((0, -100.0), (7, 100.0)))])
def test_edge_values_pass(kw: dict) -> None:
    SamplingParams(**kw).validate()


def test_logit_bias_ids_are_checked_against_the_vocabulary() -> None:
    p = SamplingParams(logit_bias=((5, 1.0), (99, -100.0)))
    p.validate(100)
    with pytest.raises(ValidationError) as info:
        p.validate(99)
    assert info.value.field == "logit_bias" and "99" in str(info.value)


def test_penalized() -> None:
    assert not SamplingParams().penalized and not SamplingParams(logprobs=3).penalized
    assert SamplingParams(presence_penalty=0.1).penalized and SamplingParams(repetition_penalty=1.1).penalized
    assert SamplingParams(frequency_penalty=-0.5).penalized
