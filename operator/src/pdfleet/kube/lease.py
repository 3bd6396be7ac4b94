"""Leader election on a coordination.k8s.io Lease: one active operator replica at a time.

Standby replicas wait to acquire the Lease; the leader renews it. A leader that cannot renew
before the lease expires stops itself (the process exits and its pod restarts as a standby),
so two replicas never reconcile at once for longer than one renew attempt. This is the
client-go/controller-runtime scheme, chosen over kopf peering because it needs no extra CRD
and no cluster-wide rights.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _micro(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


@dataclass(frozen=True)
class LeaseState:
    holder: str | None
    renewed: datetime | None
    duration_s: int
    transitions: int


def can_take(state: LeaseState, identity: str, now: datetime) -> bool:
    """Pure: may `identity` hold the lease now (it holds it, or the holder let it expire)?"""
    if state.holder in (None, "", identity) or state.renewed is None:
        return True
    return now >= state.renewed + timedelta(seconds=state.duration_s)


#: How long a Lease stays held without a renewal (client-go's default too).
LEASE_DURATION_S = 15
# What a renewal may fail with: an API error (409 from a stale read, 429, 5xx) or no answer at
# all (the API server restarting: connection refused, timeouts). None of them means another
# replica holds the lease.
TRANSIENT = (ApiException, urllib3.exceptions.HTTPError, OSError)


def renewal_verdict(
    renewed: bool, held_by_other: bool, since_ok_s: float, deadline_s: float
) -> str:
    """Pure: after one renewal attempt, "renewed", "retry" or "lost".

    Lost only when another replica holds the lease, or when no renewal has succeeded for
    `deadline_s` (shorter than the lease, so this replica stops before another may start)."""
    if renewed:
        return "renewed"
    if held_by_other or since_ok_s >= deadline_s:
        return "lost"
    return "retry"


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: int = LEASE_DURATION_S,
        renew_every_s: float = 5.0,
        clock: Callable[[], datetime] = _now,
        retry_every_s: float = 1.0,
    ):
        self.coordination = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration_s = lease_duration_s
        self.renew_every_s = renew_every_s
        # After a failed renewal, try again this soon, so that a few refused or throttled
        # writes (409 on a stale read, 429 with Retry-After: 1) do not use up the renew
        # deadline: six attempts fit in it, where client-go, renewing every 2 s, makes five.
        self.retry_every_s = min(retry_every_s, renew_every_s)
        self.clock = clock

    def _read(self) -> tuple[Any, LeaseState] | None:
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        spec = lease.spec or client.V1LeaseSpec()
        return lease, LeaseState(
            holder=spec.holder_identity,
            renewed=_parse(spec.renew_time),
            duration_s=int(spec.lease_duration_seconds or self.duration_s),
            transitions=int(spec.lease_transitions or 0),
        )

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this identity holds the lease afterwards."""
        now = self.clock()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "renewTime": _micro(now),
        }
        found = self._read()
        try:
            if found is None:
                body = {
                    "metadata": {"name": self.name},
                    "spec": {**spec, "acquireTime": _micro(now), "leaseTransitions": 0},
                }
                self.coordination.create_namespaced_lease(self.namespace, body)  # type: ignore[arg-type]
                return True
            lease, state = found
            if not can_take(state, self.identity, now):
                return False
            if state.holder != self.identity:
                spec["acquireTime"] = _micro(now)
                spec["leaseTransitions"] = state.transitions + 1
            # resourceVersion makes this a compare-and-swap: a racing replica gets 409.
            body = {
                "metadata": {"name": self.name, "resourceVersion": lease.metadata.resource_version},
                "spec": spec,
            }
            self.coordination.replace_namespaced_lease(self.name, self.namespace, body)  # type: ignore[arg-type]
            return True
        except ApiException as error:
            if error.status in (409, 422):
                return False
            raise

    def wait_for_leadership(self, stop: threading.Event) -> bool:
        log.info("waiting for leader lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    log.info("acquired leader lease %s/%s", self.namespace, self.name)
                    return True
            except TRANSIENT as error:
                log.warning("lease check failed: %s", _reason(error))
            stop.wait(self.renew_every_s)
        return False

    @property
    def renew_deadline_s(self) -> float:
        """Give up this long after the last successful renewal: one renew period before the
        lease expires, as client-go's renewDeadline, so two replicas never overlap."""
        return max(self.duration_s - self.renew_every_s, self.renew_every_s)

    def _held_by_other(self) -> bool:
        found = self._read()
        return found is not None and found[1].holder not in (None, "", self.identity)

    def keep_renewing(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew until `stop`; call `on_lost` once another replica holds the lease or renewal
        has failed until the renew deadline. A conflict (409), throttling (429) or an unreachable
        API server is retried after `retry_every_s`: it says nothing about who holds the lease."""
        last_ok = self.clock()
        wait_s = self.renew_every_s
        while not stop.wait(wait_s):
            renewed = held_by_other = False
            try:
                renewed = self.try_acquire_or_renew()
                held_by_other = not renewed and self._held_by_other()
            except TRANSIENT as error:
                log.warning("lease renewal failed: %s", _reason(error))
            if renewed:
                last_ok = self.clock()
            wait_s = self.renew_every_s if renewed else self.retry_every_s
            since_ok = (self.clock() - last_ok).total_seconds()
            verdict = renewal_verdict(renewed, held_by_other, since_ok, self.renew_deadline_s)
            if verdict == "lost":
                log.error(
                    "leader lease %s/%s lost (%s)",
                    self.namespace,
                    self.name,
                    "held by another replica"
                    if held_by_other
                    else f"not renewed for {since_ok:.0f}s",
                )
                on_lost()
                return

    def release(self) -> None:
        """Give the lease up on a clean shutdown so a standby takes over at once."""
        try:
            found = self._read()
        except TRANSIENT as error:  # no API server: the lease simply expires
            log.warning("could not release the lease: %s", _reason(error))
            return
        if found is None or found[1].holder != self.identity:
            return
        lease = found[0]
        expired = self.clock() - timedelta(seconds=self.duration_s)
        spec = {
            "holderIdentity": "",
            "leaseDurationSeconds": self.duration_s,
            "renewTime": _micro(expired),
        }
        body = {
            "metadata": {"name": self.name, "resourceVersion": lease.metadata.resource_version},
            "spec": spec,
        }
        try:
            self.coordination.replace_namespaced_lease(self.name, self.namespace, body)  # type: ignore[arg-type]
        except ApiException as error:
            log.warning("could not release the lease: %s", error.reason)


def _reason(error: BaseException) -> str:
    return str(getattr(error, "reason", None) or error)
