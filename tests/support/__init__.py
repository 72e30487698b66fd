"""Helpers the tests share: servers in subprocesses, ports, source scans."""
