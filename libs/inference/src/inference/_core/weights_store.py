"""The :class:`~inference.AdapterWeights` a provider holds: copies kept in memory, or private PEFT directories.

``load_adapter(id, AdapterWeights(...))`` gives the provider weights, not a path. A provider whose backend takes
them from memory (``loads_adapter_weights_in_memory``) keeps a checked copy (the caller's tensors are often live
training parameters that change afterwards); any other gets the copy written to a private PEFT directory, named for
this process (:mod:`inference._core.scratch`), whose GGUF conversions are kept inside it. Either lives while an
adapter of the registry uses it and is removed after: on unload, replace, a failed load, or when an in-process
provider closes (a server provider's ``aclose`` leaves its adapters loaded on the server, which may read their files
again: vLLM does after an eviction from its CPU LoRA cache), at the latest when the provider is collected or at exit.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference._core.paths import normalise_path
from inference._core.scratch import owned_prefix, sweep_abandoned
from inference.adapters.source import AdapterSource
from inference.exceptions import ConfigurationError

if TYPE_CHECKING:
    from inference.adapters.weights import AdapterWeights

__all__ = ["AdapterWeightsStore"]

logger = logging.getLogger("inference")

_labels = itertools.count(1)


class AdapterWeightsStore:
    """The adapter weights one provider holds, and their clean-up.

    Args:
        provider: The provider's name, for error messages.
        owner: The provider: its directories are removed at the latest when it is collected (or at exit).
        parent: Where to write the private directories, asked at each write (``None``: the system's temporary
            directory); a server that reads adapters from its own file system needs a directory it shares.
    """

    def __init__(self, provider: str, owner: object, parent: Callable[[], str | None] = lambda: None) -> None:
        self._provider = provider
        self._owner = weakref.ref(owner)
        self.parent = parent
        self._kept: dict[str, AdapterWeights] = {}  # label -> the copy kept in memory
        self._dirs: dict[str, weakref.finalize[Any, Any]] = {}  # private directory -> its removal
        self._pending: set[str] = set()  # made, not yet recorded by the registry: never removed meanwhile
        self._swept = False

    def kept(self, weights: AdapterWeights) -> AdapterSource:
        """A checked copy of ``weights`` kept in memory, as a source (worker thread: copying takes time).

        A copy, because the caller's tensors are often live training parameters that change in place afterwards;
        checked after copying, so what is checked is what is served.
        """
        copy = weights.snapshot()
        copy.check(provider=self._provider)
        label = f"<adapter weights {next(_labels)}>"
        self._kept[label] = copy
        self._pending.add(label)
        return AdapterSource(label, weights=copy)

    def written(self, weights: AdapterWeights) -> AdapterSource:
        """A checked copy of ``weights`` written to a new private PEFT directory, as a source (worker thread)."""
        weights = weights.snapshot()  # what is checked is what is written, whatever the caller's tensors do meanwhile
        parent = self.parent()
        if not self._swept:  # once per provider: the directories of killed processes
            self._swept = True
            for abandoned in sweep_abandoned(parent):
                logger.info("removed %s, left behind by a process that is gone", abandoned)
        try:
            directory = tempfile.mkdtemp(prefix=owned_prefix(), dir=parent)
        except OSError as error:
            if parent is None:
                raise
            raise ConfigurationError(  # it went away, or became a file, since the setting was checked
                f"cannot write adapter weights into the directory {parent}: {error.strerror or error}",
                provider=self._provider,
                path=parent,
            ) from error
        directory = os.path.abspath(directory)  # a server given a relative path resolves it against its own cwd
        owner = self._owner()
        remove = weakref.finalize(owner if owner is not None else self, shutil.rmtree, directory, ignore_errors=True)
        try:
            weights.save(directory, provider=self._provider)
        except BaseException:
            remove()
            raise
        path = normalise_path(directory)
        self._pending.add(path)  # before it is listed: a clean-up on the loop must not see it bare
        self._dirs[path] = remove
        return AdapterSource(path)

    def recorded(self, source: AdapterSource) -> None:
        """The registry has recorded (or refused) ``source``: from now on it is removed once no adapter uses it."""
        self._pending.discard(source.path)

    def conversion_dir(self, adapter_path: str, cache_dir: Path) -> Path:
        """Where to keep what the adapter at ``adapter_path`` is converted to (a GGUF LoRA): ``cache_dir``, except for
        a private directory of weights, whose conversions are kept inside it and removed with it (a training loop's
        weights, new every step, would push every other adapter out of the bounded cache)."""
        return Path(adapter_path) if adapter_path in self._dirs else cache_dir

    def directories(self) -> list[str]:
        """The private directories written and not removed yet."""
        return list(self._dirs)

    def remove_unused(self, used: set[str]) -> None:
        """Remove the copies and directories whose path or label is in neither ``used`` nor the pending ones."""
        held = used | self._pending
        for path in [path for path in self._dirs if path not in held]:
            self._dirs.pop(path)()
        for label in [label for label in self._kept if label not in held]:
            del self._kept[label]
