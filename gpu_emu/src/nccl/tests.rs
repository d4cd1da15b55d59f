//! Collectives among the ranks of one process, on four emulated devices.

use std::ffi::c_void;
use std::ptr::null_mut;

use super::*;
use crate::driver::context::{ctx_handle, cuCtxSetCurrent};
use crate::driver::stream_api::cuStreamSynchronize;
use crate::driver::tests::{alloc, download, init, new_stream, upload};

/// Binds device `d` on this thread.
fn on_device(d: usize) {
    unsafe { assert_eq!(cuCtxSetCurrent(ctx_handle(d)), 0) };
}

#[test]
fn all_reduce_all_gather_reduce_scatter_among_threads() {
    init();
    let mut id = UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    unsafe { assert_eq!(ncclGetUniqueId(&mut id), result::SUCCESS) };
    let ranks = 4usize;
    let handles: Vec<_> = (0..ranks)
        .map(|r| {
            std::thread::spawn(move || unsafe {
                init();
                on_device(r);
                let mut comm = null_mut();
                assert_eq!(
                    ncclCommInitRank(&mut comm, ranks as i32, id, r as i32),
                    result::SUCCESS
                );
                let s = new_stream();
                let n = 6usize;
                let buf = alloc(n * 4);
                upload(
                    buf,
                    &(0..n).map(|i| (r * 10 + i) as f32).collect::<Vec<_>>(),
                );
                // In place.
                assert_eq!(
                    ncclAllReduce(buf as *const c_void, buf as *mut c_void, n, 7, 0, comm, s),
                    result::SUCCESS
                );
                let gathered = alloc(n * 4 * ranks);
                assert_eq!(ncclGroupStart(), result::SUCCESS);
                assert_eq!(
                    ncclAllGather(buf as *const c_void, gathered as *mut c_void, n, 7, comm, s),
                    result::SUCCESS
                );
                assert_eq!(ncclGroupEnd(), result::SUCCESS);
                let scattered = alloc(4 * 2);
                let src = alloc(4 * 2 * ranks);
                upload(
                    src,
                    &(0..2 * ranks).map(|i| (i + r) as f32).collect::<Vec<_>>(),
                );
                assert_eq!(
                    ncclReduceScatter(
                        src as *const c_void,
                        scattered as *mut c_void,
                        2,
                        7,
                        0,
                        comm,
                        s
                    ),
                    result::SUCCESS
                );
                assert_eq!(cuStreamSynchronize(s), 0);
                let sum: Vec<f32> = download(buf, n);
                let expect: Vec<f32> = (0..n)
                    .map(|i| (0..ranks).map(|q| (q * 10 + i) as f32).sum())
                    .collect();
                assert_eq!(sum, expect);
                let all: Vec<f32> = download(gathered, n * ranks);
                assert_eq!(all, expect.repeat(ranks));
                let rs: Vec<f32> = download(scattered, 2);
                let want: Vec<f32> = (0..2)
                    .map(|j| (0..ranks).map(|q| (r * 2 + j + q) as f32).sum())
                    .collect();
                assert_eq!(rs, want);
                assert_eq!(ncclCommDestroy(comm), result::SUCCESS);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn init_all_broadcast_and_grouped_send_recv_from_one_thread() {
    init();
    let ranks = 3usize;
    let mut comms = vec![null_mut(); ranks];
    let devs: Vec<i32> = (0..ranks as i32).collect();
    unsafe {
        assert_eq!(
            ncclCommInitAll(comms.as_mut_ptr(), ranks as i32, devs.as_ptr()),
            result::SUCCESS
        )
    };
    let mut streams = Vec::new();
    let mut bufs = Vec::new();
    let mut outs = Vec::new();
    for r in 0..ranks {
        on_device(r);
        streams.push(new_stream());
        let b = alloc(8);
        upload(b, &[r as u32 + 1, 100 + r as u32]);
        bufs.push(b);
        outs.push(alloc(8));
    }
    unsafe {
        assert_eq!(ncclGroupStart(), result::SUCCESS);
        for r in 0..ranks {
            assert_eq!(
                ncclBroadcast(
                    bufs[r] as *const c_void,
                    outs[r] as *mut c_void,
                    2,
                    3,
                    1,
                    comms[r],
                    streams[r]
                ),
                result::SUCCESS
            );
        }
        assert_eq!(ncclGroupEnd(), result::SUCCESS);
        // A ring: every rank sends to the next and receives from the previous, grouped.
        assert_eq!(ncclGroupStart(), result::SUCCESS);
        for r in 0..ranks {
            let next = ((r + 1) % ranks) as i32;
            let prev = ((r + ranks - 1) % ranks) as i32;
            assert_eq!(
                ncclSend(bufs[r] as *const c_void, 2, 3, next, comms[r], streams[r]),
                result::SUCCESS
            );
            assert_eq!(
                ncclRecv(outs[r] as *mut c_void, 2, 3, prev, comms[r], streams[r]),
                result::SUCCESS
            );
        }
        assert_eq!(ncclGroupEnd(), result::SUCCESS);
        for r in 0..ranks {
            on_device(r);
            assert_eq!(cuStreamSynchronize(streams[r]), 0);
            let prev = (r + ranks - 1) % ranks;
            assert_eq!(
                download::<u32>(outs[r], 2),
                vec![prev as u32 + 1, 100 + prev as u32]
            );
        }
        for c in comms {
            assert_eq!(ncclCommAbort(c), result::SUCCESS);
        }
    }
    on_device(0);
}

#[test]
fn abort_releases_a_waiting_rank() {
    init();
    let mut comms = vec![null_mut(); 2];
    unsafe {
        assert_eq!(
            ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()),
            result::SUCCESS
        )
    };
    on_device(0);
    let s = new_stream();
    let b = alloc(4);
    unsafe {
        // Rank 1 never joins: rank 0 waits until the abort.
        assert_eq!(
            ncclAllReduce(b as *const c_void, b as *mut c_void, 1, 7, 0, comms[0], s),
            result::SUCCESS
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(ncclCommAbort(comms[0]), result::SUCCESS);
        assert_eq!(cuStreamSynchronize(s), 0);
        assert_eq!(ncclCommDestroy(comms[1]), result::SUCCESS);
    }
}

#[test]
fn two_ranks_on_one_device_are_refused() {
    init();
    let mut comms = vec![null_mut(); 2];
    let devs = [1i32, 1];
    unsafe {
        assert_eq!(
            ncclCommInitAll(comms.as_mut_ptr(), 2, devs.as_ptr()),
            result::INVALID_USAGE
        );
    }
    let mut id = UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    unsafe { assert_eq!(ncclGetUniqueId(&mut id), result::SUCCESS) };
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            std::thread::spawn(move || unsafe {
                init();
                on_device(1);
                let mut comm = null_mut();
                ncclCommInitRank(&mut comm, 2, id, r)
            })
        })
        .collect();
    for h in ranks {
        assert_eq!(h.join().unwrap(), result::INVALID_USAGE);
    }
}
