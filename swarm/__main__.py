import sys

from swarm.cli.main import main

sys.exit(main())
