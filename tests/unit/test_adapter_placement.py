"""The rules of on-demand adapter placement (``inference._servers.placement``), on stand-in replicas."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from inference._servers.placement import AdapterPlacement
from inference.exceptions import ConfigurationError
from inference.vllm_provider import VLLMProvider


@dataclass(eq=False)
class Stub:
    base_url: str
    in_flight: int = 0
    down_until: float = 0.0


def three() -> list[Stub]:
    return [Stub("http://a/v1"), Stub("http://b/v1"), Stub("http://c/v1")]


def test_a_new_adapter_goes_to_the_replica_with_the_fewest_then_the_least_busy() -> None:
    a, b, c = replicas = three()
    placement = AdapterPlacement(replicas, capacity=None, spread_after=4)
    assert placement.ranked_for_load()[0] is a  # all equal: base-URL order
    placement.placed(a, "x")
    b.in_flight = 3
    assert placement.ranked_for_load()[0] is c  # fewest adapters, then least busy
    placement.placed(c, "y")
    assert placement.ranked_for_load()[0] is b
    b.down_until = time.monotonic() + 60
    assert placement.ranked_for_load()[-1] is b  # a replica that is down comes last


def test_a_full_replica_is_avoided_and_then_evicts_its_least_recently_used_idle_adapter() -> None:
    a, b = replicas = three()[:2]
    placement = AdapterPlacement(replicas, capacity=2, spread_after=4)
    for name in ("x", "y"):
        placement.placed(a, name)
    assert placement.ranked_for_load()[0] is b
    placement.started(a, "x")  # x is used now, and runs
    assert placement.to_evict(a) == "y"
    placement.started(a, "y")
    with pytest.raises(LookupError):
        placement.to_evict(a)  # every adapter there has a request in flight
    placement.finished(a, "x")
    assert placement.to_evict(a) == "x"
    assert placement.to_evict(b) is None  # room


def test_requests_go_to_the_holders_until_every_holder_is_busy_or_down() -> None:
    a, b, c = replicas = three()
    placement = AdapterPlacement(replicas, capacity=None, spread_after=2)
    placement.placed(b, "x")
    assert placement.order_for("x", replicas)[0] is b
    b.in_flight = 2  # busy: the least busy other replica goes first (and gets it loaded)
    a.in_flight, c.in_flight = 1, 0
    assert placement.order_for("x", [c, a, b])[0] is c
    b.in_flight = 0
    b.down_until = time.monotonic() + 60  # down: the same
    order = placement.order_for("x", [c, a, b])
    assert order[0] is c and order[-1] is b
    assert placement.order_for("unplaced", [c, a, b])[0] is c  # no holder yet: the least busy


def test_removing_an_adapter_forgets_it_everywhere_or_on_one_replica() -> None:
    a, b, _ = replicas = three()
    placement = AdapterPlacement(replicas, capacity=None, spread_after=2)
    placement.placed(a, "x")
    placement.placed(b, "x")
    placement.removed("x", a)
    assert placement.holders("x") == [b]
    placement.removed("x")
    assert placement.holders("x") == []


def test_the_provider_takes_the_placement_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ADAPTER_PLACEMENT", "on-demand")
    monkeypatch.setenv("VLLM_MAX_LORAS", "3")
    provider = VLLMProvider(base_url="http://a:8000/v1,http://b:8000/v1", spread_after=5)
    assert provider.placement is not None
    assert (provider.placement.capacity, provider.placement.spread_after) == (3, 5)
    assert VLLMProvider(base_url="http://a:8000/v1", adapter_placement="all").placement is None
    with pytest.raises(ConfigurationError, match="adapter_placement"):
        VLLMProvider(base_url="http://a:8000/v1", adapter_placement="sometimes")
