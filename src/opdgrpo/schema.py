"""The configuration's JSON Schemas (``src/opdgrpo/schemas/*.schema.yaml``), and errors that name the key.

One schema per config group (model, domain, method, study, train) tied together by ``config.schema.yaml``, as
Snakemake workflows validate their config; checked with ``jsonschema``. Each schema holds the allowed values of its
keys (the one place they are defined: code that needs them asks :func:`allowed`). A violation becomes a
:class:`~opdgrpo.config.ConfigError` in the project's words: the dotted key, what it must be, the value it has, the
key's ``description`` as a hint, and for an unknown key the closest known ones.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
from pathlib import Path
from typing import Any, Iterable, Mapping

import jsonschema
import yaml
from referencing import Registry, Resource

SCHEMAS = Path(__file__).parent / "schemas"

#: Keys renamed with their meaning unchanged: a composed config's old dotted key -> (its new name, what the key is).
#: Wherever the old key can still be written (a Hydra override, a conf file, a run config written by hand) it is an
#: error that names the new one, and a job's identity (what the rules hash and pass; the job reads it back by the new
#: name) keeps the old name (:func:`opdgrpo.job_identity.canonical_names`): a rename is one line here. A
#: ``methods.<m>`` key is also its runs' ``method`` key (:func:`run_config_key`).
RENAMED_KEYS: dict[str, tuple[str, str]] = {
    "methods.opd.top_k": ("kl_top_k", "the support of OPD's reverse KL; sampling's top_k is `train.eval.top_k`"),
}


class SchemaError(ValueError):
    """A config value the schema rejects; the message names the key (``config.ConfigError`` derives from it)."""


@functools.lru_cache(maxsize=None)
def _registry() -> Registry:
    resources = []
    for path in sorted(SCHEMAS.glob("*.schema.yaml")):
        contents = yaml.safe_load(path.read_text())
        resources.append((path.name, Resource.from_contents(contents)))
    return Registry().with_resources(resources)


@functools.lru_cache(maxsize=None)
def load(name: str) -> dict[str, Any]:
    """The schema ``<name>.schema.yaml``."""
    return _registry().contents(f"{name}.schema.yaml")


def _validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=_registry())


def validate(data: Any, name: str, where: str = "", fix: str = "fix it in conf/ or pass `{key}=...`") -> None:
    """Raise :class:`SchemaError` for the first violation of schema ``name`` in ``data`` (found at ``where``)."""
    check(data, load(name), where, fix)


def check(data: Any, schema: dict[str, Any], where: str = "", fix: str = "fix it in conf/ or pass `{key}=...`") -> None:
    """Like :func:`validate`, with a schema given as a mapping (e.g. a study's own)."""
    _refuse_non_finite(data, where, fix)
    errors = list(_validator(schema).iter_errors(data))
    if errors:
        raise SchemaError(message(_deepest(errors), where, fix))


def _refuse_non_finite(data: Any, where: str, fix: str, path: tuple[Any, ...] = ()) -> None:
    """NaN and infinities are refused for every key, before the schema: JSON Schema's bounds compare with ``<``/``>``,
    which a NaN passes (``nan >= 0`` and ``nan <= 1`` are both false, so neither bound reports it), and no setting of
    this pipeline means "infinite" (null means "none" where a key allows it). One check here holds for every numeric
    key, present and future, instead of a ``not: nan`` in each schema."""
    if isinstance(data, float) and not math.isfinite(data):
        key = _dotted(where, path)
        raise SchemaError(f"config key `{key}` must be a finite number, got {data!r}; {fix.format(key=key)}")
    if isinstance(data, dict):
        for name, value in data.items():
            _refuse_non_finite(value, where, fix, (*path, name))
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            _refuse_non_finite(value, where, fix, (*path, i))


def _deepest(errors: list[jsonschema.ValidationError]) -> jsonschema.ValidationError:
    """The most telling error. An ``unevaluatedProperties`` error whose keys are all known is an echo of a failing
    ``allOf`` branch (its keys count as unevaluated), so the branch's own error is taken; inside ``anyOf``, the
    alternative that is not a mismatch of type with the value (``null`` against a string) is taken."""
    real = [e for e in errors if not _echo(e)] or errors
    best = jsonschema.exceptions.best_match(real)
    while best.context:
        context = [e for e in best.context if not _echo(e)] or list(best.context)
        best = min(context, key=lambda e: (e.validator == "type", -len(e.absolute_path)))
    return best


def _echo(error: jsonschema.ValidationError) -> bool:
    if error.validator not in ("unevaluatedProperties", "additionalProperties") or not isinstance(error.instance, dict):
        return False
    return not set(error.instance) - _known_properties(error.schema)


def _dotted(where: str, path: Iterable[Any]) -> str:
    """``train.eval.k``; list items as ``seeds[1]``."""
    out = where
    for part in path:
        out = f"{out}[{part}]" if isinstance(part, int) else (f"{out}.{part}" if out else str(part))
    return out


def message(error: jsonschema.ValidationError, where: str = "", fix: str = "fix it in conf/ or pass `{key}=...`") -> str:
    key = _dotted(where, error.absolute_path)
    hint = error.schema.get("description") if isinstance(error.schema, dict) else None
    kind, value = error.validator, error.instance
    if kind == "required":
        missing = next(p for p in error.validator_value if p not in (value or {}))
        full = _dotted(key, [missing])
        sub = _subschema(error.schema, missing)
        text = f"missing config key `{full}`" + (f" ({sub['description']})" if sub.get("description") else "")
        return f"{text}; add it to conf/ or pass `{full}=...`"
    if kind in ("additionalProperties", "unevaluatedProperties"):
        known = sorted(_known_properties(error.schema))
        extra = sorted(set(value) - set(known)) if isinstance(value, dict) else []
        names = ", ".join(f"`{_dotted(key, [e])}`" for e in extra) or "keys"
        close = difflib.get_close_matches(extra[0], known, n=3) if extra else []
        return (f"unknown config key {names}: nothing reads it" + (f"; did you mean {close}?" if close else "")
                + (f" (known keys: {known})" if not close and known else ""))
    bounds = error.schema if isinstance(error.schema, dict) else {}
    if kind in ("minimum", "maximum") and "minimum" in bounds and "maximum" in bounds:
        kind, error.validator_value = "range", (bounds["minimum"], bounds["maximum"])
    what = {
        "range": lambda: f"in [{error.validator_value[0]}, {error.validator_value[1]}]",
        "enum": lambda: f"one of {error.validator_value}",
        "const": lambda: f"{error.validator_value!r}",
        "type": lambda: _types(error.validator_value),
        "minimum": lambda: f">= {error.validator_value}",
        "exclusiveMinimum": lambda: f"> {error.validator_value}",
        "maximum": lambda: f"<= {error.validator_value}",
        "exclusiveMaximum": lambda: f"< {error.validator_value}",
        "minItems": lambda: f"a list of at least {error.validator_value} item(s)",
        "maxItems": lambda: f"a list of at most {error.validator_value} item(s)",
        "minProperties": lambda: "a non-empty mapping",
        "minLength": lambda: "a non-empty string",
        "uniqueItems": lambda: "a list without repeats",
    }.get(kind, lambda: error.message)()
    text = f"config key `{key}` must be {what}, got {value!r}"
    if hint:
        text += f" ({hint})"
    return f"{text}; {fix.format(key=key)}"


def _types(names: str | list[str]) -> str:
    words = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
             "array": "a list", "object": "a mapping", "null": "null"}
    names = [names] if isinstance(names, str) else names
    return " or ".join(words.get(n, n) for n in names)


def _resolved(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """``schema`` and the schemas its ``$ref`` and ``allOf`` bring in (every ``$ref`` in schemas/ names its file)."""
    out, todo, resolver = [], [schema], _registry().resolver()
    while todo:
        s = todo.pop()
        if not isinstance(s, dict):
            continue
        out.append(s)
        if "$ref" in s:
            todo.append(resolver.lookup(s["$ref"]).contents)
        todo.extend(s.get("allOf", []))
    return out


def _known_properties(schema: dict[str, Any]) -> set[str]:
    return {p for s in _resolved(schema) for p in s.get("properties", {})}


def _subschema(schema: dict[str, Any], prop: str) -> dict[str, Any]:
    for s in _resolved(schema):
        sub = s.get("properties", {}).get(prop)
        if isinstance(sub, dict):
            return sub
    return {}


def known_keys(name: str, *path: str) -> tuple[str, ...]:
    """The keys the mapping at ``path`` in schema ``name`` (or a reference, as for :func:`allowed`) may have."""
    return tuple(sorted(_known_properties(_node(name, path))))


def _node(name: str, path: Iterable[str]) -> dict[str, Any]:
    node = _registry().resolver().lookup(name).contents if "#" in name else load(name)
    for part in path:
        node = _subschema(node, part)
    return node


_NO_DEFAULT = object()


def _default_of(node: dict[str, Any]) -> Any:
    for s in _resolved(node):
        if "default" in s:
            return s["default"]
    return _NO_DEFAULT


def default(name: str, *path: str) -> Any:
    """The schema's ``default`` of the key at ``path`` in schema ``name`` (following ``$ref``), e.g.
    ``default("train", "precision")``: the one place a key's default is written. KeyError if it has none (a required
    key, or one whose absence means something else)."""
    value = _default_of(_node(name, path))
    if value is _NO_DEFAULT:
        raise KeyError(f"schema {name}: no default at {'.'.join(path)}")
    return copy.deepcopy(value)


@functools.lru_cache(maxsize=None)
def _defaults(name: str, path: tuple[str, ...]) -> dict[str, Any]:
    node = _node(name, path)
    out = {}
    for key in _known_properties(node):
        value = _default_of(_subschema(node, key))
        if value is not _NO_DEFAULT:
            out[key] = value
    return out


def with_defaults(block: Mapping[str, Any], name: str, *path: str) -> dict[str, Any]:
    """``block`` (the mapping at ``path`` in schema ``name``) with every key it leaves out at the schema's default,
    one level deep: how a job reads its settings, so no reader writes a default of its own."""
    return {**copy.deepcopy(_defaults(name, tuple(path))), **block}


_FREE_FORM = {"type": "object"}


def _config_node(parts: Iterable[str]) -> dict[str, Any] | None:
    """The full config's schema at the key ``parts`` (None where it declares no such key); below a free-form mapping
    (``train.vllm``: any vLLM argument) every key is the free-form mapping itself."""
    node: Any = load("config")
    for part in parts:
        resolved = _resolved(node)
        if part in {p for s in resolved for p in s.get("properties", {})}:
            node = _subschema(node, part)
            continue
        extra = [s["additionalProperties"] for s in resolved if "additionalProperties" in s]
        if extra and isinstance(extra[0], dict):
            node = extra[0]   # a map's entry (models.<name>, domains.<name>)
            continue
        closed = extra or any("unevaluatedProperties" in s for s in resolved)
        if closed or not any(s.get("type") == "object" for s in resolved):
            return None
        node = _FREE_FORM
    return node


def knows(dotted: str) -> bool:
    """Whether the full config's schema declares the key ``dotted`` (``train.engine``, ``methods.opd.lr``,
    ``models.student.sampling.top_p``): entries of a map (``models.<name>``) and keys below a free-form mapping
    (``train.vllm.<vLLM argument>``) count as declared."""
    return _config_node(dotted.split(".")) is not None


def declared_keys(dotted: str = "") -> tuple[str, ...]:
    """The keys the schema declares under ``dotted`` (the top level for ""), for "did you mean" hints."""
    node = _config_node([p for p in dotted.split(".") if p])
    return tuple(sorted(_known_properties(node))) if node is not None else ()


@functools.lru_cache(maxsize=None)
def allowed(name: str, *path: str) -> tuple[Any, ...]:
    """The ``enum`` of the key at ``path`` in schema ``name`` (following ``$ref``), e.g. ``allowed("train", "mix")``;
    ``name`` may also be a reference into a schema, e.g. ``"method.schema.yaml#/$defs/common"``."""
    for s in _resolved(_node(name, path)):
        if "enum" in s:
            return tuple(s["enum"])
    raise KeyError(f"schema {name}: no enum at {'.'.join(path)}")


# ---------------------------------------------------------------------------------------------------- renamed keys
def run_config_key(key: str) -> tuple[str, str | None]:
    """Where a composed config's dotted ``key`` sits in a run config, and the method a run must have to hold it: the
    planner copies ``methods.<m>`` into each ``<m>`` run's ``method`` (:mod:`opdgrpo.plan.planner`); other keys keep
    their path."""
    parts = key.split(".")
    if parts[0] == "methods" and len(parts) > 2:
        return ".".join(["method", *parts[2:]]), parts[1]
    return key, None


def renames(run_config: bool = False) -> list[tuple[str, str, str, str | None]]:
    """Each entry of :data:`RENAMED_KEYS` as (old dotted key, new dotted key, what the key is, the method a run needs
    for it), in a composed config's terms or, with ``run_config``, a run config's."""
    out = []
    for old, (new_name, note) in RENAMED_KEYS.items():
        key, method = run_config_key(old) if run_config else (old, None)
        out.append((key, f"{key.rsplit('.', 1)[0]}.{new_name}" if "." in key else new_name, note, method))
    return out


def renamed(key: str, run_config: bool = False, fix: str = "use `{key}` instead") -> str | None:
    """The error for a dotted ``key`` that was renamed: its new name, what it is, and ``fix`` (``{key}``: the new
    name); None for any other key."""
    for old, new, note, _ in renames(run_config):
        if key == old:
            return f"config key `{old}` was renamed `{new}` ({note}); {fix.format(key=new)}"
    return None


def _block(data: Any, key: str, method: str | None) -> dict[str, Any] | None:
    """The mapping that holds dotted ``key`` in ``data`` (None if there is none, or if the run's method is not
    ``method``)."""
    if method is not None and (not isinstance(data.get("method"), dict) or data["method"].get("name") != method):
        return None
    node = data
    for part in key.split(".")[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def refuse_renamed(data: dict[str, Any], run_config: bool = False, fix: str = "rename it in conf/ or pass `{key}=...`") -> None:
    """Raise :class:`SchemaError` for the first renamed key ``data`` (a composed config, or a run config) still holds,
    naming the new key, before the schema's generic "unknown key" (which cannot say what the key became)."""
    for old, _, _, method in renames(run_config):
        block = _block(data, old, method)
        if block is not None and old.rsplit(".", 1)[-1] in block:
            raise SchemaError(renamed(old, run_config, fix))
