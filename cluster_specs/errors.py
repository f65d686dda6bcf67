"""Errors raised by ``cluster_specs``."""
from __future__ import annotations


class ClusterSpecError(ValueError):
    """A cluster spec could not be found, parsed, validated or used as asked.

    Messages are a single line that names the cluster or file and the field at fault, so the CLI
    can print them verbatim.
    """
