"""Revision-paired rollouts: a change that makes KV incompatible brings up both pools of the new
revision beside the old, moves the router in one step, then retires the old (docs/upgrade.md)."""
