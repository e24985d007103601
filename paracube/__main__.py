import sys

from paracube.cli.main import main

sys.exit(main())
