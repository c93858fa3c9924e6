#!/usr/bin/env python3
"""Check a --plot SVG: well-formed XML, the expected charts, a line per legend
entry with at least a given number of points, dashed lines where expected.
  svg_check.py FILE --charts N --legend a,b,c [--dashed x,y] [--min-points K]"""
import argparse
import re
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
p = argparse.ArgumentParser()
p.add_argument("file")
p.add_argument("--charts", type=int, required=True)
p.add_argument("--legend", required=True, help="every chart's legend, comma-separated")
p.add_argument("--dashed", default="", help="legend entries drawn dashed")
p.add_argument("--min-points", type=int, default=2)
a = p.parse_args()

root = ET.parse(a.file).getroot()
assert root.tag == NS + "svg", root.tag
charts = [root] if a.charts == 1 and not root.findall(f"./{NS}g") else [g.find(f"{NS}svg") for g in root.findall(f"./{NS}g")]
assert len(charts) == a.charts, f"{len(charts)} charts, expected {a.charts}"
want = a.legend.split(",")
dashed = set(filter(None, a.dashed.split(",")))
for c in charts:
    paths = c.findall(f"{NS}path")
    # The legend's texts are the last texts, one per named line, coloured like it.
    legend = [t for t in c.findall(f"{NS}text") if t.get("fill")]
    names = [t.text for t in legend]
    assert names == want, f"legend {names}, expected {want}"
    for t in legend:
        line = [q for q in paths if q.get("stroke") == t.get("fill")]
        assert line, f"no line for {t.text}"
        points = len(re.findall(r"[ML][0-9.\-]+,[0-9.\-]+", line[0].get("d")))
        assert points >= a.min_points, f"{t.text}: {points} points"
        assert (line[0].get("stroke-dasharray") is not None) == (t.text in dashed), f"{t.text}: dashed?"
print(f"{a.file}: {len(charts)} chart(s), lines {want}")
