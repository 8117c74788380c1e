"""The lazily evaluated configuration tree behind ``ppe_core.config``.

A config is a JSON-like tree (dicts, lists, scalars). Reading a key evaluates it on demand:
a dict with a ``type`` key becomes a call of ``types[type](**other_keys)``, a string starting
with ``@`` is a reference to another key, and every evaluated node is cached so each object is
built once and shared by everything that refers to it. Keys are paths: ``/a/0/b`` (absolute),
``b`` or ``../b`` (relative), ``/a.attr.0`` (an attribute or item of the built object) and
``!/a`` (the raw, unevaluated value).

Cache entries are keyed by ``(config_key, attr_key)``: ``attr_key`` is None for the raw value,
``()`` for the evaluated node and a non-empty tuple for an attribute chain on it, the same
layout PPE uses, so ``update_via_args`` overrides the same entries a PPE user expects.
"""

from __future__ import annotations

import importlib
import json
import os
import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ppe_core.errors import ConfigCycleError, ConfigKeyError, ConfigurationError

ConfigKey = tuple[str | int, ...]
AttrKey = tuple[str | int, ...]
KeyPair = tuple[ConfigKey, AttrKey | None]
ConfigType = Any
Loader = Callable[[str], Any]
DumpTrace = tuple[KeyPair, ...]
LoadTrace = tuple[tuple[str, ConfigKey], ...]

_T = TypeVar("_T", bound=Callable[..., Any])

#: Attribute ``customize_type`` stores its defaults under (PPE's name, so a type decorated with
#: PPE's ``customize_type`` keeps its defaults here and the other way round).
_DEFAULTS_ATTR = "_custom_default_kwargs"

#: File suffixes read with PyYAML when ``load_path`` is given no loader.
_YAML_SUFFIXES = (".yaml", ".yml")


def customize_type(**default_kwargs: Any) -> Callable[[_T], _T]:
    """Give a config type default arguments that are references to other keys.

    Each value is a key path, resolved relative to the dict that builds the object, used when
    the dict does not set that argument itself::

        @customize_type(optimizer="/optimizer")
        class Trainer: ...

    Args:
        **default_kwargs: Argument name -> key path (``'/abs/path'``, ``'../sibling'``,
            ``'/model.attr'``).

    Returns:
        A decorator that records the defaults on the type and returns the type unchanged.
    """

    def decorate(type_: _T) -> _T:
        setattr(type_, _DEFAULTS_ATTR, default_kwargs)
        return type_

    return decorate


class Config:
    """A configuration tree whose values are built when first read.

    Args:
        config: The tree: nested dicts and lists of JSON-like values.
        types: ``type`` name -> callable, used to build every dict that has a ``type`` key.

    ``config['/model']`` builds (once) and returns the object the ``/model`` dict describes;
    ``'@/path'`` strings are replaced by the value at that path (relative paths start from
    the dict or list holding the string).
    """

    def __init__(self, config: Any, types: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self._cache: dict[KeyPair, Any] = {((), None): config}
        self._types: Mapping[str, Callable[..., Any]] = types or {}

    def __getitem__(self, key: str) -> Any:
        config_key, attr_key, _ = _parse_key(key, ())
        return self._eval(config_key, attr_key, ())

    @classmethod
    def load_path(
        cls,
        path: str | os.PathLike[str],
        *,
        loader: Loader | None = None,
        types: Mapping[str, Callable[..., Any]] | None = None,
    ) -> Config:
        """Read a config file, expanding ``import`` keys, and wrap it in a :class:`Config`.

        A dict with an ``import`` key is replaced by the file it names (relative to the
        importing file), with the dict's other keys (relative paths into the imported tree)
        set on top.

        Args:
            path: The file to read.
            loader: Reads one file into a tree. By default JSON, or YAML (``yaml.safe_load``,
                needs the ``yaml`` extra) for a ``.yaml``/``.yml`` path.
            types: As for :class:`Config`.

        Raises:
            ConfigCycleError: Files import each other in a circle.
            OptionalDependencyError: A YAML file without PyYAML installed.
        """
        path = os.fspath(path)  # a Path reads the file its str form does
        if loader is None:
            loader = _yaml_loader() if path.endswith(_YAML_SUFFIXES) else _json_loader
        return cls(_load(path, loader, ()), types)

    def update_via_args(self, args: Sequence[tuple[str, Any]]) -> None:
        """Override values by key, as command-line options do (``('/lr', '0.1')``).

        A key already evaluated keeps its type: the new value is converted to it (a bool from
        ``'true'``/``'false'``). A key not evaluated yet takes the value as given.

        Raises:
            ValueError: A bool key given a string other than true/false (any case).
        """
        for key, value in args:
            config_key, attr_key, _ = _parse_key(key, ())
            slot = (config_key, attr_key)
            if slot not in self._cache:
                self._cache[slot] = value
                continue
            current = self._cache[slot]
            if isinstance(current, bool) and isinstance(value, str):
                if value.lower() not in ("true", "false"):
                    raise ValueError(
                        f"{key} is a bool: give true or false (any case), not {value!r}"
                    )
                value = value.lower() == "true"
            self._cache[slot] = type(current)(value)

    # Evaluation ---------------------------------------------------------------------------
    def _eval(self, config_key: ConfigKey, attr_key: AttrKey | None, trace: DumpTrace) -> Any:
        slot = (config_key, attr_key)
        if slot in self._cache:
            return self._cache[slot]
        if slot in trace:
            chain = _dump_trace((*trace, slot))
            raise ConfigCycleError(
                f"circular reference in the config: {chain}; break the circle by pointing "
                "one of these keys at a value that does not refer back"
            )
        trace = (*trace, slot)
        if attr_key is None:
            value = self._raw(config_key, trace)
        elif attr_key:
            value = self._attribute(config_key, attr_key, trace)
        else:
            value = self._build(config_key, trace)
        self._cache[slot] = value
        return value

    def _raw(self, config_key: ConfigKey, trace: DumpTrace) -> Any:
        parent = self._eval(config_key[:-1], None, trace)
        try:
            return parent[config_key[-1]]
        except (KeyError, IndexError, TypeError) as exc:
            where = _dump_key(config_key[:-1], ())
            raise ConfigKeyError(
                f"{config_key[-1]!r} not in {where} ({_describe(parent)}); "
                f"resolving {_dump_trace(trace)}"
            ) from exc

    def _attribute(self, config_key: ConfigKey, attr_key: AttrKey, trace: DumpTrace) -> Any:
        obj = self._eval(config_key, attr_key[:-1], trace)
        name = attr_key[-1]
        if isinstance(name, str) and hasattr(obj, name):
            return getattr(obj, name)
        try:
            return obj[name]
        except (KeyError, IndexError, TypeError) as exc:
            where = _dump_key(config_key, attr_key[:-1])
            raise ConfigKeyError(
                f"{name!r} is neither an attribute nor an item of {where} "
                f"({reprlib.repr(obj)}); resolving {_dump_trace(trace)}"
            ) from exc

    def _build(self, config_key: ConfigKey, trace: DumpTrace) -> Any:
        node = self._eval(config_key, None, trace)
        if isinstance(node, dict):
            return self._call(config_key, node, trace)
        if isinstance(node, list):
            return [self._eval((*config_key, i), (), trace) for i in range(len(node))]
        if isinstance(node, str) and node.startswith("@"):
            # Relative references start from the container holding the string.
            target, attrs, _ = _parse_key(node[1:], config_key[:-1])
            return self._eval(target, attrs, trace)
        return node

    def _call(self, config_key: ConfigKey, node: dict[Any, Any], trace: DumpTrace) -> Any:
        factory: Callable[..., Any] = dict
        if "type" in node:
            try:
                factory = self._types[node["type"]]
            except (KeyError, TypeError) as exc:
                known = ", ".join(sorted(map(str, self._types))) or "none"
                raise ConfigKeyError(
                    f"type {node['type']!r} at {_dump_key(config_key, ())} is not in the types "
                    f"given to Config (known: {known}); pass it in types= "
                    f"(resolving {_dump_trace(trace)})"
                ) from exc
        kwargs = {k: self._eval((*config_key, k), (), trace) for k in node if k != "type"}
        for name, ref in getattr(factory, _DEFAULTS_ATTR, {}).items():
            if name not in kwargs:
                target, attrs, _ = _parse_key(ref, config_key)
                kwargs[name] = self._eval(target, attrs, trace)
        try:
            return factory(**kwargs)
        except Exception as exc:
            # The user's own error from their type: keep its class, add where it came from.
            _add_note(
                exc,
                f"while building {_dump_key(config_key, ())} with "
                f"{node.get('type', 'dict')!r} ({factory!r}) and kwargs "
                f"{reprlib.repr(kwargs)}; resolving {_dump_trace(trace)}",
            )
            raise


# Keys ---------------------------------------------------------------------------------------
def _parse_key(key: str, base: ConfigKey) -> tuple[ConfigKey, AttrKey | None, bool]:
    """Split a key path into (config key, attribute key, relative?), resolved from ``base``."""
    raw = key.startswith("!")
    text = key[1:] if raw else key
    relative = not text.startswith("/")
    if not relative:
        text = text[1:]
    *parents, last = text.split("/")
    last, *attrs = last.split(".")
    parts = [_segment(s) for s in (*parents, last)]
    attr_key: AttrKey | None = tuple(_segment(s) for s in attrs)
    if raw:
        if attr_key:
            raise ConfigKeyError(
                f"{key!r}: a raw ('!') key cannot name an attribute; drop the '!' or the "
                "'.attribute' part"
            )
        attr_key = None
    resolved: list[str | int] = list(base) if relative else []
    for part in parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                raise ConfigKeyError(
                    f"{key!r} goes above the root of the config (from "
                    f"{_dump_key(base, ())}); remove a '..'"
                )
            resolved.pop()
        else:
            resolved.append(part)
    return tuple(resolved), attr_key, relative


def _segment(text: str) -> str | int:
    try:
        return int(text)
    except ValueError:
        return text


def _dump_key(config_key: ConfigKey, attr_key: AttrKey | None) -> str:
    path = "/" + "/".join(map(str, config_key))
    if attr_key is None:
        return "!" + path
    if attr_key:
        return path + "." + ".".join(map(str, attr_key))
    return path


def _dump_trace(trace: DumpTrace) -> str:
    return " -> ".join(_dump_key(c, a) for c, a in trace)


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "keys: " + (", ".join(map(repr, value)) or "none")
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__}, which has no keys"


def _add_note(exc: BaseException, note: str) -> None:
    # Python 3.11+ shows notes under the traceback; 3.10 has no notes, the chain stays as is.
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(note)


# Files --------------------------------------------------------------------------------------
def _load(path: str, loader: Loader, trace: LoadTrace) -> ConfigType:
    path = os.path.normpath(path)
    if (path, ()) in trace:
        chain = " -> ".join(f"{_dump_key(k, None)} of {p}" for p, k in (*trace, (path, ())))
        raise ConfigCycleError(
            f"circular import between config files: {chain}; remove one of the 'import' keys"
        )
    trace = (*trace, (path, ()))
    return _expand(loader(path), os.path.dirname(path), loader, trace)


def _expand(node: ConfigType, workdir: str, loader: Loader, trace: LoadTrace) -> ConfigType:
    path, config_key = trace[-1]
    if isinstance(node, list):
        return [
            _expand(v, workdir, loader, (*trace, (path, (*config_key, i))))
            for i, v in enumerate(node)
        ]
    if not isinstance(node, dict):
        return node
    node = {
        k: _expand(v, workdir, loader, (*trace, (path, (*config_key, k)))) for k, v in node.items()
    }
    if "import" not in node:
        return node
    target = os.path.join(workdir, node["import"])  # an absolute import path stays absolute
    imported = _load(target, loader, trace)
    for key, value in node.items():
        if key != "import":
            _override(imported, key, value, target)
    return imported


def _override(tree: ConfigType, key: str, value: Any, path: str) -> None:
    """Set ``value`` at the relative key ``key`` inside an imported tree."""
    keys, attrs, relative = _parse_key(key, ())
    if attrs or not relative:
        raise ConfigurationError(
            f"{key!r} beside 'import' must be a relative key path without an attribute "
            f"(such as 'model/units'), to override a value of {path}"
        )
    node = tree
    try:
        for part in keys[:-1]:
            node = node[part]
        node[keys[-1]] = value
    except (KeyError, IndexError, TypeError) as exc:
        raise ConfigKeyError(
            f"{_dump_key(keys, ())} not in {path}: the key beside 'import' must name a value "
            "the imported file has (or a new key of one of its dicts)"
        ) from exc


def _json_loader(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _yaml_loader() -> Loader:
    try:
        yaml: Any = importlib.import_module("yaml")
    except ModuleNotFoundError as exc:
        from ppe_core.errors import OptionalDependencyError

        raise OptionalDependencyError(
            "Config.load_path reads .yaml/.yml files with PyYAML, which is not installed; run "
            "`pip install 'ppe-core[yaml]'` or pass loader= (json.load for a JSON file)"
        ) from exc

    def load(path: str) -> Any:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)

    return load
