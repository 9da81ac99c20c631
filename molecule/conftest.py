"""Every scenario's verify tests import their helpers (molecule/shared/tests/fleet.py) from one place."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "shared", "tests"))
