import sys

from dayzero.cli import main

sys.exit(main())
