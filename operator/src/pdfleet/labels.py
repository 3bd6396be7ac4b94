"""Every label, annotation and finalizer key pdfleet puts on objects, in one place.

Render, observe, drain and the test bridge all import these names, so a key is spelled once.
"""

from __future__ import annotations

GROUP = "pdfleet.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ("pdis",)
CATEGORIES = ("pdfleet",)

FIELD_MANAGER = "pdfleet-operator"

# Labels on every child object and pod.
SERVICE = f"{GROUP}/service"
ROLE = f"{GROUP}/role"
APP_NAME = "app.kubernetes.io/name"
APP_INSTANCE = "app.kubernetes.io/instance"
APP_COMPONENT = "app.kubernetes.io/component"
APP_PART_OF = "app.kubernetes.io/part-of"
APP_MANAGED_BY = "app.kubernetes.io/managed-by"

ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"
ROLE_ROUTER = "router"
# The proxy that holds requests while a service sleeps (spec.autoscaling.scaleToZero).
ROLE_ACTIVATOR = "activator"
WORKER_ROLES = (ROLE_PREFILL, ROLE_DECODE)

# On worker pods (from their StatefulSet's template) and on the router's pods: the KV revision
# (pdfleet.rollout.revision) the workers run, and the one the router pairs. A router pod selects
# workers of its own revision only, so a prefill and a decode of different revisions never meet.
KV_REVISION = f"{GROUP}/kv-revision"
# Set on a worker pod while it is being drained (value: RFC 3339 start time).
DRAINING = f"{GROUP}/draining"
# Multus secondary networks for the RDMA fabric.
MULTUS_NETWORKS = "k8s.v1.cni.cncf.io/networks"
# Change its value on an InferenceService to run the KV transport preflight again.
PREFLIGHT_RERUN = f"{GROUP}/kv-preflight"
