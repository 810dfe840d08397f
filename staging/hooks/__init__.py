"""Startup-hook downloads for Determined: the hook script, `hook run`, `fetch`.

- :mod:`lading.hooks.stage`: stage a dataset once per node: a prefix through ``lading sync``'s
  engine (DEST's lock, its state record as the completion marker), one object with a marker and
  lock beside the file; per-slot hard-link views ``{dest}-rank{i}``.
- :mod:`lading.hooks.fetch`: ``lading fetch URI DEST`` (object or prefix, ``cp``-like DEST).
- :mod:`lading.hooks.run`: the experiment config's ``data.datasets`` section.
- :mod:`lading.hooks.script`: generate / update ``startup-hook.sh`` between marker comments.
"""
