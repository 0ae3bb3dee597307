"""Tests of check_links.py on a small repository written here: it must accept links to the
repository's files and report every other link, with its file and line."""
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from check_links import broken_links  # noqa: E402

README = """# project
[contract](docs/guide.md#rounding) and [layout](src/) and [top](#project)
![plot](docs/missing.png)
see [sibling](../sibling/notes.md) or [web](https://example.com/page) or <http://example.org>
[absolute](/etc/passwd) [mail](mailto:someone@example.com)

[ref]: docs/nowhere.md
<a href="docs/guide.md">guide</a> <img src="img/logo.svg">
`[code span](not/checked.md)`
```
[fenced](not/checked/either.md) https://in.code.block
```
"""
GUIDE = """[back](../README.md) [escape](../../outside.md) [self](guide.md)
"""


def main():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp) / "repo"
        (root / "docs").mkdir(parents=True)
        (root / "src").mkdir()
        (root / "README.md").write_text(README)
        (root / "docs" / "guide.md").write_text(GUIDE)
        checked, failures = broken_links(root)
    reported = sorted(f.split(": ", 2)[0] + " " + f.split(": ", 2)[1] for f in failures)
    expected = sorted([
        "README.md:3 docs/missing.png",
        "README.md:4 ../sibling/notes.md",
        "README.md:4 https://example.com/page",
        "README.md:4 http://example.org",
        "README.md:5 /etc/passwd",
        "README.md:5 mailto:someone@example.com",
        "README.md:7 docs/nowhere.md",
        "README.md:8 img/logo.svg",
        "docs/guide.md:1 ../../outside.md",
    ])
    assert reported == expected, "\n".join(["reported:"] + failures + ["expected:"] + expected)
    # The four good links of README.md's line 2 and 8, and two of docs/guide.md, pass.
    assert checked == len(expected) + 6, checked
    print(f"check_links.py: {checked} links, the {len(expected)} bad ones reported")


if __name__ == "__main__":
    main()
