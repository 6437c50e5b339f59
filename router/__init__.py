"""The rules router: KubeEdge Rules and RuleEndpoints carried onto the bus.

``rules`` (the model, one document at a time), ``loading`` (YAML files), ``validation`` (checks across
objects), ``matching`` (REST paths and MQTT topics to rules, pure), ``keys`` and ``store`` (the catalog and
the counters in the cloud site's Redis).

The routing: ``routes`` (the catalog as the routers look things up in it), ``protocol`` (what the routers
send each other over the bus), ``bus`` and ``commands`` (how they use the bus they run in), ``outcomes``
(counting each message once), ``cloud`` and ``edge`` (the two roles), ``mqtt_bridge`` (the edge's broker),
``http_common`` (their HTTP doors and calls), ``nodes`` (node names to twins), ``config`` and ``runtime``
(starting them inside msgbusd).
"""

from router.loading import load_files, load_text
from router.matching import PathMatch, match_path, match_topic, topic_matches
from router.rules import DocumentError, EndpointType, RouterObject, Rule, RuleEndpoint, parse_document
from router.validation import Catalog, ValidationError, validate

__all__ = [
    "Catalog",
    "DocumentError",
    "EndpointType",
    "PathMatch",
    "RouterObject",
    "Rule",
    "RuleEndpoint",
    "ValidationError",
    "load_files",
    "load_text",
    "match_path",
    "match_topic",
    "parse_document",
    "topic_matches",
    "validate",
]
