"""The operator's side of the KV transport preflight: when to run it, the verdict (plan, pure)
and the one HTTP call to a decode pod (io)."""
