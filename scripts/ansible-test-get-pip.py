"""ansible-test's pip bootstrap, from PyPI: ansible-test sanity installs each test's requirements in a virtual
environment it bootstraps with get-pip.py from ci-files.testing.ansible.com, which the build hosts cannot reach.
This does what that script does (install pip from the copy of pip it carries) with pip's own wheel from PyPI, saved
beside it by `make sanity`, where ansible-test looks for a manually saved script (~/.ansible/test/cache)."""
import glob
import os
import sys

WHEEL = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pip-*.whl")))[-1]
sys.path.insert(0, WHEEL)  # a wheel is a zip: pip runs from it

from pip._internal.cli.main import main  # noqa: E402

# get-pip.py's own options (no setuptools, no wheel) are its defaults here: only what is named is installed.
ARGS = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--find-links", os.path.dirname(WHEEL)] + ARGS))
