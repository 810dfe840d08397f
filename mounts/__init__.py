"""The FUSE layer: a read-only view of a Store. Depends only on the Store protocol."""
