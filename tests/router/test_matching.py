"""Path and topic matching: anchored, segment-wise, the most specific rule wins every time."""

from __future__ import annotations

import itertools

import pytest

from router.matching import PathMatch, match_path, match_topic, path_error, topic_matches

RULES = {
    "root": "/a",
    "any-b": "/a/{id}",
    "b-literal": "/a/b",
    "deep": "/a/{id}/c",
    "other": "/x/{p}/{q}",
}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/a", PathMatch("root", {}, "")),
        ("/a/", PathMatch("root", {}, "")),
        ("/a/7", PathMatch("any-b", {"id": "7"}, "")),
        ("/a/b", PathMatch("b-literal", {}, "")),
        ("/a/b/more/still", PathMatch("b-literal", {}, "/more/still")),
        ("/a/7/c", PathMatch("deep", {"id": "7"}, "")),
        ("/a/b/c", PathMatch("deep", {"id": "b"}, "")),  # as many literals as b-literal, and longer
        ("/a/7/d", PathMatch("any-b", {"id": "7"}, "/d")),
        ("//a//7//c//z", PathMatch("deep", {"id": "7"}, "/z")),
        ("/x/1/2/3", PathMatch("other", {"p": "1", "q": "2"}, "/3")),
        ("/x/1", None),
        ("/ab", None),
        ("/b/a", None),  # anchored: a rule path never matches in the middle
        ("/", None),
    ],
)
def test_the_most_specific_rule_wins(path: str, expected: PathMatch | None) -> None:
    assert match_path(RULES, path) == expected


def test_the_winner_does_not_depend_on_rule_order() -> None:
    rules = {"b": "/{x}/{y}", "a": "/{p}/{q}", "c": "/{x}"}
    for order in itertools.permutations(rules.items()):
        assert match_path(dict(order), "/1/2/3") == PathMatch("a", {"p": "1", "q": "2"}, "/3")


def test_more_literals_beat_more_segments() -> None:
    rules = {"long": "/{a}/{b}/{c}", "literal": "/v1"}
    assert match_path(rules, "/v1/x/y") == PathMatch("literal", {}, "/x/y")
    assert match_path(rules, "/v2/x/y") == PathMatch("long", {"a": "v2", "b": "x", "c": "y"}, "")


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/a/{id}", None),
        ("/", None),
        ("a", "must start with '/', got 'a'"),
        ("", "must start with '/', got ''"),
        ("/a/{}", "a variable must be a whole segment like {name}, got '{}'"),
        ("/a/{1x}", "a variable must be a whole segment like {name}, got '{1x}'"),
        ("/{a}/{a}", "variable {a} appears twice"),
    ],
)
def test_path_errors(path: str, error: str | None) -> None:
    assert path_error(path) == error


@pytest.mark.parametrize(
    ("topic_filter", "topic", "matches"),
    [
        ("sensors/temp", "sensors/temp", True),
        ("sensors/temp", "sensors/temp/1", False),
        ("sensors/+", "sensors/temp", True),
        ("sensors/+", "sensors", False),
        ("sensors/+", "sensors/", True),  # an empty level is a level
        ("sensors/+/1", "sensors/temp/1", True),
        ("sensors/#", "sensors", True),  # '#' covers the parent level too
        ("sensors/#", "sensors/a/b/c", True),
        ("sensors/#", "sensorsx", False),
        ("#", "anything/at/all", True),
        ("+/+", "a/b", True),
        ("+/+", "a", False),
        ("#", "$SYS/broker", False),  # wildcards at the first level skip $ topics
        ("+/broker", "$SYS/broker", False),
        ("$SYS/#", "$SYS/broker", True),
        ("/a", "/a", True),
        ("+/a", "/a", True),
    ],
)
def test_topic_matching_follows_mqtt(topic_filter: str, topic: str, matches: bool) -> None:
    assert topic_matches(topic_filter, topic) is matches


def test_matching_topic_rules_come_most_specific_first() -> None:
    rules = [
        ("all", "#"),
        ("exact", "plant/line1/temp"),
        ("level", "plant/+/temp"),
        ("under", "plant/#"),
        ("no", "x"),
    ]
    assert match_topic(rules, "plant/line1/temp") == ["exact", "level", "under", "all"]
    assert match_topic(list(reversed(rules)), "plant/line1/temp") == ["exact", "level", "under", "all"]
    assert match_topic(rules, "y") == ["all"]
