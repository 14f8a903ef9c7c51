//! Indexes from elsewhere and the binary itself: a CIFF import serving the results of the index
//! it came from, and `rankserve serve` building the demo index when given none.

use super::*;

/// The scoring stream of `index` as a CIFF file: lists in sorted term order (terms that occur
/// only in other streams have no list), docID gaps, scoring lengths as document lengths.
fn export_ciff(index: &Index) -> Vec<u8> {
    use prost::Message;
    use rankserve::index::ciff::{DocRecord, Header, Posting, PostingsList};
    use rankserve::index::TERMINATED;
    let mut lists = Vec::new();
    for i in 0..index.num_terms() as usize {
        let (term, id) = index.term_at(i);
        let mut cursor = index.postings(id).cursor();
        let (mut postings, mut previous) = (Vec::new(), 0);
        while cursor.doc() != TERMINATED {
            postings.push(Posting {
                docid: (cursor.doc() - previous) as i32,
                tf: cursor.tf() as i32,
            });
            previous = cursor.doc();
            cursor.advance();
        }
        if !postings.is_empty() {
            lists.push(PostingsList {
                term: term.to_string(),
                df: postings.len() as i64,
                cf: postings.iter().map(|p| p.tf as i64).sum(),
                postings,
            });
        }
    }
    let n = index.num_docs();
    let mut out = Vec::new();
    Header {
        version: 1,
        num_postings_lists: lists.len() as i32,
        num_doc_records: n as i32,
        total_postings_lists: lists.len() as i32,
        total_docs: n as i32,
        total_terms_in_collection: index.manifest().total_scoring_length as i64,
        average_doclength: index.avg_scoring_length(),
        description: "exported by tests/search.rs".into(),
    }
    .encode_length_delimited(&mut out)
    .unwrap();
    for list in lists {
        list.encode_length_delimited(&mut out).unwrap();
    }
    for d in 0..n {
        DocRecord {
            docid: d as i32,
            collection_docid: index.doc_id(d).to_string(),
            doclength: index.scoring_length(d) as i32,
        }
        .encode_length_delimited(&mut out)
        .unwrap();
    }
    out
}

#[tokio::test]
async fn ciff_import_serves_the_same_bm25_results_as_the_index_it_came_from() {
    let (dir, original) = built(&fixture_corpus(), "fixture", Codec::Ef);
    let file = dir.path().join("fixture.ciff");
    std::fs::write(&file, export_ciff(&original)).unwrap();
    let imported = dir.path().join("imported");
    let output = rankserve(&[
        "index",
        "import-ciff",
        file.to_str().unwrap(),
        "--out",
        imported.to_str().unwrap(),
        "--codec",
        "pfor",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let s = server_with(|c| c.index = Some(imported.clone()));
    for text in QUERIES {
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            let mut req = request(text, mode, 8);
            req.ranker = Some("small".into());
            let got = search_json(&s, &req).await;
            assert_eq!(got.backends.rank, "none");
            let want = search(&original, &Query::from_text(text, 8, mode))
                .unwrap()
                .hits;
            assert_eq!(doc_scores(&got), want, "{text:?} {mode:?}");
            for hit in &got.hits {
                assert_eq!(hit.id, original.doc_id(hit.doc));
            }
        }
    }

    // A truncated file is refused with exit 2, naming the file and the message, and no index.
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let refused = dir.path().join("refused");
    let output = rankserve(&[
        "index",
        "import-ciff",
        file.to_str().unwrap(),
        "--out",
        refused.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "rankserve: CIFF file {}: postings list ",
            file.display()
        )),
        "{stderr}"
    );
    assert!(!refused.exists());
}

/// Starts `rankserve serve` with `args` (from the repository root, so `rankers/` and
/// `fixtures/` are there) and returns it with its listening address and the log lines up to
/// the `listening` one; the rest of its log is drained in the background.
fn start_serve(args: &[&str]) -> (std::process::Child, std::net::SocketAddr, Vec<String>) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rankserve"))
        .arg("serve")
        .args(args)
        .current_dir(root())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (lines, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = lines.send(without_ansi(&line));
        }
    });
    let mut seen = Vec::new();
    while let Ok(line) = receive.recv_timeout(std::time::Duration::from_secs(60)) {
        let addr = line.contains(" listening ").then(|| {
            line.split_once("addr=")
                .unwrap()
                .1
                .split(' ')
                .next()
                .unwrap()
                .parse()
        });
        seen.push(line);
        if let Some(addr) = addr {
            std::thread::spawn(move || receive.into_iter().for_each(drop));
            return (child, addr.unwrap(), seen);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("serve did not start listening: {seen:#?}");
}

/// `line` without terminal colour sequences (`ESC [ ... m`).
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// One HTTP/1.1 JSON POST over a plain socket; returns the status line and the body.
fn post_json(addr: std::net::SocketAddr, path: &str, body: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

#[test]
fn serve_with_no_index_builds_the_demo_index_once_and_ranks_with_the_bundled_rankers() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap();
    for (start, expected) in [(1, "demo index built"), (2, "demo index reused")] {
        let (mut child, addr, log) =
            start_serve(&["--addr", "127.0.0.1:0", "--data-dir", data_dir]);
        assert!(
            log.iter().any(|l| l.contains(expected)),
            "start {start}: {log:#?}"
        );
        for ranker in ["small", "medium", "large"] {
            let (status, body) = post_json(
                addr,
                "/v1/search",
                &format!(
                    r#"{{"query": "kitchen ranking", "mode": "or", "k": 3, "ranker": "{ranker}"}}"#
                ),
            );
            assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
            let reply: SearchResponse = serde_json::from_str(&body).unwrap();
            assert_eq!(reply.hits.len(), 3);
            // `auto`: the GPU, where there is one and the batch is past the crossover.
            assert!(["cpu", "gpu"].contains(&reply.backends.rank.as_str()));
            assert!(
                reply.hits.iter().all(|h| h.score.is_some()),
                "{ranker}: {body}"
            );
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert!(data.path().join("index/index.json").exists());
}
