import sys

from workbench.launch.cli import main

sys.exit(main())
