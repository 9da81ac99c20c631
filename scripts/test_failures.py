#!/usr/bin/env python3
"""Name the failed tests of a Molecule scenario, last thing in the output.

A scenario that fails still runs its destroy, whose output then ends the log: a CI that shows only the log's tail
would show no test name. The verifier writes JUnit XML (.config/molecule/config.yml); this prints one line per
failed or errored test with the start of its message, so the tail says what failed.

    test_failures.py JUNIT_XML...
"""
import sys
import xml.etree.ElementTree as ET

MESSAGE_CHARS = 400


def failures(path):
    """[(test id, first part of the failure message)] of one JUnit XML file."""
    root = ET.parse(path).getroot()
    out = []
    for case in root.iter("testcase"):
        for problem in list(case.findall("failure")) + list(case.findall("error")):
            message = " ".join((problem.get("message") or problem.text or "").split())
            name = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
            out.append((name, message[:MESSAGE_CHARS]))
    return out


def main(paths):
    for path in paths:
        try:
            found = failures(path)
        except (OSError, ET.ParseError) as e:
            print(f"{path}: no test report ({e}): the scenario failed before its verifier ran, or in it")
            continue
        print(f"{path}: {len(found)} failed test(s)")
        for name, message in found:
            print(f"FAILED {name}: {message}")


if __name__ == "__main__":
    main(sys.argv[1:])
