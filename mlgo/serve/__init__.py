"""Artifacts answering real builds: the policy service, its client and the mlgo-cc wrapper."""
