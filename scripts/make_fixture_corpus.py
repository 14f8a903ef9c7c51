#!/usr/bin/env python3
"""Writes fixtures/corpus.jsonl: a small deterministic English-like corpus (200 documents) for
tests and for the demo index that `rankserve serve` builds.

Words follow a Zipf law over a fixed vocabulary; every document has title, body, anchor and url
streams and two static features. A few edge documents are appended: Unicode text, an empty body,
no streams at all, a very long word, phrase breaks of every kind.

Usage: python3 scripts/make_fixture_corpus.py > fixtures/corpus.jsonl
"""
import json
import random

WORDS = """the of and to in a is that for it as was with be by on not he this are or his from at which
but have an they you were her she all their one there been has more if will would when who what so no
up out about into than can other some time them only new these may its two first then do any like my
now over such our man me even most made after also did many before must through back years where much
your way well down should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same another know while
last might us great old year off come since against go came right used take three search engine index
query rank ranking document documents web page pages link links gpu cpu fast faster speed memory cache
list lists posting postings block blocks compress compression decode encode integer integers gap gaps
score scores model models tree trees neural network feature features learning machine server request
latency throughput batch kernel thread threads warp core cores power energy river mountain forest ocean
city music film book garden kitchen coffee bread cheese apple orange winter summer spring autumn train
bicycle harbour castle bridge museum library school market festival island desert valley lake storm""".split()

STOPS = set(WORDS[:60])


def zipf_choice(rng, words, s=1.0):
    weights = [1.0 / (i + 1) ** s for i in range(len(words))]
    return rng.choices(words, weights=weights)[0]


def sentence(rng, n, skip_stops=False):
    out = []
    while len(out) < n:
        w = zipf_choice(rng, WORDS)
        if skip_stops and w in STOPS:
            continue
        out.append(w)
    out[0] = out[0].capitalize()
    return " ".join(out)


def text(rng, n_words, skip_stops=False):
    parts, left = [], n_words
    while left > 0:
        k = min(left, rng.randint(4, 14))
        parts.append(sentence(rng, k, skip_stops) + rng.choice([".", ".", ".", "!", "?", ";", ":", ".\n"]))
        left -= k
    return " ".join(parts).strip()


def main():
    rng = random.Random(20261122)
    docs = []
    for i in range(195):
        title = sentence(rng, rng.randint(2, 7), skip_stops=True)
        body = text(rng, rng.randint(20, 160))
        anchor = "" if rng.random() < 0.4 else text(rng, rng.randint(1, 8), skip_stops=True)
        host = zipf_choice(rng, WORDS[60:])
        path = "/".join(zipf_choice(rng, WORDS[60:]) for _ in range(rng.randint(1, 3)))
        docs.append({
            "id": f"doc-{i:03d}",
            "streams": {"title": title, "body": body, "anchor": anchor, "url": f"https://www.{host}.example/{path}"},
            "static": {"static_rank": round(rng.random(), 4), "url_depth": path.count("/") + 1},
        })
    docs.append({"id": "doc-unicode", "streams": {"title": "Café Ärger", "body": "Straße ÉCOLE naïve café. 東京 search; Ελληνικά index!"},
                 "static": {"static_rank": 0.5, "url_depth": 1}})
    docs.append({"id": "doc-empty-body", "streams": {"title": "Nothing here", "body": ""}, "static": {"static_rank": 0.1, "url_depth": 1}})
    docs.append({"id": "doc-no-streams"})
    docs.append({"id": "doc-long-word", "streams": {"body": "search " + "x" * 300 + " index"}, "static": {"static_rank": 0.2, "url_depth": 2}})
    docs.append({"id": "doc-breaks", "streams": {"body": "fast gpu. fast cpu! fast cache? gpu; cpu: cache\nsearch index\r\nrank"},
                 "static": {"static_rank": 0.9, "url_depth": 1}})
    for d in docs:
        print(json.dumps(d, ensure_ascii=False))


if __name__ == "__main__":
    main()
