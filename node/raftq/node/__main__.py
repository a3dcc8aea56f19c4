import sys

from raftq.node.cli import main

sys.exit(main())
