"""`microscale eval --svg`: the plot is well-formed SVG with one series (marker and label) per mode,
placed as the CSV's numbers say; a title from a model directory whose name holds markup characters
and bytes that are not UTF-8 still parses.

usage: cli_eval_svg.py CLI WRITER WORKDIR (WRITER writes a checkpoint, tests/cpp/write_nonfinite_checkpoint.cpp)
"""

import csv
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def run(*args):
    r = subprocess.run(args, capture_output=True)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stderr.decode(errors='replace')}"


def series(path):
    root = ET.parse(path).getroot()  # raises on a document that is not well-formed
    assert root.tag == SVG + "svg", root.tag
    return [g for g in root.iter(SVG + "g") if g.get("class") == "series"]


def main(cli, writer, workdir):
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    csv_path, svg_path = os.path.join(workdir, "eval.csv"), os.path.join(workdir, "eval.svg")
    modes = ["nvfp4", "mxfp4", "mxfp8-e4m3", "affine2-g64", "affine8-g64"]
    run(cli, "eval", "--rows", "8", "--cols", "256", "--repeats", "1", "--modes", ",".join(modes),
        "--csv", csv_path, "--svg", svg_path)
    summary = [r for r in csv.DictReader(open(csv_path)) if r["matrix"] == "all"]
    groups = series(svg_path)
    assert [g.find(SVG + "text").text for g in groups] == modes, [g.find(SVG + "text").text for g in groups]
    for g in groups:
        assert len(g.findall(SVG + "circle")) == 1 and len(g.findall(SVG + "text")) == 1, ET.tostring(g)
    # x grows with bits per value; y (a log axis, down the page) shrinks as the error grows.
    points = [(float(r["bits_per_value"]), float(r["rel_error"]), int(g.find(SVG + "circle").get("cx")),
               int(g.find(SVG + "circle").get("cy"))) for r, g in zip(summary, groups)]
    for a in points:
        for b in points:
            if a[0] < b[0]:
                assert a[2] < b[2], (a, b)
            if a[1] < b[1] / 1.1:
                assert a[3] > b[3], (a, b)

    # A model directory named with markup and a byte that is not UTF-8: its weights hold a NaN, so
    # nothing is plotted, but the title names the directory and must still parse.
    model = os.path.join(os.fsencode(workdir), b"m&<\"\xff\x01")
    run(writer, model)
    run(cli, "eval", model, "--repeats", "1", "--csv", csv_path, "--svg", svg_path)
    assert series(svg_path) == []
    title = ET.parse(svg_path).getroot().find(SVG + "title").text
    assert title.endswith('(m&<"??)'), title
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
