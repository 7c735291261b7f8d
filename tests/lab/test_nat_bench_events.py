"""How ``lab nat`` reads a volunteer's reservation events: when it held two reservations again."""

from p2pinfer.lab.nat_bench import _held_again, _merged_events


def ev(t: float, event: str, relay: str, passes: int = 0) -> dict:
    return {"t": t, "pass": passes, "event": event, "relay": relay, "detail": ""}


def test_two_reservations_again_is_the_first_event_after_the_kill_that_restores_two():
    events = [ev(1, "reserved", "a"), ev(2, "reserved", "b"), ev(10, "lost", "a", 9), ev(10.5, "reserved", "c", 9)]
    assert _held_again(events, after=9.0, wanted=2) == events[3]


def test_a_volunteer_that_never_gets_its_second_reservation_back_has_none():
    events = [ev(1, "reserved", "a"), ev(2, "reserved", "b"), ev(10, "lost", "a"), ev(20, "renewed", "b")]
    assert _held_again(events, after=9.0, wanted=2) is None


def test_a_volunteer_that_never_fell_short_after_the_kill_has_none():
    events = [ev(1, "reserved", "a"), ev(2, "reserved", "b"), ev(20, "renewed", "b")]
    assert _held_again(events, after=9.0, wanted=2) is None


def test_events_read_twice_count_once_in_time_order():
    first = [ev(1, "reserved", "a"), ev(2, "reserved", "b")]
    second = [ev(2, "reserved", "b"), ev(10, "lost", "a")]
    assert [e["t"] for e in _merged_events(second, first)] == [1, 2, 10]


def test_the_benchmarks_nodes_keep_no_checked_prompt():
    """An entry that kept the prompts it checked during the probation warm-up would serve
    every measured request itself, and the benchmark would measure no forward at all
    (what happened at c9cb747: 0 of 60 requests at the holder)."""
    from types import SimpleNamespace

    from p2pinfer.lab.nat_bench import _node_config

    config = _node_config(SimpleNamespace(ip="10.9.0.2"), 4001, (), 1.0, {})
    assert config.engine_options["check_cache"] is False
    assert config.listen == ("/ip4/10.9.0.2/tcp/4001",)
