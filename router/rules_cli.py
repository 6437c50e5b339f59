"""``msgbus rules``: apply, list, show and delete the router's Rules and RuleEndpoints, and their counters.

Exit status: 0 ok; 1 not found, ambiguous or refused (an endpoint still in use); 2 an invalid file or bad
usage; 3 Redis unreachable.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
import yaml
from redis import Redis

from client.cli_common import EXIT_USAGE, fail, redact, redis_errors
from client.protocol import DEFAULT_REDIS_URL
from router import store
from router.loading import load_files, load_text
from router.rules import ENDPOINT, RULE, DocumentError, RouterObject
from router.validation import Catalog, ValidationError, rule_kind
from wire.redis_url import sync_client

EXIT_REFUSED = 1
EXIT_INVALID = 2

rules_app = typer.Typer(
    help="Rules and RuleEndpoints of the router (KubeEdge YAML), kept in the cloud site's Redis.\n\n"
    "Exit status: 0 ok; 1 not found or refused; 2 an invalid file or bad usage; 3 Redis unreachable.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

# The other commands' option, with its own help (the rules live in the cloud site's Redis).
RedisOption = Annotated[
    str, typer.Option("--redis", metavar="URL", envvar="MSGBUS_REDIS", help="Redis URL of the cloud site.")
]


class Kind(StrEnum):
    rule = "rule"
    endpoint = "endpoint"


class Output(StrEnum):
    yaml = "yaml"
    json = "json"


KindOption = Annotated[
    Kind | None, typer.Option("--kind", help="Which object, when a Rule and a RuleEndpoint share the name.")
]
KIND_NAMES = {Kind.rule: RULE, Kind.endpoint: ENDPOINT}


@rules_app.command("apply")
def apply_files(
    files: Annotated[
        list[Path],
        typer.Option(
            "-f", "--filename", metavar="FILE", help="KubeEdge YAML file, '-' for stdin (repeatable)."
        ),
    ],
    redis_url: RedisOption = DEFAULT_REDIS_URL,
) -> None:
    """Create or replace every object of the files, all together or none; print what each became."""
    try:
        objects = [obj for path in files for obj in _load(path)]
    except DocumentError as exc:
        fail(str(exc), EXIT_INVALID)
    if not objects:
        fail("the files hold no Rule or RuleEndpoint", EXIT_INVALID)
    with _store(redis_url) as redis:
        try:
            changes = store.apply(redis, objects)
        except ValidationError as exc:
            fail(str(exc), EXIT_INVALID)
    for change in changes:
        typer.echo(f"{change.obj.kind} {change.obj.name} {change.action.value}")


@rules_app.command("list")
def list_objects(redis_url: RedisOption = DEFAULT_REDIS_URL) -> None:
    """Print the rules, then the endpoints, as tables."""
    with _store(redis_url) as redis:
        catalog = store.read_catalog(redis)
    typer.echo(_table(["RULE", "KIND", "SOURCE", "TARGET"], _rule_rows(catalog)))
    typer.echo("")
    endpoint_rows = [
        [e.name, e.type.value, _resource(e.properties), str(len(catalog.rules_using(e.name)))]
        for e in sorted(catalog.endpoints.values(), key=lambda e: e.name)
    ]
    typer.echo(_table(["ENDPOINT", "TYPE", "PROPERTIES", "RULES"], endpoint_rows))


@rules_app.command("get")
def get_object(
    name: Annotated[str, typer.Argument(metavar="NAME")],
    kind: KindOption = None,
    output: Annotated[Output, typer.Option("-o", "--output", help="Format.")] = Output.yaml,
    redis_url: RedisOption = DEFAULT_REDIS_URL,
) -> None:
    """Print one object as a KubeEdge document (ready for `msgbus rules apply -f`)."""
    with _store(redis_url) as redis:
        obj = _found(lambda: store.get(redis, name, KIND_NAMES[kind] if kind else None))
    document = obj.to_document()
    if output is Output.json:
        typer.echo(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        typer.echo(yaml.safe_dump(document, sort_keys=False, allow_unicode=True), nl=False)


@rules_app.command("delete")
def delete_object(
    name: Annotated[str, typer.Argument(metavar="NAME")],
    kind: KindOption = None,
    redis_url: RedisOption = DEFAULT_REDIS_URL,
) -> None:
    """Delete one object; an endpoint that rules still use is refused (delete the rules first)."""
    with _store(redis_url) as redis:
        obj = _found(lambda: store.delete(redis, name, KIND_NAMES[kind] if kind else None))
    typer.echo(f"{obj.kind} {obj.name} deleted")


@rules_app.command("status")
def status(
    name: Annotated[str | None, typer.Argument(metavar="[NAME]", help="One rule [default: all].")] = None,
    redis_url: RedisOption = DEFAULT_REDIS_URL,
) -> None:
    """Print the rules' counters (messages delivered, failed, dropped for a newer one with the same key, and
    attempts tried again) and, for one rule, its latest errors."""
    with _store(redis_url) as redis:
        if name is not None:
            _found(lambda: store.get(redis, name, RULE))
            one = store.rule_status(redis, name)
            typer.echo(
                f"rule:       {one.name}\nsuccess:    {one.success}\nfail:       {one.fail}\n"
                f"superseded: {one.superseded}\nretries:    {one.retries}"
            )
            typer.echo("last errors:" if one.last_errors else "last errors: none")
            for error in one.last_errors:
                typer.echo(f"  {_time(error.at_s)}  {error.error}")
            return
        names = sorted(store.read_catalog(redis).rules)
        statuses = [store.rule_status(redis, rule) for rule in names]
    rows = [
        [
            s.name,
            str(s.success),
            str(s.fail),
            str(s.superseded),
            str(s.retries),
            s.last_errors[0].error if s.last_errors else "-",
        ]
        for s in statuses
    ]
    typer.echo(_table(["RULE", "SUCCESS", "FAIL", "SUPERSEDED", "RETRIES", "LAST ERROR"], rows))


def _load(path: Path) -> list[RouterObject]:
    if str(path) == "-":
        return load_text(sys.stdin.read(), "<stdin>")
    return load_files([path])


def _found(action: Callable[[], RouterObject]) -> RouterObject:
    try:
        return action()
    except store.StoreError as exc:
        fail(str(exc), EXIT_REFUSED)


def _rule_rows(catalog: Catalog) -> list[list[str]]:
    rows = []
    for rule in sorted(catalog.rules.values(), key=lambda rule: rule.name):
        rows.append(
            [
                rule.name,
                rule_kind(rule, catalog.endpoints),
                f"{rule.source} {_resource(rule.source_resource)}",
                f"{rule.target} {_resource(rule.target_resource)}",
            ]
        )
    return rows


def _resource(resource: Mapping[str, str]) -> str:
    return " ".join(f"{key}={value}" for key, value in resource.items()) or "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return f"no {header[0].lower()}s"
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def _time(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).isoformat(timespec="seconds")


@contextmanager
def _store(redis_url: str) -> Iterator[Redis]:
    try:
        redis = sync_client(redis_url)
    except ValueError as exc:
        fail(f"invalid Redis URL {redact(redis_url)!r}: {exc}", EXIT_USAGE)
    with redis, redis_errors(redis_url):
        try:
            yield redis
        except store.StoreError as exc:
            fail(str(exc), EXIT_REFUSED)
