"""A small JSON-schema subset for validating interactive input: enough for prompts, no dependency.

Supports type (one or a list), enum, const, required, properties, additionalProperties
(false), items, minimum/maximum, minLength/maxLength, minItems/maxItems.
"""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def _is(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False  # JSON booleans are not numbers
    return isinstance(value, _TYPES.get(name, (object,)))


def check(value: Any, schema: dict[str, Any], path: str = "$") -> str | None:
    """None when value matches schema, else the first problem with its JSON path."""
    if not schema:
        return None
    t = schema.get("type")
    if t is not None:
        names = t if isinstance(t, list) else [t]
        if not any(_is(value, n) for n in names):
            return f"{path}: expected {' or '.join(names)}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: must be one of {schema['enum']}"
    if "const" in schema and value != schema["const"]:
        return f"{path}: must be {schema['const']!r}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: must be >= {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: must be <= {schema['maximum']}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            return f"{path}: shorter than {schema['minLength']}"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{path}: longer than {schema['maxLength']}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            return f"{path}: fewer than {schema['minItems']} items"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"{path}: more than {schema['maxItems']} items"
        items = schema.get("items")
        if isinstance(items, dict):
            for i, v in enumerate(value):
                if (p := check(v, items, f"{path}[{i}]")) is not None:
                    return p
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                return f"{path}: missing required '{key}'"
        props = schema.get("properties", {})
        for key, v in value.items():
            if key in props:
                if (p := check(v, props[key], f"{path}.{key}")) is not None:
                    return p
            elif schema.get("additionalProperties") is False:
                return f"{path}: unexpected '{key}'"
    return None
