#!/usr/bin/env python3
"""Prints the slowest test binaries of a cargo-nextest JUnit report (scripts/test.sh runs it
after the tests, passed or not, so a slow test shows up in every run).

    scripts/test-times.py target/nextest/ci/junit.xml [N]

A binary's time is the sum of its tests' times (they may have run beside other binaries'
tests); the wall-clock span of the whole run is printed too. A crate's merged integration
binary (`tests/it/main.rs`, nextest's `CRATE::it`) is counted per module, as the binary each
module was before (`farm::it::balance`), so the list names what is slow.
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
        binary = suite.get("name", "?")
        for case in suite.iter("testcase"):
            name = binary
            if binary.endswith("::it"):
                name = f"{binary}::{case.get('name', '?').split('::')[0]}"
            total, count = per_binary.get(name, (0.0, 0))
            per_binary[name] = (total + float(case.get("time", "0") or 0), count + 1)
            tests += 1
    wall = float(root.get("time", "0") or 0)
    ranked = sorted(per_binary.items(), key=lambda kv: kv[1][0], reverse=True)
    binaries = len({n.removesuffix("::" + n.split("::")[-1]) if "::it::" in n else n for n in per_binary})
    print(f"test-times: {tests} tests in {binaries} binaries, {wall:.0f} s wall clock")
    print(f"the {min(top, len(ranked))} slowest binaries (sum of their tests' times):")
    for name, (total, count) in ranked[:top]:
        print(f"  {total:8.1f} s  {count:4d} tests  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
