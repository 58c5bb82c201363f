"""What every Invoke task shares: project paths from the config, host-selection help,
user errors as one message and an exit code, and running work on hosts in parallel."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from invoke.context import Context
from invoke.exceptions import Exit

from vigil.desired import inventory
from vigil.errors import VigilError

ROOT = Path(__file__).resolve().parents[2]
HOSTS_HELP = "host names, group names or 'all', comma separated"

T = TypeVar("T")


def setting(c: Context, key: str) -> Path:
    """A path from the `vigil` config section, relative to the project root."""
    value = Path(str(c.config.vigil[key]))
    return value if value.is_absolute() else ROOT / value


def load_inventory(c: Context) -> inventory.Inventory:
    return inventory.load(setting(c, "inventory"), setting(c, "roles"))


@contextmanager
def user_errors() -> Iterator[None]:
    """A user mistake prints one clear message and exits with its code; no traceback."""
    try:
        yield
    except VigilError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise Exit(code=int(exc.exit_code)) from None


def parallel(items: Iterable[T], work: Callable[[T], None]) -> None:
    """Run `work` on every item in its own thread and wait for all of them."""
    threads = [threading.Thread(target=work, args=(item,)) for item in items]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
