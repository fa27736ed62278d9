"""A small JSON-schema subset for validating interactive input: enough for prompts, no dependency.

Supports type (one or a list), enum, const, required, properties, additionalProperties
(false), items, minimum/maximum, minLength/maxLength, minItems/maxItems.
"""

from __future__ import annotations

from typing import Any, TypeGuard

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


# A tuple, not `int | float`: that expression builds a UnionType each time it runs, and the
# broker's and the worker's per-job checks call this.
_NUMBER = (int, float)


def is_number(value: Any) -> TypeGuard[int | float]:
    """A JSON number: an int or a float, not a bool."""
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


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
    if is_number(value):
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


# ---- job arguments against a task's schema (pydantic's JSON schema), as pydantic would judge them ----

_TRUE_FALSE = {"true", "false", "yes", "no", "on", "off", "1", "0", "t", "f", "y", "n"}
_INTEGER = (bool, int)


def check_arguments(args: list[Any], kwargs: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """None when a worker would accept these arguments for a task with this `inputSchema`, else the
    first problem naming the argument. Lax like pydantic's own validation (a numeric string passes
    for a number), so it never refuses what the worker would run; what it cannot judge, it passes."""
    props: dict[str, Any] = schema.get("properties") or {}
    names = list(props)
    if len(args) > len(names):
        return f"takes at most {len(names)} positional arguments, got {len(args)}"
    data = dict(zip(names, args, strict=False))
    for k, v in kwargs.items():
        if k in data:
            return f"got argument '{k}' twice"
        data[k] = v
    if schema.get("additionalProperties") is False:
        for k in data:
            if k not in props:
                return f"unexpected argument '{k}'; the task takes: {', '.join(names) or 'none'}"
    for k in schema.get("required") or []:
        if k not in data:
            return f"missing argument '{k}'"
    defs: dict[str, Any] = schema.get("$defs") or {}
    for k, v in data.items():
        if k in props:
            problem = _lax(v, props[k], defs, k, 0)
            if problem is not None:
                return problem
    return None


def _lax(value: Any, schema: Any, defs: dict[str, Any], path: str, depth: int) -> str | None:
    if not isinstance(schema, dict) or depth > 32:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return _lax(value, defs.get(ref.removeprefix("#/$defs/")), defs, path, depth + 1)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            problems = [_lax(value, o, defs, path, depth + 1) for o in options]
            if all(p is not None for p in problems):
                return problems[0]
    for sub in schema.get("allOf") or []:
        if (p := _lax(value, sub, defs, path, depth + 1)) is not None:
            return p
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: must be one of {schema['enum']}"
    if "const" in schema and value != schema["const"]:
        return f"{path}: must be {schema['const']!r}"
    t = schema.get("type")
    names = t if isinstance(t, list) else [t] if isinstance(t, str) else []
    if names and not any(_fits(value, n) for n in names):
        return f"{path}: expected {' or '.join(names)}, got {type(value).__name__} {_short(value)}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            if (p := _lax(item, schema["items"], defs, f"{path}[{i}]", depth + 1)) is not None:
                return p
    if isinstance(value, dict) and ("properties" in schema or "required" in schema):
        for k in schema.get("required") or []:
            if k not in value:
                return f"{path}: missing '{k}'"
        for k, v in value.items():
            sub = (schema.get("properties") or {}).get(k)
            if sub is not None and (p := _lax(v, sub, defs, f"{path}.{k}", depth + 1)) is not None:
                return p
    return None


def _fits(value: Any, name: str) -> bool:
    """pydantic v2's lax conversions from JSON for the primitive types."""
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool) or value in (0, 1) or (isinstance(value, str) and value.lower() in _TRUE_FALSE)
    if name in ("integer", "number"):
        if isinstance(value, _INTEGER):
            return True
        if isinstance(value, float):
            return name == "number" or value.is_integer()
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                return False
            return name == "number" or number.is_integer()
        return False
    if name == "string":
        return isinstance(value, str)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    return True


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
