#!/usr/bin/env python3
"""Prints the slowest test binaries of a cargo-nextest JUnit report (scripts/test.sh runs it
after the tests, passed or not, so a slow test shows up in every run).

    scripts/test-times.py target/nextest/ci/junit.xml [N]

A binary's time is the sum of its tests' times (they may have run beside other binaries'
tests); the wall-clock span of the whole run is printed too.
"""

import sys
import xml.etree.ElementTree as ET


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"test-times: cannot read {path}: {e}", file=sys.stderr)
        return 1
    per_binary = {}
    tests = 0
    for suite in root.iter("testsuite"):
        total = 0.0
        count = 0
        for case in suite.iter("testcase"):
            total += float(case.get("time", "0") or 0)
            count += 1
        tests += count
        per_binary[suite.get("name", "?")] = (total, count)
    wall = float(root.get("time", "0") or 0)
    ranked = sorted(per_binary.items(), key=lambda kv: kv[1][0], reverse=True)
    print(f"test-times: {tests} tests in {len(per_binary)} binaries, {wall:.0f} s wall clock")
    print(f"the {min(top, len(ranked))} slowest binaries (sum of their tests' times):")
    for name, (total, count) in ranked[:top]:
        print(f"  {total:8.1f} s  {count:4d} tests  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
