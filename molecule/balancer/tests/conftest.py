import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "shared", "tests"))


def pytest_configure(config):
    config.addinivalue_line("markers", "continues: the test starts from the state the previous test left")
