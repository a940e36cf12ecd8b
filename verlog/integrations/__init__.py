"""Bridges from verlog to other training stacks (``verlog.integrations.verl``: verl at scale)."""
