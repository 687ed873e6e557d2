"""Admission control refuses past capacity with a retry hint from the drain rate."""

import pytest

from model_service.admission import Admission, DrainRate
from model_service.config import AdmissionConfig
from model_service.errors import Overloaded
from model_service.types import EngineStats


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_capacity_is_slots_plus_waiting_room():
    adm = Admission(AdmissionConfig(max_waiting=2))
    stats = EngineStats(max_running=3)
    for _ in range(5):
        adm.admit(stats)
    with pytest.raises(Overloaded) as e:
        adm.admit(stats)
    assert e.value.retry_after_s > 0
    assert adm.rejected_total == 1
    adm.release()
    adm.admit(stats)  # room again


def test_full_kv_cache_refuses_while_others_wait():
    adm = Admission(AdmissionConfig(max_waiting=10, kv_high_watermark=0.9))
    adm.admit(EngineStats(max_running=4, kv_cache_usage=0.95, waiting=0))
    with pytest.raises(Overloaded):
        adm.admit(EngineStats(max_running=4, kv_cache_usage=0.95, waiting=1))


def test_drain_rate_and_retry_hint_follow_completions():
    clock = Clock()
    rate = DrainRate(window_s=10, clock=clock)
    clock.t = 10
    for _ in range(20):
        rate.record()
    assert rate.rate() == pytest.approx(2.0)
    clock.t = 25  # all out of the window
    assert rate.rate() == 0
