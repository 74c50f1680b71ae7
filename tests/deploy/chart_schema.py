"""The policy schema as the chart's values.schema.json carries it (``policies.config``).

policies/schema.json is JSON Schema 2020-12 (``$defs``, ``unevaluatedProperties``); Helm
validates values against draft 7, and a ``$ref`` inside values.schema.json resolves against
that file's root. So the chart carries a draft-7 rendering of the same schema: every
``$ref`` inlined, and each entry's ``unevaluatedProperties: false`` over the shared limits
spelled out as its full ``properties`` with ``additionalProperties: false``.
tests/deploy/test_chart.py checks that the chart's copy is exactly this rendering;
``python -m tests.deploy.chart_schema`` writes it into values.schema.json.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
POLICY_SCHEMA = ROOT / "policies" / "schema.json"
VALUES_SCHEMA = ROOT / "helm" / "floodwall" / "values.schema.json"


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is not None:
        target = _inline(defs[ref.removeprefix("#/$defs/")], defs)
        merged: dict[str, Any] = copy.deepcopy(target)
        for key, value in node.items():
            if key == "properties":
                merged["properties"] = {**merged.get("properties", {}),
                                        **_inline(value, defs)}
            elif key == "required":
                merged["required"] = sorted({*merged.get("required", []), *value})
            else:
                merged[key] = _inline(value, defs)
        node = merged
    else:
        node = {key: _inline(value, defs) for key, value in node.items()}
    if node.pop("unevaluatedProperties", None) is False:
        node["additionalProperties"] = False
    node.pop("format", None)  # "regex" means Python's here; draft 7 validators read ECMA
    return node


def policies_config_schema() -> dict[str, Any]:
    """policies/schema.json as draft 7, self-contained: the chart's ``policies.config``."""
    source = json.loads(POLICY_SCHEMA.read_text())
    defs = source.pop("$defs")
    for key in ("$schema", "$id", "title"):
        source.pop(key)
    schema: dict[str, Any] = _inline(source, defs)
    schema["description"] = ("The policies file as YAML (version 1): policies/schema.json, "
                             "so `helm template` and `helm lint` refuse a bad policy. "
                             + schema["description"])
    return schema


def write() -> None:
    values = json.loads(VALUES_SCHEMA.read_text())
    values["properties"]["policies"]["properties"]["config"] = policies_config_schema()
    VALUES_SCHEMA.write_text(json.dumps(values, indent=2) + "\n")


if __name__ == "__main__":
    write()
