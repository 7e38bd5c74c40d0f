import sys

from gpugeek.cli import main

sys.exit(main())
