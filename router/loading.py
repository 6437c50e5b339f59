"""Reading KubeEdge YAML files (one or many ``---`` documents) into Rules and RuleEndpoints.

Documents are named ``FILE, document N`` (N counts from 1, empty documents included) in every error, so
that a mistake in a long file is found at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from router.rules import DocumentError, RouterObject, parse_document

if TYPE_CHECKING:
    import yaml


def load_text(text: str, source: str) -> list[RouterObject]:
    """The objects of the YAML ``text``; ``source`` names it in errors (a file name, or ``<stdin>``)."""
    # Imported here: msgbusd loads the router on every start, and reads rules files seldom.
    import yaml

    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise DocumentError(source, "", f"invalid YAML: {_one_line(exc)}") from None
    objects: list[RouterObject] = []
    for index, document in enumerate(documents, start=1):
        if document is None:  # an empty document between two "---"
            continue
        objects.append(parse_document(document, f"{source}, document {index}"))
    return objects


def load_files(paths: Iterable[Path]) -> list[RouterObject]:
    """The objects of every file, in order; an unreadable file is a DocumentError too."""
    objects: list[RouterObject] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DocumentError(str(path), "", f"cannot read: {exc}") from None
        objects.extend(load_text(text, str(path)))
    return objects


def _one_line(exc: yaml.YAMLError) -> str:
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return " ".join(str(exc).split())
