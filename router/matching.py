"""Which rule a REST path or an MQTT topic belongs to. Pure functions, no I/O.

REST paths are matched anchored and segment by segment: a rule path ``/a/{id}`` matches ``/a/7`` and
``/a/7/more`` (suffix ``/more``), never ``/x/a/7`` nor ``/ab/7``. ``{name}`` stands for exactly one
segment. When several rules match, the most specific wins, always the same one: more literal segments
first, then more segments, then the smaller rule name. Empty segments are ignored (``/a//b/`` is
``/a/b``), so a suffix never carries a doubled or trailing slash.

MQTT topics follow the MQTT 3.1.1 filter rules: ``+`` is one level, ``#`` (last level only) is any number
of levels including none, and wildcards at the first level do not match topics starting with ``$``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PathPattern:
    """A rule path split into segments; a segment ``{x}`` is a variable named ``x``."""

    segments: tuple[str, ...]

    @property
    def literal_count(self) -> int:
        return sum(1 for segment in self.segments if not _is_variable(segment))

    @property
    def shape(self) -> tuple[str | None, ...]:
        """The segments with every variable as None: two paths of the same shape match the same requests."""
        return tuple(None if _is_variable(segment) else segment for segment in self.segments)


@dataclass(frozen=True)
class PathMatch:
    """The winning rule for a request path, its variables, and the part of the path beyond the rule's."""

    rule: str
    params: Mapping[str, str]
    suffix: str  # "" or "/seg/seg": to append to the target topic or path


def path_error(path: str) -> str | None:
    """Why ``path`` cannot be a rule path, or None when it can."""
    if not path.startswith("/"):
        return f"must start with '/', got {path!r}"
    names: set[str] = set()
    for segment in split_path(path):
        if "{" in segment or "}" in segment:
            if not _is_variable(segment) or not segment[1:-1].isidentifier():
                return f"a variable must be a whole segment like {{name}}, got {segment!r}"
            if segment[1:-1] in names:
                return f"variable {segment} appears twice"
            names.add(segment[1:-1])
    return None


def compile_path(path: str) -> PathPattern:
    """The pattern of a rule path (check it first with ``path_error``)."""
    return PathPattern(tuple(split_path(path)))


def split_path(path: str) -> list[str]:
    return [segment for segment in path.split("/") if segment]


def match_path(rule_paths: Mapping[str, str], request_path: str) -> PathMatch | None:
    """The rule (name -> rule path) that ``request_path`` belongs to, or None when no rule matches."""
    request = split_path(request_path)
    best: tuple[tuple[int, int, str], PathMatch] | None = None
    for name, rule_path in rule_paths.items():
        pattern = compile_path(rule_path)
        params = _match_prefix(pattern.segments, request)
        if params is None:
            continue
        rank = (-pattern.literal_count, -len(pattern.segments), name)
        if best is None or rank < best[0]:
            suffix = "".join(f"/{segment}" for segment in request[len(pattern.segments) :])
            best = (rank, PathMatch(name, params, suffix))
    return None if best is None else best[1]


def _match_prefix(pattern: tuple[str, ...], request: list[str]) -> dict[str, str] | None:
    if len(pattern) > len(request):
        return None
    params: dict[str, str] = {}
    for expected, actual in zip(pattern, request, strict=False):
        if _is_variable(expected):
            params[expected[1:-1]] = actual
        elif expected != actual:
            return None
    return params


def _is_variable(segment: str) -> bool:
    return len(segment) > 2 and segment.startswith("{") and segment.endswith("}")


def topic_filter_error(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a valid MQTT topic filter, or None when it is."""
    if not topic_filter:
        return "must not be empty"
    levels = topic_filter.split("/")
    for position, level in enumerate(levels):
        if "#" in level and (level != "#" or position != len(levels) - 1):
            return f"'#' must be a whole level and the last one, got {topic_filter!r}"
        if "+" in level and level != "+":
            return f"'+' must be a whole level, got {topic_filter!r}"
    return None


def topic_name_error(topic: str) -> str | None:
    """Why ``topic`` cannot be published to (empty, or holding a wildcard), or None when it can."""
    if not topic:
        return "must not be empty"
    if "+" in topic or "#" in topic:
        return f"a topic to publish to cannot hold the wildcards '+' or '#', got {topic!r}"
    return None


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether the MQTT ``topic`` matches ``topic_filter`` (a valid filter, see ``topic_filter_error``)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    wanted = topic_filter.split("/")
    levels = topic.split("/")
    for position, level in enumerate(wanted):
        if level == "#":
            return True
        if position >= len(levels) or (level != "+" and level != levels[position]):
            return False
    return len(levels) == len(wanted)


def match_topic(rule_filters: Iterable[tuple[str, str]], topic: str) -> list[str]:
    """Names of the rules (name, topic filter) that ``topic`` matches, the most specific first.

    Every matching rule gets the message (MQTT delivers to every matching subscription); the order is the
    one a single-route caller should pick from: fewer wildcards first, then the longer filter, then name.
    """
    matching = [
        (name, rule_filter) for name, rule_filter in rule_filters if topic_matches(rule_filter, topic)
    ]
    return [name for name, _ in sorted(matching, key=lambda item: _topic_rank(item[0], item[1]))]


def _topic_rank(name: str, topic_filter: str) -> tuple[int, int, int, str]:
    levels = topic_filter.split("/")
    return (levels.count("#"), levels.count("+"), -len(levels), name)
