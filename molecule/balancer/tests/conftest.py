def pytest_configure(config):
    config.addinivalue_line("markers", "continues: the test starts from the state the previous test left")
