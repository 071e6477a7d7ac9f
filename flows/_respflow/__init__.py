"""respflow: streaming ingest for OpenAI-style Responses API streams, and a gateway built on it.

The distribution installs ONE top-level import package, ``respflow``, with three subpackages:

* `respflow.operators` — the stages (split → normalize → validate → fold → translate), their
  types and errors, and the adapter that lifts a stage into a reactive operator;
* `respflow.sinks` — where frames go: the relay (the one emit funnel to a client) and simple sinks;
* `respflow.flows` — the graph, its drivers, the transport, the gateway and the ``respflow`` CLI.

Imports go one way: operators ← sinks ← flows. This module imports none of them (importing
``respflow`` is free); ``python -m respflow`` runs the CLI.

In the repository this file lives in ``flows/_respflow/`` (the repository's top level is
``flows/ operators/ sinks/``; ``pyproject.toml`` maps each directory under ``respflow``).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("respflow")
except PackageNotFoundError:  # pragma: no cover - running from a tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
