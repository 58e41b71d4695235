"""Checks an `actplace-compile --memory-timeline` SVG against the placement
report the same compile wrote (--report-json), for
actplace-compile-memory-timeline.test.

usage: memory-timeline-svg-check.py SVG REPORT_JSON MICROBATCHES

What must hold: the file parses as XML with an <svg> root; the legend's
bytes at the peak add up to the marked peak, which is the report's
predicted peak after placement; the "peak before placement" line is the
report's peak before; one D2H and one H2D bar per offloaded value, whose
bytes times the microbatches are the report's bytes per step; every bar lies
inside the plot. Prints one summary line for FileCheck, exits 1 with a
message on the first violation.
"""
import json
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"


def fail(msg):
    print("memory-timeline-svg-check: " + msg)
    sys.exit(1)


def main():
    svg_path, report_path, micro_batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    root = ET.parse(svg_path).getroot()
    if root.tag != NS + "svg":
        fail("root element is %s, not svg" % root.tag)
    report = json.load(open(report_path))
    totals = report["totals"]

    def elements(tag, cls):
        return [e for e in root.iter(NS + tag) if cls in e.get("class", "").split()]

    peak = elements("text", "peak")
    if len(peak) != 1:
        fail("expected one peak label, found %d" % len(peak))
    peak_bytes = int(peak[0].get("data-bytes"))
    if peak_bytes != totals["peak_bytes_after"]:
        fail("peak %d != report peak_bytes_after %d" % (peak_bytes, totals["peak_bytes_after"]))
    legend = [int(e.get("data-bytes")) for e in elements("text", "legend")]
    if sum(legend) != peak_bytes:
        fail("legend bytes at the peak add up to %d, not the peak %d" % (sum(legend), peak_bytes))
    before = [e for e in elements("text", "reference") if e.text.startswith("peak before placement")]
    if len(before) != 1 or int(before[0].get("data-bytes")) != totals["peak_bytes_before"]:
        fail("no 'peak before placement' line with the report's peak_bytes_before")

    areas = elements("path", "area")
    names = [a.get("data-category") for a in areas]
    if "parameters" not in names or len(set(names)) != len(names):
        fail("stack areas %s: parameters missing or a category drawn twice" % names)

    offloaded = sum(1 for v in report["values"] if v["decision"] == "offload")
    copies = {}
    for lane in ("d2h", "h2d"):
        bars = elements("rect", lane)
        if len(bars) != offloaded:
            fail("%d %s bars for %d offloaded values" % (len(bars), lane, offloaded))
        moved = sum(int(b.get("data-bytes")) for b in bars) * micro_batches
        if moved != totals[lane + "_bytes_per_step"]:
            fail("%s bars move %d bytes per step, the report says %d"
                 % (lane, moved, totals[lane + "_bytes_per_step"]))
        copies[lane] = moved
    frame = [r for r in root.iter(NS + "rect") if r.get("stroke") == "#666666" and r.get("fill") == "none"]
    if len(frame) != 1:
        fail("expected one plot frame")
    left = float(frame[0].get("x"))
    right = left + float(frame[0].get("width"))
    for cls in ("d2h", "h2d", "stall", "side", "side-wait"):
        for b in elements("rect", cls):
            x, w = float(b.get("x")), float(b.get("width"))
            if x < left - 1e-6 or x + w > right + 0.7:
                fail("%s bar at x=%g width %g outside the plot [%g, %g]" % (cls, x, w, left, right))
    print("svg ok: %d categories, peak %d bytes (before placement %d), %d copies each way, "
          "d2h %d bytes per step, h2d %d bytes per step"
          % (len(legend), peak_bytes, totals["peak_bytes_before"], offloaded, copies["d2h"], copies["h2d"]))


if __name__ == "__main__":
    main()
