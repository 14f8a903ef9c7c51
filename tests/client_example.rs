//! `examples/client.py` against the real server on loopback, with the bundled rankers: the
//! example stays true to the API. Needs `python3` (skipped, with a line saying so, without it).

use std::process::Command;

use crate::http::live;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_example_ranks_with_the_bundled_rankers() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: no python3 on this machine");
        return;
    }
    let live = live(|c| c.rankers = concat!(env!("CARGO_MANIFEST_DIR"), "/rankers").into()).await;
    let url = format!("http://{}", live.addr);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/client.py");
    for ranker in ["small", "medium"] {
        let out = tokio::process::Command::new("python3")
            .args([
                script, "--url", &url, "--ranker", ranker, "--format", "json",
            ])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "client.py failed: {stderr}");
        let reply: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("one JSON line on stdout");
        let scores = reply["scores"].as_array().unwrap();
        assert_eq!(scores.len(), 2, "{reply}");
        assert!(
            scores
                .iter()
                .all(|s| s.as_f64().is_some_and(f64::is_finite)),
            "{reply}"
        );
        let order: Vec<u64> = reply["order"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap())
            .collect();
        let best = if scores[0].as_f64() >= scores[1].as_f64() {
            0
        } else {
            1
        };
        assert_eq!(order, [best, 1 - best], "{reply}");
    }
    // A server error reaches the caller as exit 1 with the code.
    let out = tokio::process::Command::new("python3")
        .args([
            script, "--url", &url, "--ranker", "nosuch", "--format", "json",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown_ranker"));
    let _ = live.shutdown.send(());
    live.task.await.unwrap().unwrap();
}
