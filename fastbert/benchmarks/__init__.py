"""Measurement logic shared by `fastbert bench` and the pytest-benchmark suites in bench/."""
