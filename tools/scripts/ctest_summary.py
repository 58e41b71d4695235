#!/usr/bin/env python3
"""One summary line for a ctest run, from its JUnit file (ctest --output-junit).

    ctest_summary.py NAME JUNIT.xml [--slowest N] [--wall SECONDS]

Prints
    == actplace: NAME: P passed, S skipped, F failed of T tests in X s
(X: --wall, the ctest run's wall time, else the test times summed)
followed by the skipped and failed test names and the N (default 10) slowest
tests with their times. Exits 1 when the file is missing or unreadable (the
ctest run itself decides the pass/fail of the configuration).
"""
import argparse
import sys
import xml.etree.ElementTree as ET


def summarize(name, path, slowest, wall=None):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"== actplace: {name}: no ctest summary ({path}: {e})")
        return 1
    passed, skipped, failed = [], [], []
    times = []
    for case in root.iter("testcase"):
        test = case.get("name", "?")
        seconds = float(case.get("time", "0") or 0)
        times.append((seconds, test))
        status = case.get("status", "")
        if case.find("skipped") is not None or status in ("notrun", "disabled"):
            skipped.append(test)
        elif case.find("failure") is not None or status == "fail":
            failed.append(test)
        else:
            passed.append(test)
    if wall is None:
        took = f"{sum(t for t, _ in times):.1f} s (test times summed)"
    else:
        took = f"{wall:.0f} s"
    print(f"== actplace: {name}: {len(passed)} passed, {len(skipped)} skipped, "
          f"{len(failed)} failed of {len(times)} tests in {took}")
    if skipped:
        print(f"   skipped: {' '.join(skipped)}")
    if failed:
        print(f"   failed: {' '.join(failed)}")
    times.sort(reverse=True)
    print(f"   {min(slowest, len(times))} slowest:")
    for seconds, test in times[:slowest]:
        print(f"   {seconds:8.1f} s  {test}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("junit")
    ap.add_argument("--slowest", type=int, default=10)
    ap.add_argument("--wall", type=float, help="wall seconds of the ctest run")
    a = ap.parse_args()
    return summarize(a.name, a.junit, a.slowest, a.wall)


if __name__ == "__main__":
    sys.exit(main())
