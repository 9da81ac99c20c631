import sys


def pytest_configure(config):
    config.addinivalue_line("markers", "continues: the test starts from the state the previous test left")


def pytest_terminal_summary(terminalreporter):
    """The failover figures test_vip.py measured, for the record (docs/vip.md, issue notes)."""
    module = next((m for name, m in sys.modules.items() if name.endswith("test_vip")), None)
    if getattr(module, "FIGURES", None):
        terminalreporter.section("VIP failover under load (client-1, 8 clients)")
        for line in module.FIGURES:
            terminalreporter.write_line(line)
