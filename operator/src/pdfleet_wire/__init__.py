"""Types shared by the operator (`pdfleet`) and the worker (`pdfleet_worker`)."""
