"""Startup-hook downloads for Determined: the hook script, `hook run`, `fetch`.

- :mod:`staging.hooks.stage`: stage a planned set of objects into a destination once per node
  (file lock + completion marker), on top of :func:`staging.transfer.fetch_all`.
- :mod:`staging.hooks.fetch`: plan ``lading fetch URI DEST`` (one object or a prefix).
- :mod:`staging.hooks.run`: the experiment config's ``data.datasets`` section.
- :mod:`staging.hooks.script`: generate / update ``startup-hook.sh`` between marker comments.
"""
