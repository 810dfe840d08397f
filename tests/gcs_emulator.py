#!/usr/bin/env python3
"""Run gcp-storage-emulator in memory for tests: ``gcs_emulator.py HOST PORT``.

Two adjustments to the stock server, for tests only: a listen backlog of 1024 (the server
handles one request at a time, and a backlog of 5 stalls concurrent clients on connect), and
no rewrite of the on-disk JSON index after every write (we run in memory, and it makes
uploads slow down with the bucket's size).

Known emulator gaps (tests cover those paths elsewhere or say so): one listing page only,
no startOffset/endOffset, wrong suffix ranges, ifGenerationMatch ignored.
"""

import http.server
import sys

http.server.HTTPServer.request_queue_size = 1024

from gcp_storage_emulator import storage  # noqa: E402
from gcp_storage_emulator.server import create_server  # noqa: E402

storage.Storage._write_config_to_file = lambda self: None  # type: ignore[method-assign]

if __name__ == "__main__":
    create_server(sys.argv[1], int(sys.argv[2]), in_memory=True).run()
