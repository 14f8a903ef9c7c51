use super::*;

fn shape(dfs: &[u32]) -> QueryShape {
    QueryShape {
        dfs: dfs.to_vec(),
        terms: (0..dfs.len() as TermId).collect(),
        missing_term: false,
        k: 10,
    }
}

#[test]
fn griffin_sends_a_short_list_against_long_ones_to_the_cpu() {
    let s = Scheduler {
        model: CostModel {
            cpu_and_probe_us: 1e3,
            ..CostModel::default()
        },
        ..Scheduler::default()
    };
    // The estimates prefer the GPU; the ratio decides.
    let at_ratio = 100 * DEFAULT_GRIFFIN_RATIO as u32;
    assert_eq!(
        s.choose(&shape(&[100, at_ratio]), Mode::And, 1 << 20).side,
        Processor::Gpu
    );
    assert_eq!(
        s.choose(&shape(&[100, at_ratio + 1]), Mode::And, 1 << 20)
            .side,
        Processor::Cpu
    );
    let strict = Scheduler {
        griffin_ratio: 2.0,
        ..s
    };
    assert_eq!(
        strict.choose(&shape(&[100, 201]), Mode::And, 1 << 20).side,
        Processor::Cpu
    );
}

#[test]
fn estimates_grow_with_the_lists() {
    let s = Scheduler::default();
    let small = s.choose(&shape(&[10, 20]), Mode::Or, 500_000);
    let large = s.choose(&shape(&[200_000, 300_000]), Mode::Or, 500_000);
    assert_eq!(small.side, Processor::Cpu);
    assert_eq!(large.side, Processor::Gpu);
    assert!(large.cpu_us > small.cpu_us && large.gpu_us > small.gpu_us);
    assert_eq!(
        s.choose(&shape(&[]), Mode::Or, 500_000).side,
        Processor::Cpu
    );
    let missing = QueryShape {
        missing_term: true,
        ..shape(&[200_000, 300_000])
    };
    assert_eq!(s.choose(&missing, Mode::And, 500_000).side, Processor::Cpu);
    // AND_OR goes where its OR goes when a term is missing, where its AND goes when the
    // AND should find k hits, else where both together cost least.
    assert_eq!(
        s.choose(&missing, Mode::AndOr, 500_000),
        s.choose(&missing, Mode::Or, 500_000)
    );
    let many = shape(&[200_000, 300_000]);
    assert!(many.and_estimate(2, 500_000) >= 10.0);
    assert_eq!(
        s.choose(&many, Mode::AndOr, 500_000),
        s.choose(&many, Mode::And, 500_000)
    );
    // Two lists of 100 among 10⁶ documents: 0.01 expected in the AND, so OR runs too; the
    // CPU wins both. 20 and 200 000: 4 expected; OR's 200 020 postings go to the GPU.
    for (dfs, side) in [
        (&[100, 100][..], Processor::Cpu),
        (&[20, 200_000], Processor::Gpu),
    ] {
        let few = shape(dfs);
        assert!(few.and_estimate(2, 1_000_000) < 10.0);
        let (and, or) = (
            s.choose(&few, Mode::And, 1_000_000),
            s.choose(&few, Mode::Or, 1_000_000),
        );
        let and_or = s.choose(&few, Mode::AndOr, 1_000_000);
        assert_eq!(and_or.cpu_us, and.cpu_us + or.cpu_us);
        assert_eq!(and_or.gpu_us, and.gpu_us + or.gpu_us);
        assert_eq!(and_or.side, side, "{dfs:?}");
    }
}

#[test]
fn queues_move_queries_to_the_other_processor() {
    let s = Scheduler::default();
    let n_docs = 1_000_000;
    // A heavy OR: 2 M postings, about 20 ms on the CPU, 135 µs on the GPU.
    let heavy = shape(&[1_000_000, 1_000_000]);
    let idle = s.choose(&heavy, Mode::Or, n_docs);
    assert_eq!(idle.side, Processor::Gpu);
    assert_eq!((idle.cpu_wait_us, idle.gpu_wait_us), (0.0, 0.0));
    // Its margin is the CPU's mean time less the GPU's, not the crossover's figure.
    assert_eq!(idle.gpu_margin_us(), idle.cpu_mean_us - idle.gpu_us);
    assert!(idle.cpu_mean_us < idle.cpu_us / 5.0);
    let queued = |gpu_queued_us| Load {
        gpu_queued_us,
        cpu_running: 0,
        cpu_cores: 16,
    };
    // It waits behind a queue shorter than its margin, not behind a longer one.
    let margin = idle.gpu_margin_us();
    let behind = s.choose_under(&heavy, Mode::Or, n_docs, &queued(margin - 1.0));
    assert_eq!(behind.side, Processor::Gpu);
    assert_eq!(behind.gpu_wait_us, margin - 1.0);
    assert_eq!(
        s.choose_under(&heavy, Mode::Or, n_docs, &queued(margin + 1.0))
            .side,
        Processor::Cpu
    );
    // A medium OR (100 000 postings: ≈ 1 ms by the crossover's figure, ≈ 290 µs by the
    // CPU's mean, 59 µs on the GPU) takes an idle GPU, but not one with 500 µs booked,
    // which the crossover's figure alone would still have chosen.
    let medium = shape(&[50_000, 50_000]);
    assert_eq!(s.choose(&medium, Mode::Or, n_docs).side, Processor::Gpu);
    let busy_gpu = s.choose_under(&medium, Mode::Or, n_docs, &queued(500.0));
    assert!(busy_gpu.gpu_us + 500.0 < busy_gpu.cpu_us);
    assert_eq!(busy_gpu.side, Processor::Cpu);
    assert_eq!(
        s.choose_under(&medium, Mode::Or, n_docs, &queued(200.0))
            .side,
        Processor::Gpu
    );
    // A query the CPU wins alone goes to an idle GPU once the cores are oversubscribed:
    // 3 000 postings, 32 µs on one core, 42 µs on the GPU; twice as many queries as cores
    // make the CPU's 64 µs.
    let light = shape(&[1_500, 1_500]);
    assert_eq!(s.choose(&light, Mode::Or, 100_000).side, Processor::Cpu);
    let busy_cores = Load {
        gpu_queued_us: 0.0,
        cpu_running: 31,
        cpu_cores: 16,
    };
    let stolen = s.choose_under(&light, Mode::Or, 100_000, &busy_cores);
    assert_eq!(stolen.side, Processor::Gpu);
    assert_eq!(stolen.cpu_wait_us, stolen.cpu_us);
    // Up to as many running as cores, a CPU query is not slowed.
    let full = Load {
        cpu_running: 15,
        ..busy_cores
    };
    assert_eq!(
        s.choose_under(&light, Mode::Or, 100_000, &full).cpu_wait_us,
        0.0
    );
    // Griffin's rule holds at any load.
    let unequal = shape(&[10, 10_000_000]);
    let cpu_swamped = Load {
        cpu_running: 1_000,
        ..busy_cores
    };
    assert_eq!(
        s.choose_under(&unequal, Mode::And, 20_000_000, &cpu_swamped)
            .side,
        Processor::Cpu
    );
}

#[test]
fn bookings_last_as_long_as_their_queries() {
    let backlog = Backlog::new(0);
    assert_eq!(backlog.load().cpu_cores, 1);
    let first = backlog.book(Processor::Gpu, 120.4);
    let second = backlog.book(Processor::Gpu, 0.0);
    let cpu = backlog.book(Processor::Cpu, 500.0);
    let load = backlog.load();
    assert_eq!((load.gpu_queued_us, load.cpu_running), (122.0, 1));
    drop(first);
    assert_eq!(backlog.load().gpu_queued_us, 1.0);
    drop((second, cpu));
    assert_eq!(
        backlog.load(),
        Load {
            cpu_cores: 1,
            ..Load::IDLE
        }
    );
}

#[test]
fn and_plans_hand_over_when_the_next_list_outgrows_the_intersection() {
    let s = Scheduler {
        griffin_ratio: 100.0,
        ..Scheduler::default()
    };
    let plan = |dfs: &[u32], n_docs| s.and_plan(&shape(dfs), n_docs, |_| false).gpu_lists;
    // 1 000 × 5 000 / 10 000 = 500 estimated after two lists: 50 000 is within 100 × 500,
    // 50 001 is not.
    assert_eq!(plan(&[1_000, 5_000, 50_000], 10_000), 3);
    assert_eq!(plan(&[1_000, 5_000, 50_001], 10_000), 2);
    // The second list is Griffin's per-query rule: beyond it the GPU keeps the shortest only.
    assert_eq!(plan(&[1_000, 100_001], 1_000_000), 1);
    assert_eq!(plan(&[1_000, 100_000], 1_000_000), 2);
    assert_eq!(plan(&[7], 1_000_000), 1);
    assert_eq!(plan(&[], 1_000_000), 1);
    // An estimate under one document counts as one.
    assert_eq!(plan(&[1, 1, 100, 101], 1_000_000), 3);
    // A resident list stays on the GPU however long: searching it there costs no copy.
    let resident_second = |t: TermId| t == 1;
    let plan_resident = |dfs: &[u32]| s.and_plan(&shape(dfs), 1_000_000, resident_second);
    assert_eq!(plan_resident(&[1_000, 900_000]).gpu_lists, 2);
    assert_eq!(plan_resident(&[1_000, 900_000, 950_000]).gpu_lists, 2);
    let passed = s.and_plan(&shape(&[1, 2]), 0, |_| true);
    assert_eq!(
        (
            passed.merge_path_min_df,
            passed.skip_entry_min_ratio,
            passed.skip_entry_min_df
        ),
        (
            s.merge_path_min_df,
            s.skip_entry_min_ratio,
            s.skip_entry_min_df
        )
    );
}

#[test]
fn cpu_and_probes_seek_the_shortest_list_in_every_other() {
    assert_eq!(shape(&[3, 200, 1_000_000]).cpu_and_probes(), 6);
    assert_eq!(shape(&[7]).cpu_and_probes(), 7);
    assert_eq!(shape(&[]).cpu_and_probes(), 0);
    assert_eq!(shape(&[5]).length_ratio(), 1.0);
}
