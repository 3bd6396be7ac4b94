"""pdfleet: a Kubernetes operator for prefill/decode disaggregated LLM inference fleets."""

__version__ = "0.1.0"
