//! Slow and idle clients on a real server over loopback, with raw TCP so a test controls every
//! byte and pause: the whole-body deadline (408 `body_timeout`), the idle-connection timeout,
//! the shutdown's grace period, and the requests hyper refuses before routing. Timeouts are set
//! short through the config so each test takes about a second.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::live::live;
use rankserve::server::error::ErrorBody;

/// The headers of a JSON `/v1/rank` POST announcing `length` body bytes.
fn rank_head(length: usize) -> String {
    format!(
        "POST /v1/rank HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
}

/// Writes one byte of `{` every `every` until the server closes the connection or `bytes`
/// are written.
fn trickle(mut writer: tokio::net::tcp::OwnedWriteHalf, bytes: usize, every: Duration) {
    tokio::spawn(async move {
        for _ in 0..bytes {
            tokio::time::sleep(every).await;
            if writer.write_all(b" ").await.is_err() {
                break;
            }
        }
        // Holds the half open, so the server (not the client) ends the exchange.
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(writer);
    });
}

/// Reads one response: its status and body (by its Content-Length).
async fn read_response(stream: &mut (impl AsyncReadExt + Unpin)) -> (u16, Vec<u8>) {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&bytes[..end]).to_string();
            let status: u16 = head[9..12].parse().unwrap();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .unwrap_or(0);
            while bytes.len() < end + 4 + length {
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "connection closed mid-body");
                bytes.extend_from_slice(&buf[..n]);
            }
            return (status, bytes[end + 4..end + 4 + length].to_vec());
        }
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed before a response: {bytes:?}");
        bytes.extend_from_slice(&buf[..n]);
    }
}

fn error_code(body: &[u8]) -> String {
    let body: ErrorBody = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not an error body ({e}): {}", String::from_utf8_lossy(body)));
    body.error.code
}

/// The value of the first /metrics line starting with `prefix` (0 when absent).
fn metric(prefix: &str) -> f64 {
    let text = rankserve::server::metrics::handle().render();
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.split_whitespace().last())
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickled_at_a_byte_per_100_ms_is_cut_off_whole_at_the_deadline_with_408() {
    let live = live(|c| c.body_timeout_ms = 600).await;
    let counted = r#"rankserve_http_errors_total{code="body_timeout"}"#;
    let before = metric(counted);
    let (mut reader, mut writer) = TcpStream::connect(live.addr).await.unwrap().into_split();
    writer.write_all(rank_head(1000).as_bytes()).await.unwrap();
    let started = Instant::now();
    // Each byte comes well within any idle timer: only a deadline for the whole body ends it.
    trickle(writer, 1000, Duration::from_millis(100));
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), read_response(&mut reader))
        .await
        .expect("no answer within 5 s: the body deadline restarts at every byte");
    let took = started.elapsed();
    assert_eq!(status, 408);
    assert_eq!(error_code(&body), "body_timeout");
    assert!(
        took >= Duration::from_millis(550) && took < Duration::from_millis(2000),
        "{took:?}"
    );
    // The connection is not reused: the server closes it.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(2), reader.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "still open");
    assert!(metric(counted) > before, "408 not counted");
    let _ = live.shutdown.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_midway_is_408_not_bad_body() {
    let live = live(|c| c.body_timeout_ms = 400).await;
    let mut stream = TcpStream::connect(live.addr).await.unwrap();
    stream.write_all(rank_head(100).as_bytes()).await.unwrap();
    stream.write_all(b"{\"ranker\": \"sm").await.unwrap();
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), read_response(&mut stream))
        .await
        .unwrap();
    assert_eq!((status, error_code(&body).as_str()), (408, "body_timeout"));
    let _ = live.shutdown.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let live = live(|c| c.idle_timeout_ms = 300).await;
    let counted = r#"rankserve_http_connections_closed_total{reason="timeout"}"#;
    let before = metric(counted);
    // A keep-alive connection after one answered request, and one that never sends a byte.
    let mut used = TcpStream::connect(live.addr).await.unwrap();
    used.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut used).await.0, 200);
    let mut silent = TcpStream::connect(live.addr).await.unwrap();
    let started = Instant::now();
    for stream in [&mut used, &mut silent] {
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "an idle connection still open after 3 s");
        assert!(rest.is_empty(), "{rest:?}");
    }
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert!(metric(counted) >= before + 2.0, "idle closes not counted");
    let _ = live.shutdown.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_trickling_client_ends_after_the_grace_period() {
    // A body deadline far away: only the grace period can end this connection.
    let live = live(|c| {
        c.body_timeout_ms = 60_000;
        c.shutdown_grace_ms = 300;
    })
    .await;
    let (_reader, mut writer) = TcpStream::connect(live.addr).await.unwrap().into_split();
    writer.write_all(rank_head(1000).as_bytes()).await.unwrap();
    trickle(writer, 1000, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let _ = live.shutdown.send(());
    tokio::time::timeout(Duration::from_secs(5), live.task)
        .await
        .expect("shutdown waited on the trickling client past 5 s")
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1500),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_hyper_refuses_is_answered_and_counted() {
    let live = live(|_| {}).await;
    let counted = r#"rankserve_http_connections_closed_total{reason="bad_head"}"#;
    let before = metric(counted);
    let mut stream = TcpStream::connect(live.addr).await.unwrap();
    stream
        .write_all(b"POST /v1/rank HTTP/1.1\r\nHost: test\r\nContent-Length: 12abc\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_response(&mut stream).await;
    assert_eq!(status, 400);
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut rest)).await;
    // The connection task records it as it ends.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(metric(counted) > before, "not counted");
    let _ = live.shutdown.send(());
}
