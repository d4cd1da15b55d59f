use super::*;
use crate::bench_client::test_args;

fn ids_len(s: &Segment) -> usize {
    match &s.content {
        Content::Ids(v) => v.len(),
        Content::Text(_) => panic!("expected ids"),
    }
}

fn all_ids(r: &RequestSpec) -> Vec<u32> {
    r.segments
        .iter()
        .flat_map(|s| match &s.content {
            Content::Ids(v) => v.clone(),
            Content::Text(_) => panic!("expected ids"),
        })
        .collect()
}

#[test]
fn fixed_lengths_without_range_ratio() {
    let a = test_args(&[
        "--num-prompts",
        "20",
        "--random-input-len",
        "37",
        "--random-output-len",
        "11",
    ]);
    let jobs = Generator::new(&a).random();
    assert_eq!(jobs.len(), 20);
    for j in &jobs {
        let r = &j.requests[0];
        assert_eq!(all_ids(r).len(), 37);
        assert_eq!(r.input_len, 37);
        assert_eq!(r.output_len, 11);
        assert!(all_ids(r).iter().all(|&t| (1000..20000).contains(&t)));
    }
}

#[test]
fn range_ratio_bounds_and_spread() {
    let a = test_args(&[
        "--num-prompts",
        "400",
        "--random-input-len",
        "100",
        "--random-output-len",
        "10",
        "--random-range-ratio",
        "0.5",
        "--token-id-min",
        "3",
        "--token-id-max",
        "384",
    ]);
    let jobs = Generator::new(&a).random();
    let ins: Vec<usize> = jobs.iter().map(|j| j.requests[0].input_len).collect();
    let outs: Vec<usize> = jobs.iter().map(|j| j.requests[0].output_len).collect();
    assert!(ins.iter().all(|&n| (50..=150).contains(&n)));
    assert!(outs.iter().all(|&n| (5..=15).contains(&n)));
    // 400 uniform draws over 101 values reach both ends' neighbourhoods.
    assert!(*ins.iter().min().unwrap() < 60 && *ins.iter().max().unwrap() > 140);
    for j in &jobs {
        assert!(all_ids(&j.requests[0])
            .iter()
            .all(|&t| (3..384).contains(&t)));
    }
}

#[test]
fn random_prefix_is_shared() {
    let a = test_args(&[
        "--num-prompts",
        "5",
        "--random-input-len",
        "8",
        "--random-prefix-len",
        "16",
    ]);
    let jobs = Generator::new(&a).random();
    let first = &jobs[0].requests[0].segments[0];
    assert_eq!(ids_len(first), 16);
    for j in &jobs {
        assert_eq!(&j.requests[0].segments[0], first);
        assert_eq!(j.requests[0].input_len, 24);
    }
    assert_ne!(
        jobs[0].requests[0].segments[1],
        jobs[1].requests[0].segments[1]
    );
}

#[test]
fn agentic_turns_extend_their_history() {
    let a = test_args(&[
        "--dataset-name",
        "agentic",
        "--num-prompts",
        "9",
        "--agentic-turns",
        "3",
        "--agentic-system-len",
        "10",
        "--agentic-context-len",
        "50",
        "--random-input-len",
        "7",
        "--random-output-len",
        "5",
    ]);
    let jobs = Generator::new(&a).agentic();
    assert_eq!(jobs.len(), 3);
    for j in &jobs {
        assert_eq!(j.requests.len(), 3);
        for (t, r) in j.requests.iter().enumerate() {
            // system + context + t·(user + reply) + user
            assert_eq!(r.input_len, 10 + 50 + t * (7 + 5) + 7);
            assert_eq!(all_ids(r).len(), r.input_len);
            if t > 0 {
                let prev = all_ids(&j.requests[t - 1]);
                assert_eq!(&all_ids(r)[..prev.len()], &prev[..]);
            }
        }
    }
    // The system prefix is common to all sessions; the contexts are each session's own.
    let system = |j: &Job| j.requests[0].segments[0].clone();
    let context = |j: &Job| j.requests[0].segments[1].clone();
    assert_eq!(system(&jobs[0]), system(&jobs[2]));
    assert_ne!(context(&jobs[0]), context(&jobs[1]));
    assert_eq!(
        j_roles(&jobs[0].requests[2]),
        vec![
            Role::System,
            Role::System,
            Role::User,
            Role::Assistant,
            Role::User,
            Role::Assistant,
            Role::User,
        ]
    );
}

fn j_roles(r: &RequestSpec) -> Vec<Role> {
    r.segments.iter().map(|s| s.role).collect()
}

#[test]
fn agentic_rounds_sessions_up() {
    let a = test_args(&[
        "--dataset-name",
        "agentic",
        "--num-prompts",
        "10",
        "--agentic-turns",
        "4",
    ]);
    assert_eq!(Generator::new(&a).agentic().len(), 3);
}

#[test]
fn equal_seeds_equal_workloads() {
    let flags = [
        "--num-prompts",
        "6",
        "--random-input-len",
        "30",
        "--random-range-ratio",
        "0.3",
    ];
    let a = test_args(&flags);
    assert_eq!(build(&a).unwrap(), build(&a).unwrap());
    let mut other = flags.to_vec();
    other.extend_from_slice(&["--seed", "1"]);
    assert_ne!(build(&a).unwrap(), build(&test_args(&other)).unwrap());
}

#[test]
fn trace_lines() {
    let a = test_args(&["--dataset-name", "trace", "--random-output-len", "9"]);
    let text = r#"{"prompt": "hello there", "output_len": 4, "timestamp": 10.5}

{"input_len": 12, "timestamp": 12.0}
"#;
    let jobs = Generator::new(&a).trace(text).unwrap();
    assert_eq!(jobs.len(), 2);
    let r0 = &jobs[0].requests[0];
    assert_eq!(r0.segments[0].content, Content::Text("hello there".into()));
    assert_eq!((r0.input_len, r0.output_len), (0, 4));
    assert_eq!(jobs[0].timestamp, Some(0.0));
    let r1 = &jobs[1].requests[0];
    assert_eq!((all_ids(r1).len(), r1.output_len), (12, 9));
    assert_eq!(jobs[1].timestamp, Some(1.5));
    assert!(Generator::new(&a).trace(r#"{"output_len": 3}"#).is_err());
    assert!(Generator::new(&a).trace("not json").is_err());
    assert!(Generator::new(&a).trace("\n").is_err());
}

#[test]
fn trace_stops_at_num_prompts() {
    let a = test_args(&["--dataset-name", "trace", "--num-prompts", "2"]);
    let text = "{\"input_len\": 1}\n".repeat(5);
    assert_eq!(Generator::new(&a).trace(&text).unwrap().len(), 2);
}

#[test]
fn poisson_gaps_average_one_over_rate() {
    let t = poisson_offsets(20_000, 4.0, 3);
    assert_eq!(t[0], 0.0);
    assert!(t.windows(2).all(|w| w[1] >= w[0]));
    let mean_gap = t[t.len() - 1] / (t.len() - 1) as f64;
    assert!((mean_gap - 0.25).abs() < 0.01, "mean gap {mean_gap}");
    assert!(poisson_offsets(3, f64::INFINITY, 0)
        .iter()
        .all(|&x| x == 0.0));
}

#[test]
fn words_map_ids() {
    assert_eq!(words_of(&[0, 1, WORDS.len() as u32]), "the of the");
}

#[test]
fn longer_workloads_start_with_the_shorter_ones() {
    for kind in ["random", "agentic"] {
        let short = build(&test_args(&["--dataset-name", kind, "--num-prompts", "4"])).unwrap();
        let long = build(&test_args(&["--dataset-name", kind, "--num-prompts", "12"])).unwrap();
        assert!(long.len() > short.len());
        assert_eq!(&long[..short.len()], &short[..], "{kind}");
    }
}
