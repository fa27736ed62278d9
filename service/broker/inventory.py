"""The broker's NorFab-style inventory: what `sid.service.broker` serves to NorFab workers.

Every NorFab 0.25 worker asks the broker for its inventory when it starts (`load_inventory()`: MMI
`get_inventory` on `sid.service.broker`, kwargs `{"name": <worker name>}`), and nfcli shows the
broker's with MMI `show_broker_inventory`. The inventory is NorFab's own `inventory.yaml`
(`ZFAB_BROKER_INVENTORY` names the file, or a directory holding it): its `workers` section maps
glob patterns of worker names to lists of files (relative to the inventory's directory) or
inline dictionaries, and a worker's inventory is every matching item merged in order, files
rendered as Jinja2 templates with `env` (the broker's environment) first, as NorFab does.

The files are read when a worker asks (as NorFab's broker does), bounded in size; PyYAML and
Jinja2 are the optional extra `zfab[norfab]`, imported only when an inventory is configured.
"""

from __future__ import annotations

import copy
import fnmatch
import os
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 16 * 1024 * 1024  # one inventory file; NorFab's are a few KiB
MAX_ITEMS = 10_000  # files and dictionaries one worker's inventory merges


class InventoryError(Exception):
    """The inventory cannot be read: a missing file, bad YAML or template, a missing extra."""


def merge_recursively(data: dict[str, Any], merge: dict[str, Any]) -> None:
    """NorFab's merge: dictionaries merge key by key, lists extend (without repeats), the rest replaces."""
    for k, v in merge.items():
        if isinstance(data.get(k), dict) and isinstance(v, dict):
            merge_recursively(data[k], v)
        elif isinstance(data.get(k), list) and isinstance(v, list):
            for i in v:
                if i not in data[k]:
                    data[k].append(i)
        else:
            data[k] = v


def _render(path: Path) -> Any:
    try:
        import jinja2
        import yaml
    except ImportError as exc:  # pragma: no cover - the extra is part of the dev install
        raise InventoryError(
            f"a NorFab inventory needs PyYAML and Jinja2: pip install 'zfab[norfab]' ({exc})"
        ) from None
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InventoryError(f"{path} is {size} bytes, over the {MAX_FILE_BYTES} an inventory file may have")
        text = path.read_text(encoding="utf-8")
        rendered = jinja2.Environment().from_string(text).render(env=dict(os.environ))
        return yaml.safe_load(rendered)
    except OSError as exc:
        raise InventoryError(f"{path}: {exc.strerror or exc}") from None
    except (jinja2.TemplateError, yaml.YAMLError) as exc:
        raise InventoryError(f"{path}: {type(exc).__name__}: {str(exc)[:300]}") from None


class Inventory:
    """A NorFab inventory file, read at start (its top level) and per request (workers' files)."""

    def __init__(self, location: str) -> None:
        path = Path(location).expanduser()
        if path.is_dir():
            path = path / "inventory.yaml"
        self.path = path.resolve()
        self.base = self.path.parent
        data = _render(self.path)
        if not isinstance(data, dict):
            raise InventoryError(f"{self.path}: the inventory must be a mapping, not {type(data).__name__}")
        workers = data.get("workers") or {}
        if not isinstance(workers, dict) or not all(isinstance(v, list) for v in workers.values()):
            raise InventoryError(f"{self.path}: 'workers' must map name patterns to lists of files or mappings")
        self.data = data
        self.workers: dict[str, list[Any]] = {str(k): v for k, v in workers.items()}

    def worker(self, name: str) -> dict[str, Any] | None:
        """A worker's inventory as NorFab lays it out (every item whose pattern matches the name,
        merged in order); None when no pattern matches or the items hold nothing."""
        items: list[Any] = []
        for pattern, entries in self.workers.items():
            if fnmatch.fnmatchcase(name, pattern):
                items.extend(i for i in entries if i not in items)
        out: dict[str, Any] = {}
        for item in items[:MAX_ITEMS]:
            if isinstance(item, str):
                file = (self.base / item).resolve()
                loaded = _render(file)
                if isinstance(loaded, dict):
                    merge_recursively(out, loaded)
            elif isinstance(item, dict):
                merge_recursively(out, copy.deepcopy(item))  # the merge must not change the inventory
        return out or None

    def as_dict(self) -> dict[str, Any]:
        """`show_broker_inventory`: NorFab's keys, its hooks and plugins as the file names them."""
        d = self.data
        return {
            "broker": d.get("broker") or {},
            "workers": self.workers,
            "topology": d.get("topology") or {},
            "logging": d.get("logging") or {},
            "client": d.get("client") or {},
            "hooks": d.get("hooks") or {},
            "plugins": d.get("plugins") or {},
        }
