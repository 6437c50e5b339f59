"""Every metric the daemon exports is documented in docs/operations.md with its type and every value of its
labels, and the labels cannot grow with the traffic."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from msgbusd.reports.metrics import ERROR_CAUSES, MESSAGE_EVENTS, SEND_PATHS, TWIN_CACHE_COUNTS, Metrics
from router.mqtt_bridge import BridgeCounters
from twin_resolver.cache import CacheStats
from wire import keys

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
ROW = re.compile(r"^\| `(msgbus_\w+)` \| (\w+) \|\s*(.*?)\s*\| [^|]+ \|$", re.MULTILINE)
QUEUES = (*keys.SYSTEM_QUEUES, keys.BACKLOG, keys.DEAD_LETTER, keys.REPLIES)
# Labels that would make a series per message or per peer.
UNBOUNDED = {"uid", "ret", "twin", "src", "dst", "cmd", "peer"}
# The one metric with a series per peer: only the peers whose clock was found off have one, as many as the
# clocks an operator has to set, whatever the traffic. Its label's values are twin ids.
PER_PEER_CLOCK = "msgbus_peer_clock_offset_seconds"
TWIN_IDS = "a twin id"


def documented() -> dict[str, tuple[str, dict[str, set[str]]]]:
    """metric -> (type, label -> its values), from the table in docs/operations.md."""
    found = {}
    for name, kind, labels in ROW.findall(OPERATIONS.read_text()):
        values: dict[str, set[str]] = {}
        if labels:
            label, _, listed = labels.partition(":")
            # The values are the backticked words; what is in parentheses explains them.
            words = set(re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", listed)))
            values[label.strip(" `")] = {TWIN_IDS} if listed.strip().startswith(TWIN_IDS) else words
        found[name] = (kind, values)
    return found


def exported() -> dict[str, tuple[str, dict[str, set[str]]]]:
    """metric -> (type, label -> the values seen), with every label value used once."""
    metrics = Metrics()
    for event in MESSAGE_EVENTS:
        metrics.message(event)
    for cause in ERROR_CAUSES:
        metrics.error(cause)
    for path in SEND_PATHS:
        metrics.observe_send(path, 0.01)
    metrics.observe_round_trip(0.1)
    metrics.set_queue_lengths(dict.fromkeys(QUEUES, 1))
    metrics.watch_twin_cache(CacheStats())
    metrics.watch_mqtt_bridge(BridgeCounters())
    metrics.set_peer_clock_offset(2, 600.0, 1)
    body, _ = metrics.render()
    found: dict[str, tuple[str, dict[str, set[str]]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        values: dict[str, set[str]] = {}
        for sample in family.samples:
            assert not sample.name.endswith("_created"), sample.name
            for label, value in sample.labels.items():
                if label != "le":
                    values.setdefault(label, set()).add(TWIN_IDS if family.name == PER_PEER_CLOCK else value)
        found[name] = (family.type, values)
    return found


def test_the_documentation_lists_every_metric_with_its_type_and_label_values() -> None:
    assert documented() == exported()


def test_label_values_come_from_fixed_lists() -> None:
    metrics = exported()
    assert metrics.pop(PER_PEER_CLOCK)[1] == {"peer": {TWIN_IDS}}
    assert not {label for _, labels in metrics.values() for label in labels} & UNBOUNDED
    assert metrics["msgbus_messages_total"][1] == {"event": set(MESSAGE_EVENTS)}
    assert metrics["msgbus_errors_total"][1] == {"cause": set(ERROR_CAUSES)}
    assert metrics["msgbus_send_seconds"][1] == {"path": set(SEND_PATHS)}
    assert metrics["msgbus_queue_length"][1] == {"queue": set(QUEUES)}
    assert metrics["msgbus_twin_cache_total"][1] == {"what": set(TWIN_CACHE_COUNTS)}
    bridge = {field for field in BridgeCounters.__dataclass_fields__}
    assert metrics["msgbus_router_mqtt_total"][1] == {"what": bridge}


def test_the_table_is_read() -> None:
    kind, labels = documented()["msgbus_send_seconds"]
    assert (kind, labels) == ("histogram", {"path": {"remote", "reply", "link"}})
