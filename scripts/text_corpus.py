#!/usr/bin/env python3
"""A corpus of real English text for `rankserve index build` (issue 21), made from HTML
documentation installed here: by default the Rust toolchain's `rust-docs` component (The Rust
Programming Language, the Reference, Rust by Example, the Nomicon, the rustc, Cargo, rustdoc and
edition books, the error-code index, and the std/core/alloc API pages).

Each page's `<main>` text is cut into sections at its headings (`h1`–`h4`); a section becomes one
document: `title` = the heading's text, `body` = the text under it (paragraphs, list items,
tables, inline code; code listings in `<pre>` are left out: they are not prose), `url` = the
page's path and the heading's anchor. Sections of fewer than --min-words words are dropped, and a
body seen before is dropped (the API pages repeat re-exported items' docs; mdBook's print.html
repeats its book and is skipped). Output: JSON Lines as `rankserve corpus synth` writes them
(`rankserve corpus --help`), documents in path order, so the same input gives the same bytes.

    python3 scripts/text_corpus.py --out text.jsonl [--root DIR ...] [--min-words 8]
"""

import argparse
import glob
import hashlib
import html.parser
import json
import os
import sys
from multiprocessing import Pool

HEADINGS = {"h1", "h2", "h3", "h4"}
SKIPPED = {"pre", "script", "style", "nav", "button", "svg"}
BREAKS = {"p", "li", "tr", "dd", "dt", "div", "section", "blockquote", "br", "table", "ul", "ol"}


class Sections(html.parser.HTMLParser):
    """Collects (anchor, heading, text) sections of a page's <main>."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.in_main = 0
        self.skip = 0
        self.heading = None  # the open heading's text parts
        self.anchor = ""
        self.title = ""
        self.text = []
        self.sections = []

    def flush(self):
        lines = (" ".join(line.split()) for line in "".join(self.text).split("\n"))
        body = "\n".join(line for line in lines if line)
        if body:
            self.sections.append((self.anchor, self.title, body))
        self.text = []

    def handle_starttag(self, tag, attrs):
        if tag == "main":
            self.in_main += 1
        if not self.in_main:
            return
        if tag in SKIPPED:
            self.skip += 1
        elif tag in HEADINGS and not self.skip:
            self.flush()
            self.heading = []
            self.anchor = dict(attrs).get("id") or ""
        elif tag in BREAKS:
            # Block boundaries end a sentence-less run too: a line break is a phrase break.
            self.text.append("\n")

    def handle_endtag(self, tag):
        if not self.in_main:
            return
        if tag == "main":
            self.in_main -= 1
            if not self.in_main:
                self.flush()
        elif tag in SKIPPED:
            self.skip = max(0, self.skip - 1)
        elif tag in HEADINGS and self.heading is not None:
            self.title = " ".join("".join(self.heading).split())
            self.heading = None

    def handle_data(self, data):
        if not self.in_main or self.skip:
            return
        if self.heading is not None:
            self.heading.append(data)
        else:
            self.text.append(data)


def page_sections(path):
    parser = Sections()
    with open(path, encoding="utf-8", errors="replace") as f:
        parser.feed(f.read())
    parser.close()
    return path, parser.sections


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = sorted(glob.glob(os.path.expanduser("~/.rustup/toolchains/*/share/doc/rust/html")))[:1]
    ap.add_argument("--root", action="append", help=f"HTML trees to read (default: {default})")
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-words", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    roots = args.root or default
    if not roots:
        sys.exit("no --root given and no rust-docs component found (rustup component add rust-docs)")

    pages = []
    for root in roots:
        for dirpath, dirnames, files in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in ("src", "static.files", "search.index"))
            pages += [os.path.join(dirpath, f) for f in sorted(files)
                      if f.endswith(".html") and f != "print.html"]
    seen = set()
    docs = words = 0
    with Pool(args.jobs) as pool, open(args.out, "w", encoding="utf-8") as out:
        for path, sections in pool.imap(page_sections, pages, chunksize=64):
            rel = os.path.relpath(path, os.path.commonpath(roots) if len(roots) > 1 else roots[0])
            for n, (anchor, title, body) in enumerate(sections):
                count = len(body.split())
                digest = hashlib.blake2b(body.encode(), digest_size=16).digest()
                if count < args.min_words or digest in seen:
                    continue
                seen.add(digest)
                doc = {"id": f"{rel}#{n}", "streams": {"title": title, "body": body,
                                                                 "url": f"{rel}#{anchor}"}}
                out.write(json.dumps(doc, ensure_ascii=False) + "\n")
                docs += 1
                words += count
    print(f"{docs} documents ({words / max(docs, 1):.0f} words each on average) from {len(pages)} pages "
          f"under {', '.join(roots)} -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
