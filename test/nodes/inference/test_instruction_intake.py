"""The instruction deduplication the inference node applies to its two subscriptions."""

import pytest

from oxygen_ros.nodes.common.deduplicator import Deduplicator
from oxygen_ros.nodes.inference.instruction_intake import HISTORY, message_key


def info(source_ns: int, sequence: int) -> dict:
    return {
        "source_timestamp": source_ns,
        "received_timestamp": source_ns + 1000,
        "publication_sequence_number": sequence,
        "reception_sequence_number": sequence,
    }


def test_one_publication_through_both_subscriptions_counts_once() -> None:
    seen = Deduplicator(HISTORY)
    latched = message_key(info(100, 1), "pick the cup")
    assert seen.accept(latched) is True
    assert seen.accept(message_key(info(100, 1), "pick the cup")) is False  # the other route
    # Positive controls: a later publication of the same text, and another publisher's
    # message at the same instant, are new.
    assert seen.accept(message_key(info(200, 2), "pick the cup")) is True
    assert seen.accept(message_key(info(100, 1), "open the drawer")) is True


def test_only_the_last_history_keys_are_remembered() -> None:
    seen = Deduplicator(history=3)
    keys = [message_key(info(t, t), "x") for t in range(5)]
    assert all(seen.accept(k) for k in keys)
    assert not seen.accept(keys[-1]) and not seen.accept(keys[2])
    assert seen.accept(keys[0])  # forgotten after three newer keys
    with pytest.raises(ValueError, match="history"):
        Deduplicator(history=0)


def test_missing_info_fields_read_as_zero() -> None:
    assert message_key({}, "a") == (0, 0, "a")
