"""Model profiles against their published parameter counts (torchvision, Hugging Face)."""

from __future__ import annotations

import pytest

from commflow.sched import ScheduleError
from commflow.sched.profiles import PROFILES, parameters, profile


@pytest.mark.parametrize(("name", "count"), [
    ("resnet50", 25_557_032),  # torchvision resnet50
    ("vgg16", 138_357_544),  # torchvision vgg16
    ("bert-large", 336_226_108),  # BertForPreTraining, bert-large-uncased
    ("gpt2", 124_439_808),  # GPT2LMHeadModel "gpt2"
    ("gpt2-xl", 1_557_611_200),  # GPT2LMHeadModel "gpt2-xl"
])
def test_parameters_match_the_published_models(name, count):
    assert parameters(name) == count
    assert profile(name).grad_bytes == 4 * count


def test_times_follow_flops_over_the_achieved_rate():
    work = profile("resnet50", batch=1, efficiency=1.0)
    # 4.09 GMACs per 224x224 image (torchvision): 8.2 GFLOP forward on 125 TFLOP/s
    assert work.forward_time == pytest.approx(2 * 4.089e9 / 125e12, rel=0.01)
    assert work.backward_time == pytest.approx(2 * work.forward_time)
    assert profile("resnet50", batch=64).forward_time == pytest.approx(
        64 * work.forward_time / 0.25)
    assert set(PROFILES) == {"resnet50", "vgg16", "bert-large", "gpt2", "gpt2-xl"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "alexnet"}, "unknown profile 'alexnet'"),
    ({"name": "vgg16", "batch": 0}, "batch and seq must be >= 1"),
    ({"name": "gpt2", "efficiency": 1.5}, "efficiency in"),
])
def test_bad_profiles_are_refused(kwargs, message):
    with pytest.raises(ScheduleError, match=message):
        profile(**kwargs)
