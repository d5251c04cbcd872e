"""`python -m proxy` is `mcp-recovery-proxy`."""

import sys

from proxy.cli import main

sys.exit(main())
