"""Which Multus NetworkAttachmentDefinitions exist, for the check that the networks a fabric
names do (reconcile/status.py: PodsStuck, reason NetworkAttachmentMissing).

A pod whose network is missing shows only ContainerCreating in its status (Multus's failure
is an Event on the pod), so the operator looks at the networks themselves. A pass must not
read the API server, so they are watched like the children (kube/informer.py), with two
differences: the kind is a CRD many clusters lack, or one the operator may not be allowed to
read (a chart older than this check): then the check is skipped, said once in the log, and the
kind looked for again every ABSENT_RETRY_S; and a NetworkAttachmentDefinition belongs to no
service, so a change of one concerns the services of its namespace that name networks.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes import client

from pdfleet.kube.informer import Informer, OwnedStore, OwnerKey, Projection, object_key

log = logging.getLogger(__name__)

KIND = "NetworkAttachmentDefinition"
# What the list answers when the CRD is not installed (404) or not granted (403).
ABSENT = (403, 404)
ABSENT_RETRY_S = 300.0
# The owner key a namespace's NetworkAttachmentDefinitions are kept under: (namespace, "").
EVERY_NAME = ""


def _namespace_of(obj: Mapping[str, Any]) -> OwnerKey:
    return object_key(obj)[0], EVERY_NAME


def _name_of(obj: Mapping[str, Any]) -> str:
    return object_key(obj)[1]


class NetworkCache:
    """NetworkAttachmentDefinition names by namespace, known only once listed."""

    def __init__(self) -> None:
        self.store: OwnedStore[str] = OwnedStore(Projection(owner=_namespace_of, value=_name_of))
        self._listed: set[str | None] = set()

    def listed(self, scope: str | None) -> None:
        """A listing of `scope` (a namespace; None: the cluster) is in the store."""
        self._listed.add(scope)

    def names(self, namespace: str) -> frozenset[str] | None:
        """The names in `namespace`; None while no listing covers it (the CRD is absent, not
        readable, or not listed yet): the operator cannot tell a missing network then."""
        if None not in self._listed and namespace not in self._listed:
            return None
        return frozenset(self.store.owned_by((namespace, EVERY_NAME)))

    def informers(
        self,
        api: client.ApiClient,
        scopes: Iterable[str | None],
        on_change: Callable[[str], None],
    ) -> list[Informer[str]]:
        """One informer per scope; `on_change` gets the namespace whose networks changed."""
        return [
            OptionalInformer(
                api, KIND, scope, "", self.store,
                on_change=lambda owner: on_change(owner[0]),
                on_synced=functools.partial(self.listed, scope),
            )
            for scope in scopes
        ]  # fmt: skip


class OptionalInformer(Informer[Any]):
    """An informer of a kind that may be missing: while listing it answers 403 or 404, it
    waits quietly (said once in the log) and asks again every ABSENT_RETRY_S; once the kind
    answers, the ordinary list-and-watch loop takes over."""

    def absent(self) -> int | None:
        """403 or 404 when the kind cannot be listed; None when it can, or when the failure
        is another (a broken connection is the ordinary loop's to retry, with a back-off)."""
        try:
            self._get([("limit", 1)])
        except client.ApiException as error:
            return error.status if error.status in ABSENT else None
        except Exception:
            return None
        return None

    def run(self, stop: threading.Event) -> None:
        said = False
        while not stop.is_set() and (status := self.absent()) is not None:
            if not said:
                log.info(
                    "%ss cannot be listed (%s): missing networks go unreported; looking "
                    "again every %.0fs", self.kind, status, ABSENT_RETRY_S,
                )  # fmt: skip
                said = True
            stop.wait(ABSENT_RETRY_S)
        super().run(stop)
