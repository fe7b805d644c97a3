"""The adapters a provider loaded on its servers at run time, across its replicas.

:class:`ServedAdapters` is the part a server provider with runtime LoRA routes is assembled from (vLLM's; an SGLang
provider would reuse it with its own :class:`~inference._servers.runtime_lora.LoRARoutes`). It owns every
decision that spans replicas, and leaves each single request to :class:`~inference._servers.runtime_lora.RuntimeLoRA`:

- **fan-out**: an adapter is loaded on every replica at once, all or nothing (a load that fails on one is unloaded
  from the others: roll-back); an unload goes everywhere, and a replica that lost the adapter counts as done;
- **placement** (``adapter_placement="on-demand"``): the adapter goes to the replica
  :class:`~inference._servers.placement.AdapterPlacement` picks, and to another one before a request that
  placement sends there; the order requests try replicas in follows the holders;
- **healing**: a replica that answers it does not know an adapter loaded here (it restarted) gets it again from
  the remembered path, and the request is retried once (the provider's generation path calls :meth:`reload_lost`);
- **reconcile**: every replica's model list compared with the record, lost adapters loaded again, unexpected
  ones reported, and so are ids a replica serves from another path than the one loaded here (:class:`ReconcileReport`);
- **other weights under an id**: a replica found serving an id from another path (by a heal or a reconcile: after a
  restart, another client, ``--lora-modules`` or a resolver plugin gave the name first) is not sent that id's
  requests while its model list says so (:meth:`ServedAdapters.refuse_other_weights`);
- **discovery**: what the servers list (from an earlier process, ``--lora-modules``) can be used and unloaded by
  id from a new provider; a replaced id (``id@n``) is found under its newest name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from inference._core.lifecycle import AdapterRegistry, Discovered, parse_versioned_name
from inference._core.validation import GenerationRequest
from inference._servers.http import ServerAnswer
from inference._servers.openai_wire import quoted_model
from inference._servers.placement import AdapterPlacement
from inference._servers.replicas import (
    Replica,
    ReplicaDown,
    ReplicaLacks,
    ReplicaSet,
    is_unavailable,
    unavailable_is_down,
)
from inference._servers.runtime_lora import RuntimeLoRA, same_adapter_path
from inference.exceptions import (
    AdapterAlreadyLoadedError,
    InferenceError,
    ProviderUnavailableError,
    ServerAdapterAlreadyLoadedError,
    ServerAdapterNotFoundError,
    ServerResponseError,
)

__all__ = ["ReconcileReport", "ReplicaReconciliation", "ServedAdapters"]


@dataclass(frozen=True)
class ReplicaReconciliation:
    """What ``reconcile_adapters`` found and did on one replica.

    Attributes:
        base_url: The replica's base URL (credentials in it hidden).
        reloaded: Adapters the provider had loaded that the server had lost, loaded again (by id: a replaced
            adapter served as ``id@n`` is reported as ``id``).
        failed: Adapters the server had lost that could not be loaded again (the log says why), by id.
        unexpected: LoRA adapters the server serves that this provider did not load (``--lora-modules``,
            a resolver plugin, another client); left alone.
        mismatched: Adapters the provider loaded that the server serves under the same name from another path
            (it restarted and another client, ``--lora-modules`` or a resolver plugin gave the name other weights),
            by id; left alone, and requests for them are not sent to this replica while it does.
        error: Why the replica could not be reconciled (e.g. it is down), else ``None``.
    """

    base_url: str
    reloaded: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class ReconcileReport:
    """The outcome of ``reconcile_adapters``, one entry per replica.

    Attributes:
        replicas: One :class:`ReplicaReconciliation` per replica, in configuration order.
    """

    replicas: tuple[ReplicaReconciliation, ...]

    @property
    def reloaded(self) -> list[str]:
        """Adapters reloaded on at least one replica, sorted."""
        return sorted({adapter_id for replica in self.replicas for adapter_id in replica.reloaded})

    @property
    def unexpected(self) -> list[str]:
        """Adapters some replica serves that this provider did not load, sorted."""
        return sorted({adapter_id for replica in self.replicas for adapter_id in replica.unexpected})

    @property
    def mismatched(self) -> list[str]:
        """Adapters some replica serves from another path than the one loaded here, sorted."""
        return sorted({adapter_id for replica in self.replicas for adapter_id in replica.mismatched})

    @property
    def ok(self) -> bool:
        """True when every replica answered and holds every adapter the provider loaded, from its path."""
        return all(
            replica.error is None and not replica.failed and not replica.mismatched for replica in self.replicas
        )


def _ms_since(started: float) -> float:
    """Milliseconds since ``started`` (a ``time.perf_counter()``)."""
    return (time.perf_counter() - started) * 1000


def _adapter_id(served_name: str) -> str:
    """The adapter id a served LoRA name stands for: ``a0@3`` (a replaced id's weights) is ``a0``."""
    parsed = parse_versioned_name(served_name)
    return served_name if parsed is None else parsed[0]


class ServedAdapters:
    """Runtime LoRA adapters across a provider's replicas.

    Args:
        replicas: The provider's replicas.
        lora: The server's runtime LoRA routes, sent to one replica at a time.
        registry: The provider's adapter record (paths to load again from, backend names, reload statistics).
        placement: Which replica holds which adapter (``adapter_placement="on-demand"``); ``None``: every replica
            holds every adapter.
    """

    def __init__(
        self, replicas: ReplicaSet, lora: RuntimeLoRA, registry: AdapterRegistry, placement: AdapterPlacement | None
    ) -> None:
        self._replicas = replicas
        self.lora = lora
        self._registry = registry
        self.placement = placement
        self._logger = logging.getLogger(f"inference.{replicas.provider}")
        self._placing: dict[str, asyncio.Lock] = {}  # replica URL -> one placement change at a time there
        self._healing: dict[tuple[str, str], asyncio.Lock] = {}  # (replica URL, name) -> one heal at a time
        self._heals: dict[tuple[str, str], int] = {}  # (replica URL, name) -> heals done (waiters see one happened)
        self._other_weights: set[tuple[str, str]] = set()  # (replica URL, name): served there from another path

    # Generation: which replicas, the adapter's name on the wire, its loss ---------------------------------

    def order_for(self, request: GenerationRequest, ordered: list[Replica]) -> list[Replica]:
        """The replicas to try for ``request`` (``ordered``: least busy first); with placement, its holders first."""
        if self.placement is None or request.adapter_id is None:
            return ordered
        chosen = self.placement.order_for(request.adapter_id, ordered)
        return [replica for candidate in chosen for replica in ordered if replica is candidate]

    def started(self, replica: Replica, request: GenerationRequest) -> None:
        """``request`` is about to go to ``replica`` (placement counts it)."""
        if self.placement is not None and request.adapter_id is not None:
            self.placement.started(replica, request.adapter_id)

    def finished(self, replica: Replica, request: GenerationRequest) -> None:
        """``request`` is done with ``replica``, answered or not."""
        if self.placement is not None and request.adapter_id is not None:
            self.placement.finished(replica, request.adapter_id)

    async def place_for(self, replica: Replica, request: GenerationRequest) -> None:
        """With placement, load the request's adapter on ``replica`` if it does not hold it (its holders are busy
        or down).

        Raises:
            ReplicaDown: The replica did not accept the connection, or answered 502/503/504 (it did nothing).
        """
        adapter_id = request.adapter_id
        if self.placement is not None and adapter_id is not None and not self.placement.holds(replica, adapter_id):
            path = self._registry.path_of(adapter_id)
            if path is not None:  # placed here now; else the server says it lacks it
                await self._place_on(replica, adapter_id, path, spread=True)

    async def refuse_other_weights(self, replica: Replica, request: GenerationRequest) -> None:
        """Refuse to send ``request`` to a replica found serving its adapter from another path (by a heal or a
        reconcile), as long as the replica's model list still says so; once it no longer does (the name was
        unloaded there, or loaded again from this path), requests go there again.

        Raises:
            ReplicaLacks: The replica serves other weights under the adapter's name (another replica may serve it).
            ReplicaDown: The replica did not accept the connection, or answered 502/503/504 (it did nothing).
        """
        adapter_id, key = request.adapter_id, (replica.base_url, request.adapter_id or "")
        if adapter_id is None or key not in self._other_weights:
            return
        path = self._registry.path_of(adapter_id)
        with unavailable_is_down():
            served = (await self.lora.served(replica)).get(adapter_id)
        if path is None or not served or same_adapter_path(path, served):
            self._other_weights.discard(key)
            return
        raise ReplicaLacks(
            AdapterAlreadyLoadedError(
                f"{replica.http.where} serves adapter {adapter_id!r} from {served!r}, not from {path!r} where it was "
                "loaded from here: other weights under the name (given to it by another client, --lora-modules or "
                f"a resolver plugin after a restart); unload_adapter({adapter_id!r}) unloads the server's, then "
                "load yours again, or load yours under another id",
                provider=self._replicas.provider,
                url=replica.http.shown_url,
                path=path,
            )
        )

    def model_for(self, request: GenerationRequest) -> str:
        """The ``model`` a request sends: its adapter's name as the server takes it, else the model."""
        if request.adapter_id is None:
            return request.model
        return self.lora.routes.adapter_model(request.model, request.adapter_id)

    def lost_path(self, request: GenerationRequest) -> str | None:
        """Where to load the request's adapter again from when a replica lost it; ``None``: not loaded here."""
        return self._registry.path_of(request.adapter_id) if request.adapter_id else None

    async def reload_lost(self, replica: Replica, adapter_id: str, path: str) -> None:
        """Load ``adapter_id`` again on ``replica``, which lost it (restarted), counting the reload.

        Concurrent requests that found it lost heal it once: one loads it, the others wait for that load (and send
        nothing); a reload is counted and logged when this process loaded it, not when the server had it again.
        """
        key = (replica.base_url, adapter_id)
        heals = self._heals.get(key, 0)
        async with self._healing.setdefault(key, asyncio.Lock()):
            if self._heals.get(key, 0) != heals:
                return  # another request healed it while this one waited
            started, where = time.perf_counter(), replica.http.shown_url
            try:
                loaded = await self._load_on(replica, adapter_id, path, healing=True)
            except Exception as error:
                self._registry.note("reload", adapter_id, _ms_since(started), ok=False, healed=True, replica=where)
                if isinstance(error, ServerAdapterAlreadyLoadedError):  # it serves other weights under the name
                    raise ReplicaLacks(error) from error
                raise
            self._heals[key] = heals + 1
            if loaded:
                self._logger.warning(
                    "%s had lost adapter %r (restarted?); loaded it again from %s", replica.http.where, adapter_id,
                    path,
                )
                self._registry.note("reload", adapter_id, _ms_since(started), healed=True, replica=where)

    def not_found(
        self, answer: ServerAnswer, request: GenerationRequest, reloaded_from: str | None
    ) -> ServerResponseError | None:
        """A 404 naming the request's adapter: the server lacks it (loaded again or not); else ``None``."""
        named = quoted_model(answer)
        if answer.route_missing or request.adapter_id is None or named not in (None, request.adapter_id):
            return None
        if reloaded_from is not None:
            sentence = (
                f"{answer.where} still has no adapter {request.adapter_id!r} after it was loaded again from "
                f"{reloaded_from!r} ({answer.message}): check the server's log; unload_adapter and "
                "load_adapter it again, or call reconcile_adapters()"
            )
        else:
            preload = self.lora.routes.preload_hint.format(adapter_id=request.adapter_id)
            sentence = (
                f"{answer.where} has no adapter {request.adapter_id!r} ({answer.message}): load it with "
                f"load_adapter({request.adapter_id!r}, path) first, or {preload}"
            )
        return answer.error(ServerAdapterNotFoundError, sentence)

    def refusal(self, answer: ServerAnswer) -> ServerResponseError | None:
        """A 400 to a request that is about its adapter (vLLM's LoRA resolver), else ``None``."""
        return self.lora.routes.request_refusal(answer)

    # Loading and unloading on every replica (or where placement says) --------------------------------------

    async def load(self, adapter_id: str, adapter_path: str) -> None:
        """Load the adapter on every replica, all or nothing; with placement, on the one it picks."""
        if self.placement is not None:
            await self._load_on_demand(adapter_id, adapter_path)
            return
        replicas = self._replicas
        outcomes = await replicas.gather(lambda replica: self._load_on(replica, adapter_id, adapter_path))
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if not failures:
            return
        loaded = [replica for replica, outcome in zip(replicas, outcomes, strict=True) if outcome is True]
        if loaded:
            self._logger.warning(
                "loading adapter %r failed on %d of %d %s replicas; unloading it from the others",
                adapter_id,
                len(failures),
                len(replicas),
                self._replicas.server,
            )
            await self._roll_back(loaded, adapter_id)
        raise failures[0]

    async def unload(self, adapter_id: str) -> None:
        """Unload the adapter from every replica that holds it; it stays recorded where that failed."""
        replicas = list(self._replicas)
        if self.placement is not None:
            replicas = [replica for replica in self._replicas if self.placement.holds(replica, adapter_id)]
        outcomes = await self._replicas.gather(lambda replica: self.lora.unload(replica, adapter_id), replicas)
        if self.placement is not None:
            for index, (replica, outcome) in enumerate(zip(replicas, outcomes, strict=True)):
                if isinstance(outcome, ProviderUnavailableError):  # a restarted server has forgotten it anyway
                    self._logger.warning(
                        "%s is unreachable; forgetting adapter %r there (if it comes back still holding it, "
                        "reconcile_adapters() lists it as unexpected)", replica.http.where, adapter_id
                    )
                    outcomes[index] = None
                if not isinstance(outcomes[index], BaseException):
                    self.placement.removed(adapter_id, replica)
        for replica, outcome in zip(replicas, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                self._other_weights.discard((replica.base_url, adapter_id))
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            raise failures[0]  # the adapter stays recorded: unloading again retries where it failed

    async def _load_on(self, replica: Replica, adapter_id: str, adapter_path: str, *, healing: bool = False) -> bool:
        """Load on one replica (see :meth:`RuntimeLoRA.load`: ``False`` when, ``healing``, it had it already).

        A replica found serving the name from another path (:class:`ServerAdapterAlreadyLoadedError`) is remembered
        (:meth:`refuse_other_weights`); one that now holds it from this path is forgotten there.
        """
        self._registry.refuse_changed(adapter_id)  # a heal, a placement or a reconcile: the same weights
        key = (replica.base_url, adapter_id)
        try:
            loaded = await self.lora.load(replica, adapter_id, adapter_path, healing=healing)
        except ServerAdapterAlreadyLoadedError:
            if healing:
                self._other_weights.add(key)
            raise
        self._other_weights.discard(key)
        return loaded

    async def _roll_back(self, replicas: list[Replica], adapter_id: str) -> None:
        outcomes = await self._replicas.gather(lambda replica: self.lora.unload(replica, adapter_id), replicas)
        for replica, outcome in zip(replicas, outcomes, strict=True):
            if isinstance(outcome, Exception):
                self._logger.error(
                    "could not unload adapter %r from %s after a failed load elsewhere (%s): unload it by hand",
                    adapter_id,
                    replica.http.shown_url,
                    outcome,
                )

    # On-demand placement (the rules are in inference._servers.placement) -------------------------------------

    async def _load_on_demand(self, adapter_id: str, adapter_path: str) -> None:
        """Load a new adapter on one replica: the one placement picks, or the next when it cannot be reached or
        answers 502/503/504 (the load was not made). One that does not answer within the timeout is marked down and
        its timeout raised: the load may have been made there, so it is not made elsewhere too."""
        assert self.placement is not None
        failures: list[tuple[Replica, InferenceError]] = []
        for candidate in self.placement.ranked_for_load():
            replica = next(replica for replica in self._replicas if replica is candidate)
            try:
                with replica.down_if_hung():  # a load that timed out may have been made: not made elsewhere
                    await self._place_on(replica, adapter_id, adapter_path)
                return
            except ReplicaDown as down:
                replica.mark_down(down.error)
                failures.append((replica, down.error))
        raise self._replicas.all_down(failures)

    async def _place_on(self, replica: Replica, adapter_id: str, adapter_path: str, *, spread: bool = False) -> None:
        """Load ``adapter_id`` on ``replica``, first unloading there the adapters placement says make room.

        Each unload is recorded as an ``evict`` adapter event; with ``spread`` (a request's adapter placed on one
        more replica, not ``load_adapter``'s own load, which the registry records) the load as a ``load`` event.

        Raises:
            ReplicaDown: The replica did not accept the connection, or answered 502/503/504 (it did nothing).
        """
        placement = self.placement
        assert placement is not None
        async with self._placing.setdefault(replica.base_url, asyncio.Lock()):
            if placement.holds(replica, adapter_id):
                return  # another request placed it meanwhile
            where = replica.http.shown_url
            try:
                await self._make_room(replica, adapter_id)
                started = time.perf_counter()
                try:
                    await self._load_on(replica, adapter_id, adapter_path)
                except Exception:
                    if spread:
                        self._registry.note("load", adapter_id, _ms_since(started), ok=False, replica=where)
                    raise
                if spread:
                    self._registry.note("load", adapter_id, _ms_since(started), replica=where)
            except InferenceError as error:
                if isinstance(error, ProviderUnavailableError) or is_unavailable(error):  # a 503: nothing was done
                    raise ReplicaDown(error) from error
                raise
            placement.placed(replica, adapter_id)

    async def _make_room(self, replica: Replica, adapter_id: str) -> None:
        """Unload from ``replica`` the adapters used least recently with no request in flight there until it has
        room for ``adapter_id`` (several, where it went over ``max_loras`` while all of its adapters were busy);
        when every one left is busy, go over capacity rather than fail the request (a warning)."""
        placement = self.placement
        assert placement is not None
        while True:
            try:
                evicted = placement.to_evict(replica)
            except LookupError:
                self._logger.warning("%s is full and every adapter on it is in use; loading %r beyond max_loras",
                                     replica.http.where, adapter_id)
                return
            if evicted is None:
                return
            started = time.perf_counter()
            try:
                await self.lora.unload(replica, evicted)
            except Exception:
                self._registry.note("evict", evicted, _ms_since(started), ok=False, replica=replica.http.shown_url)
                raise
            placement.removed(evicted, replica)
            self._registry.note(
                "evict", evicted, _ms_since(started), replica=replica.http.shown_url, room_for=adapter_id
            )

    # What the servers hold: reconcile, listings, discovery -----------------------------------------------------

    async def reconcile(self) -> ReconcileReport:
        """Make every replica hold the adapters loaded here (each one those placement gave it); report what
        differed. A replica that cannot be reached is reported, not raised."""
        ids = {backend: adapter_id for adapter_id, backend in self._registry.backend_names().items()}
        expected = {name: self._registry.path_of(name) for name in ids}
        placement = self.placement

        def held(replica: Replica) -> dict[str, str | None]:  # with on-demand placement, what it was given
            return expected if placement is None else {name: expected.get(name) for name in placement.held_by(replica)}

        results = await asyncio.gather(
            *(self._reconcile_one(replica, held(replica), ids) for replica in self._replicas)
        )
        return ReconcileReport(replicas=tuple(results))

    async def _reconcile_one(
        self, replica: Replica, expected: dict[str, str | None], ids: dict[str, str]
    ) -> ReplicaReconciliation:
        """Load on ``replica`` what it lacks of ``expected`` (backend name -> path); report by adapter id (``ids``:
        backend name -> id; a replaced adapter is served as ``id@n``, but the user knows it as ``id``)."""
        try:
            served = await self.lora.served(replica)
        except InferenceError as error:
            return ReplicaReconciliation(base_url=replica.http.shown_url, error=str(error))
        reloaded: list[str] = []
        failed: list[str] = []
        mismatched: list[str] = []
        for name in sorted(expected):
            path = expected[name]
            if path is None:
                continue
            if served.get(name):  # held: from this path, or other weights under the name
                if same_adapter_path(path, served[name]):
                    self._other_weights.discard((replica.base_url, name))
                else:
                    self._other_weights.add((replica.base_url, name))
                    mismatched.append(ids.get(name, name))
                    self._logger.error(
                        "%s serves adapter %r from %s, not from %s where it was loaded from here: its requests are "
                        "not sent there while it does", replica.http.where, ids.get(name, name), served[name], path,
                    )
                continue
            if name in served:
                continue  # listed without a path: nothing says whose it is
            try:
                started = time.perf_counter()
                loaded = await self._load_on(replica, name, path, healing=True)
            except ServerAdapterAlreadyLoadedError as error:  # another client gave the name other weights meanwhile
                self._logger.error("%s", error)
                mismatched.append(ids.get(name, name))
                continue
            except InferenceError as error:
                self._logger.error("%s: could not load adapter %r again: %s", replica.http.where, name, error)
                failed.append(ids.get(name, name))
                continue
            if loaded:  # else the server has it but does not list it (some vLLM versions)
                self._registry.note("reload", name, _ms_since(started), healed=True, replica=replica.http.shown_url)
                reloaded.append(ids.get(name, name))
        return ReplicaReconciliation(
            base_url=replica.http.shown_url,
            reloaded=tuple(reloaded),
            failed=tuple(failed),
            unexpected=tuple(sorted(set(served) - set(expected))),
            mismatched=tuple(mismatched),
        )

    async def listings(self) -> dict[str, list[str] | str]:
        """What each replica holds now, by its own model list: base URL (as shown: credentials written into it are
        ``***``) -> sorted adapter ids, or the error that replica gave (one that cannot be reached is reported, not
        raised)."""

        async def one(replica: Replica) -> list[str] | str:
            try:
                return sorted(await self.lora.served(replica))
            except InferenceError as error:
                return f"{type(error).__name__}: {error}"

        listings = await asyncio.gather(*(one(replica) for replica in self._replicas))
        return {replica.http.shown_url: listing for replica, listing in zip(self._replicas, listings, strict=True)}

    async def _served_by_replicas(self) -> list[dict[str, str]]:
        """What each replica that answers lists (see :meth:`RuntimeLoRA.served`), in configuration order.

        A replica that fails is logged and left out, as long as another one answered: adapters are loaded
        on every replica, so the others say what the provider serves.

        Raises:
            ProviderUnavailableError: No replica accepts connections.
            InferenceError: No replica answered, and one failed otherwise (its error, e.g. a refused key).
        """
        return await self._replicas.answers(self.lora.served, "list its adapters")

    async def list_adapters(self) -> list[str]:
        """The adapters loaded here, and every LoRA adapter the servers list (the union over replicas), less those
        being unloaded.

        Raises:
            ProviderUnavailableError: No replica accepts connections.
            ProtocolError: The answer is not a model list.
        """
        served = {_adapter_id(name) for listing in await self._served_by_replicas() for name in listing}
        registry = self._registry
        loaded = set(registry.ids())
        being_unloaded = {adapter_id for adapter_id in served - loaded if registry.path_of(adapter_id) is not None}
        return sorted(loaded | (served - being_unloaded))

    async def discover(self, adapter_id: str) -> str | Discovered | None:
        """An adapter a server lists but this provider did not load: its path, or (an id another process replaced,
        served as ``id@n``) the newest such name; ``None`` when no replica that answers lists it.

        Raises:
            ProviderUnavailableError: No replica accepts connections (the id cannot be looked up).
        """
        listings = await self._served_by_replicas()
        for served in listings:
            if adapter_id in served:
                return served[adapter_id] or adapter_id
        # an id another process replaced: the newest of the versioned names it left (``id@n``)
        versions = [
            (parsed[1], name, served[name] or name)
            for served in listings
            for name in served
            if (parsed := parse_versioned_name(name)) is not None and parsed[0] == adapter_id
        ]
        if not versions:
            return None
        version, name, path = max(versions)
        return Discovered(path=path, backend=name, version=version)
