//! Tests of the GPU collectives: choice and driver-free failures everywhere, the
//! collectives themselves only where a CUDA device is visible (else a visible skip line).

use std::io::Write as _;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::bf16;

use super::*;

/// Writes past the test harness's capture, so a skip shows in `cargo test` output.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Visible CUDA devices, or `None` (with a skip line) where there are none.
fn devices(test: &str) -> Option<usize> {
    match visible_device_count() {
        Ok(n) if n >= 1 => Some(n),
        Ok(_) => {
            say(&format!(
                "{test}: skipped: no CUDA device (driver present, 0 devices)"
            ));
            None
        }
        Err(e) => {
            say(&format!("{test}: skipped: no CUDA device ({e})"));
            None
        }
    }
}

#[test]
fn choice_follows_device_sharing() {
    assert_eq!(
        choose_gpu_collectives(&[3]),
        GpuCommKind::Nccl { devices: vec![3] }
    );
    assert_eq!(
        choose_gpu_collectives(&[0, 1, 2, 3]),
        GpuCommKind::Nccl {
            devices: vec![0, 1, 2, 3]
        }
    );
    assert_eq!(
        choose_gpu_collectives(&[0, 0, 0, 0]),
        GpuCommKind::DeviceLocal {
            device: 0,
            ranks: 4
        }
    );
    assert_eq!(
        choose_gpu_collectives(&[0, 1, 0, 1]),
        GpuCommKind::InProcess {
            devices: vec![0, 1, 0, 1]
        }
    );
    assert!(choose_gpu_collectives(&[0, 1, 0, 1])
        .to_string()
        .contains("peer copies"));
    let why = choose_gpu_collectives(&[0, 0]).to_string();
    assert!(
        why.contains("device-local") && why.contains("share GPU 0"),
        "{why}"
    );
    assert!(choose_gpu_collectives(&[0, 1])
        .to_string()
        .starts_with("NCCL"));
}

/// The error's message of a call that must fail.
fn msg<T>(r: Result<T, crate::KernelError>) -> String {
    match r {
        Ok(_) => panic!("succeeded without a driver"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn constructors_fail_cleanly_without_a_driver() {
    if check_driver().is_ok() {
        say("constructors_fail_cleanly_without_a_driver: skipped: this machine has a CUDA driver");
        return;
    }
    let no_driver = "no CUDA driver found (libcuda.so.1 could not be loaded); this machine has no NVIDIA GPU driver";
    assert!(msg(visible_device_count()).contains(no_driver));
    assert!(msg(NcclCollectives::on_devices(&[0, 1])).contains(no_driver));
    assert!(msg(DeviceLocalCollectives::on_device(0, 2)).contains(no_driver));
    assert!(msg(new_nccl_unique_id()).contains(no_driver));
    assert!(msg(NcclCollectives::group(&[])).contains(no_driver));
    assert!(msg(DeviceLocalCollectives::group(&[])).contains(no_driver));
}

#[test]
fn sum_source_names_the_kernels() {
    assert!(SUM_SOURCE.contains("dcp_sum_f32") && SUM_SOURCE.contains("dcp_sum_bf16"));
    assert!(SUM_SOURCE.contains("#define DCP_MAX_SOURCES 16"));
}

#[test]
fn sum_kernel_compiles_with_nvrtc() {
    // NVRTC needs no GPU: where the library is found (e.g. PyPI's nvidia-cuda-nvrtc on
    // LD_LIBRARY_PATH), sum.cu must compile.
    if let Err(e) = probe::check_lib(CudaLib::Nvrtc) {
        say(&format!("sum_kernel_compiles_with_nvrtc: skipped: {e}"));
        return;
    }
    let ptx = super::sum_kernel::ptx().expect("sum.cu compiles");
    let text = ptx.to_src();
    assert!(
        text.contains("dcp_sum_f32") && text.contains("dcp_sum_bf16"),
        "{text}"
    );
}

/// Runs `f(rank, collectives, stream)` on one thread per rank; returns each rank's result.
fn on_ranks<C: Sync, R: Send>(comms: &[C], f: impl Fn(usize, &C) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || f(r, c))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn up<T: GpuCommElem>(s: &Arc<CudaStream>, v: &[T]) -> cudarc::driver::CudaSlice<T> {
    s.clone_htod(v).expect("upload")
}

fn down<T: GpuCommElem + Default + Clone>(
    s: &Arc<CudaStream>,
    x: &cudarc::driver::CudaSlice<T>,
) -> Vec<T> {
    s.clone_dtoh(x).expect("download")
}

/// Every collective of a device-local group of `n` ranks against host arithmetic.
fn device_local_round(n: usize) {
    let comms = DeviceLocalCollectives::on_device(0, n).expect("device-local group");
    let c = 5;
    let results = on_ranks(&comms, |r, g| {
        let s = g.stream().clone();
        let x: Vec<f32> = (0..c).map(|i| (r * 100 + i) as f32 + 0.1).collect();
        let input = up(&s, &x);
        // all_gather
        let mut out = up(&s, &vec![0f32; n * c]);
        g.all_gather(input.as_view(), out.as_view_mut()).unwrap();
        let gathered = down(&s, &out);
        // all_reduce_sum
        let mut data = up(&s, &x);
        g.all_reduce_sum(data.as_view_mut()).unwrap();
        let reduced = down(&s, &data);
        // reduce_scatter_sum
        let big: Vec<f32> = (0..n * c)
            .map(|i| (r + 1) as f32 * 0.37 + i as f32)
            .collect();
        let big_d = up(&s, &big);
        let mut part = up(&s, &vec![0f32; c]);
        g.reduce_scatter_sum(big_d.as_view(), part.as_view_mut())
            .unwrap();
        let scattered = down(&s, &part);
        // all_gather_varying: rank r gives r + 1 values
        let counts: Vec<usize> = (1..=n).collect();
        let mine: Vec<f32> = vec![r as f32; r + 1];
        let mine_d = up(&s, &mine);
        let mut var = up(&s, &vec![0f32; counts.iter().sum()]);
        g.all_gather_varying(mine_d.as_view(), &counts, var.as_view_mut())
            .unwrap();
        let varying = down(&s, &var);
        // all_to_all: chunk s (2 values) goes to rank s
        let a2a_in: Vec<f32> = (0..n * 2).map(|i| (r * 1000 + i) as f32).collect();
        let a2a_d = up(&s, &a2a_in);
        let mut a2a_out = up(&s, &vec![0f32; n * 2]);
        g.all_to_all(a2a_d.as_view(), a2a_out.as_view_mut())
            .unwrap();
        let exchanged = down(&s, &a2a_out);
        // bf16 all_reduce_sum
        let xb: Vec<bf16> = (0..c)
            .map(|i| bf16::from_f32(r as f32 * 0.5 + i as f32))
            .collect();
        let mut bd = up(&s, &xb);
        g.all_reduce_sum(bd.as_view_mut()).unwrap();
        let reduced_bf16 = down(&s, &bd);
        (
            gathered,
            reduced,
            scattered,
            varying,
            exchanged,
            reduced_bf16,
        )
    });
    for (r, (gathered, reduced, scattered, varying, exchanged, reduced_bf16)) in
        results.iter().enumerate()
    {
        let want: Vec<f32> = (0..n)
            .flat_map(|q| (0..c).map(move |i| (q * 100 + i) as f32 + 0.1))
            .collect();
        assert_eq!(gathered, &want, "all_gather rank {r}");
        // Identical bits on every rank, and the rank-ordered f32 sum.
        assert_eq!(reduced, &results[0].1, "all_reduce bits differ on rank {r}");
        for (i, v) in reduced.iter().enumerate() {
            let mut acc = 0.1f32 + i as f32;
            for q in 1..n {
                acc += (q * 100 + i) as f32 + 0.1;
            }
            assert_eq!(*v, acc, "all_reduce rank {r} [{i}]");
        }
        for (i, v) in scattered.iter().enumerate() {
            let at = r * c + i;
            let mut acc = 0.37f32 + at as f32;
            for q in 1..n {
                acc += (q + 1) as f32 * 0.37 + at as f32;
            }
            assert_eq!(*v, acc, "reduce_scatter rank {r} [{i}]");
        }
        let want_var: Vec<f32> = (0..n).flat_map(|q| vec![q as f32; q + 1]).collect();
        assert_eq!(varying, &want_var, "all_gather_varying rank {r}");
        let want_a2a: Vec<f32> = (0..n)
            .flat_map(|q| (0..2).map(move |j| (q * 1000 + r * 2 + j) as f32))
            .collect();
        assert_eq!(exchanged, &want_a2a, "all_to_all rank {r}");
        assert_eq!(
            reduced_bf16, &results[0].5,
            "bf16 all_reduce bits differ on rank {r}"
        );
        for (i, v) in reduced_bf16.iter().enumerate() {
            let exact: f32 = (0..n).map(|q| q as f32 * 0.5 + i as f32).sum();
            assert!(
                (v.to_f32() - exact).abs() <= exact.abs() / 64.0,
                "bf16 sum rank {r} [{i}]"
            );
        }
    }
}

#[test]
fn device_local_collectives_on_one_gpu() {
    if devices("device_local_collectives_on_one_gpu").is_none() {
        return;
    }
    for n in [1, 2, 3, 4] {
        device_local_round(n);
    }
}

#[test]
fn device_local_abort_breaks_waiting_ranks() {
    if devices("device_local_abort_breaks_waiting_ranks").is_none() {
        return;
    }
    let comms = DeviceLocalCollectives::on_device(0, 2).expect("group");
    let s = comms[0].stream().clone();
    let mut x = up(&s, &[1f32; 4]);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            comms[1].abort();
        });
        // Rank 1 never calls: rank 0 must get an error, not hang.
        assert!(comms[0].all_reduce_sum(x.as_view_mut()).is_err());
    });
}

#[test]
fn nccl_collectives_on_distinct_gpus() {
    let Some(n) = devices("nccl_collectives_on_distinct_gpus") else {
        return;
    };
    if let Err(e) = nccl_preflight() {
        say(&format!("nccl_collectives_on_distinct_gpus: skipped: {e}"));
        return;
    }
    let ordinals: Vec<usize> = (0..n.min(2)).collect();
    let comms = NcclCollectives::on_devices(&ordinals).expect("NCCL group");
    let m = comms.len();
    let c = 3;
    let results = on_ranks(&comms, |r, g| {
        let s = g.stream().clone();
        let x: Vec<f32> = (0..c).map(|i| (r * 10 + i) as f32).collect();
        let input = up(&s, &x);
        let mut out = up(&s, &vec![0f32; m * c]);
        g.all_gather(input.as_view(), out.as_view_mut()).unwrap();
        let mut data = up(&s, &x);
        g.all_reduce_sum(data.as_view_mut()).unwrap();
        let counts: Vec<usize> = (1..=m).collect();
        let mine = up(&s, &vec![r as f32; r + 1]);
        let mut var = up(&s, &vec![0f32; counts.iter().sum()]);
        g.all_gather_varying(mine.as_view(), &counts, var.as_view_mut())
            .unwrap();
        (down(&s, &out), down(&s, &data), down(&s, &var))
    });
    for (gathered, reduced, varying) in &results {
        let want: Vec<f32> = (0..m)
            .flat_map(|q| (0..c).map(move |i| (q * 10 + i) as f32))
            .collect();
        assert_eq!(gathered, &want);
        let sum: Vec<f32> = (0..c)
            .map(|i| (0..m).map(|q| (q * 10 + i) as f32).sum())
            .collect();
        assert_eq!(reduced, &sum);
        let want_var: Vec<f32> = (0..m).flat_map(|q| vec![q as f32; q + 1]).collect();
        assert_eq!(varying, &want_var);
    }
}

#[test]
fn ranks_sharing_a_gpu_join_a_device_local_group() {
    // Two rank threads, one GPU: the group they meet in is device-local.
    let Some(_) = devices("ranks_sharing_a_gpu_join_a_device_local_group") else {
        return;
    };
    let ctx = cudarc::driver::CudaContext::new(0).expect("GPU 0");
    let streams: Vec<_> = (0..2).map(|_| ctx.new_stream().expect("stream")).collect();
    let got = std::thread::scope(|s| {
        let hs: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(r, st)| {
                let st = st.clone();
                s.spawn(move || join_gpu_group(7_001, r, 2, st, std::time::Duration::from_secs(60)))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("join thread"))
            .collect::<Vec<_>>()
    });
    for (r, g) in got.into_iter().enumerate() {
        let (c, kind) = g.expect("joined");
        assert_eq!(c.rank(), r);
        assert!(
            matches!(
                kind,
                GpuCommKind::DeviceLocal {
                    device: 0,
                    ranks: 2
                }
            ),
            "{kind}"
        );
    }
}
