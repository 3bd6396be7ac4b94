"""The pdfleet worker agent (launcher, drain hooks) and the vLLM-faithful simulator."""
