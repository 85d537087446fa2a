"""`python -m gui`: open the app."""

import sys

from gui.app import main

if __name__ == "__main__":
    sys.exit(main())
