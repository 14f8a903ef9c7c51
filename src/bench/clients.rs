//! The document stage under concurrent clients, in process: `clients` threads each run one query
//! at a time through the server's [`SelectEngine`] — the scheduler's choice under the load the
//! other clients make, the device's shared batches, the wait for the device — as the server's
//! request workers do, without HTTP and JSON in the way. Timed the way `peers/tantivy`'s
//! `search --threads N` times Tantivy, so the two compare row for row: a warm-up pass, then
//! passes over the query set in which each query runs once, taken in file order by the next
//! free client; throughput is the queries over a pass's wall time (median pass), a query's
//! latency its median over the passes. The backends take turns pass by pass, so a drift of the
//! machine over the run reaches each of them alike.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::selection::{median, BenchSelectError, QueryRun, SelectionConfig};
use crate::backend::{Backend, Processor};
use crate::index::Index;
use crate::select::engine::{SelectEngine, Selected};
use crate::select::schedule::QueryShape;
use crate::select::Query;

/// One backend's run under concurrent clients.
#[derive(Debug, Clone)]
pub struct ClientsRun {
    pub backend: Backend,
    /// Queries per second of each timed pass, in pass order.
    pub pass_qps: Vec<f64>,
    /// Each query's median latency over the passes, with the answer of its last run.
    pub runs: Vec<QueryRun>,
}

impl ClientsRun {
    /// The median pass's throughput.
    pub fn qps(&self) -> f64 {
        median(self.pass_qps.iter().copied())
    }
}

/// Runs `queries` with `clients` concurrent client threads through `engine` on each of
/// `backends` (see the module docs): one untimed pass per backend, then `config.reps` timed
/// passes per backend, the backends taking turns.
///
/// # Errors
/// The first query's error (invalid BM25 parameters).
pub fn run(
    index: &Arc<Index>,
    queries: &[String],
    config: &SelectionConfig,
    engine: &SelectEngine,
    backends: &[Backend],
    clients: usize,
) -> Result<Vec<ClientsRun>, BenchSelectError> {
    let parsed: Vec<Query> = queries.iter().map(|text| config.query(text)).collect();
    let mut times = vec![vec![Vec::with_capacity(config.reps); queries.len()]; backends.len()];
    let mut pass_qps = vec![Vec::with_capacity(config.reps); backends.len()];
    let mut last: Vec<Vec<Option<Selected>>> = backends
        .iter()
        .map(|_| queries.iter().map(|_| None).collect())
        .collect();
    for pass in 0..=config.reps.max(1) {
        for (b, &backend) in backends.iter().enumerate() {
            let started = Instant::now();
            let answered = one_pass(index, &parsed, engine, backend, clients.max(1))?;
            let wall_s = started.elapsed().as_secs_f64();
            if pass == 0 {
                continue;
            }
            pass_qps[b].push(queries.len() as f64 / wall_s);
            for (q, us, selected) in answered {
                times[b][q].push(us);
                last[b][q] = Some(selected);
            }
        }
    }
    let dfs: Vec<Vec<u32>> = (parsed.iter())
        .map(|query| QueryShape::of(index, query).dfs)
        .collect();
    let runs = (backends.iter().zip(times).zip(last).zip(pass_qps))
        .map(|(((&backend, times), last), pass_qps)| ClientsRun {
            backend,
            pass_qps,
            runs: (queries.iter().zip(times).zip(last).zip(&dfs))
                .map(|(((text, times), selected), dfs)| {
                    let selected = selected.expect("every query ran in every timed pass");
                    let hits = &selected.result.hits;
                    QueryRun {
                        query: text.clone(),
                        us: median(times.into_iter()),
                        ids: hits
                            .iter()
                            .map(|&(d, _)| index.doc_id(d).to_string())
                            .collect(),
                        scores: hits.iter().map(|&(_, score)| score).collect(),
                        blocks_decoded: selected.result.stats.blocks_decoded,
                        docs_scored: selected.result.stats.docs_scored,
                        side: selected.side,
                        dfs: dfs.clone(),
                        hits: None,
                    }
                })
                .collect(),
        })
        .collect();
    Ok(runs)
}

/// One pass: every query once, on `clients` threads taking them from a shared counter; each
/// query's index, wall time in µs and answer.
fn one_pass(
    index: &Arc<Index>,
    queries: &[Query],
    engine: &SelectEngine,
    backend: Backend,
    clients: usize,
) -> Result<Vec<(usize, f64, Selected)>, BenchSelectError> {
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..clients)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let q = next.fetch_add(1, Ordering::Relaxed);
                        let Some(query) = queries.get(q) else {
                            return Ok(mine);
                        };
                        let started = Instant::now();
                        let route = engine.route(index, query, backend);
                        let selected = engine.select(index, query, route, backend, None)?;
                        mine.push((q, started.elapsed().as_secs_f64() * 1e6, selected));
                    }
                })
            })
            .collect();
        let mut all = Vec::with_capacity(queries.len());
        for worker in workers {
            let mine: Result<Vec<_>, BenchSelectError> =
                worker.join().expect("a client thread panicked");
            all.extend(mine?);
        }
        Ok(all)
    })
}

/// Queries each side answered in `run`: (CPU, GPU).
pub fn sides(run: &ClientsRun) -> (usize, usize) {
    let on_gpu = (run.runs.iter())
        .filter(|r| r.side == Processor::Gpu)
        .count();
    (run.runs.len() - on_gpu, on_gpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::selection::{run as run_one_thread, Clock, Timing};
    use crate::index::builder::{build, BuildOptions};
    use crate::index::corpus::{write_synth, SynthSpec};
    use crate::index::queries::synth_queries;
    use crate::select::engine::SelectConfig;
    use crate::select::schedule::Scheduler;
    use crate::select::{Bm25Params, Mode};
    use std::time::Duration;

    #[test]
    fn clients_find_the_one_thread_top_k_and_time_every_pass() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("synth.jsonl");
        let mut file = std::fs::File::create(&corpus).unwrap();
        write_synth(
            SynthSpec {
                docs: 3000,
                seed: 5,
            },
            &mut file,
            |_| {},
        )
        .unwrap();
        let out = dir.path().join("idx");
        build(&corpus, &out, &BuildOptions::default(), &|_| {}).unwrap();
        let index = Arc::new(Index::open(&out).unwrap());
        let mut queries = synth_queries(&index, 40, 3).unwrap();
        queries.push("nosuchterm".to_string());
        for mode in [Mode::And, Mode::Or] {
            let config = SelectionConfig {
                mode,
                k: 10,
                params: Bm25Params { k1: 1.2, b: 0.75 },
                reps: 3,
                timing: Timing::Passes,
                clock: Clock::Wall,
                count_hits: false,
            };
            let engine = SelectEngine::new(
                SelectConfig {
                    griffin_ratio: 4096.0,
                    gpu_batch: 16,
                    gpu_queue: Duration::from_millis(5),
                    posting_cache_bytes: 0,
                },
                4,
            );
            let runs = run(
                &index,
                &queries,
                &config,
                &engine,
                &[Backend::Cpu, Backend::Auto],
                4,
            )
            .unwrap();
            let alone = run_one_thread(
                &index,
                &queries,
                &config,
                &[Backend::Cpu],
                None,
                &Scheduler::default(),
            )
            .unwrap()
            .remove(0);
            assert_eq!(runs.len(), 2);
            for clients in &runs {
                assert_eq!(clients.pass_qps.len(), 3);
                assert!(clients.qps() > 0.0);
                assert_eq!(sides(clients), (queries.len(), 0), "no GPU here");
                for (with, without) in clients.runs.iter().zip(&alone) {
                    assert_eq!(with.ids, without.ids, "{mode:?} {:?}", with.query);
                    assert_eq!(with.scores, without.scores);
                    assert!(with.us > 0.0);
                }
            }
        }
    }
}
