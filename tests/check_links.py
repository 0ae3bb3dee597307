"""Checks the links of the repository's Markdown documentation (README.md, the other top-level
*.md files and docs/*.md): each must name a file or folder that exists inside the repository.
Links to web addresses, absolute paths and paths that leave the repository (../sibling/...) fail,
so the documentation reads the same from any checkout. Usage: check_links.py REPO_ROOT
"""
import pathlib
import re
import sys

# [text](target "title"), ![alt](target), reference definitions "[name]: target", <a href="...">,
# <img src="...">, and bare web addresses (autolinks included).
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HTML = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']*)["']""", re.IGNORECASE)
WEB = re.compile(r"\b(?:(?:https?|ftp)://|www\.|mailto:)[^\s)>\]\"']+", re.IGNORECASE)
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")


def documents(root):
    yield from sorted(root.glob("*.md"))
    yield from sorted((root / "docs").glob("*.md"))


def links(text):
    """(line number, target) of every link outside code blocks and code spans."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        opener = FENCE.match(line)
        if fence:
            if opener and opener.group(1) == fence:
                fence = None
            continue
        if opener:
            fence = opener.group(1)
            continue
        prose = CODE_SPAN.sub("", line)
        targets = [m.group(1) for pattern in (INLINE, REFERENCE, HTML) for m in pattern.finditer(prose)]
        # A web address inside [text](...) is already one of the targets.
        targets += [m.group(0) for m in WEB.finditer(prose) if m.group(0) not in targets]
        for target in targets:
            yield number, target


def problem(root, document, target):
    """Why the link to target from document does not resolve inside the repository, or None."""
    if not target:
        return "empty link"
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("//", "www.")):
        return "points outside the repository (only links to the repository's own files are allowed)"
    path = target.split("#", 1)[0].split("?", 1)[0]
    if not path:
        return None  # an anchor in the same document
    if path.startswith("/"):
        return "absolute path (use a path relative to the document)"
    resolved = (document.parent / path).resolve()
    if not resolved.is_relative_to(root):
        return "leaves the repository"
    if not resolved.exists():
        return f"no such file in the repository: {resolved.relative_to(root)}"
    return None


def broken_links(root):
    """(number of links checked, one line per broken link)."""
    root = root.resolve()
    failures = []
    checked = 0
    for document in documents(root):
        for number, target in links(document.read_text(encoding="utf-8")):
            checked += 1
            why = problem(root, document, target)
            if why:
                failures.append(f"{document.relative_to(root)}:{number}: {target}: {why}")
    return checked, failures


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_links.py REPO_ROOT")
    checked, failures = broken_links(pathlib.Path(sys.argv[1]))
    for failure in failures:
        print(failure)
    print(f"{checked} links checked, {len(failures)} broken")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
