//! Unit tests of the KV-block manager.
use super::*;

/// Feeds `seq` the tokens of `tokens` it has not seen yet (the stream only grows).
fn sync(seq: &mut SeqBlocks, tokens: &[u32]) {
    assert!(seq.num_tokens() <= tokens.len(), "token stream shrank");
    seq.push_tokens(&tokens[seq.num_tokens()..]);
}

fn find(m: &KvBlockManager, seq: &mut SeqBlocks, tokens: &[u32]) -> PrefixHit {
    sync(seq, tokens);
    m.find_cached_prefix(seq)
}

fn commit(m: &mut KvBlockManager, seq: &mut SeqBlocks, tokens: &[u32], num_computed: usize) {
    sync(seq, tokens);
    m.commit_full_blocks(seq, num_computed);
}

/// Admission as the scheduler does it: find, then allocate `chunk` more tokens.
fn admit(
    m: &mut KvBlockManager,
    seq: &mut SeqBlocks,
    tokens: &[u32],
    chunk: usize,
) -> Option<usize> {
    let hit = find(m, seq, tokens);
    let n = (tokens.len() - hit.num_tokens).min(chunk);
    m.allocate(seq, &hit, hit.num_tokens + n)
        .then_some(hit.num_tokens)
}

fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
    r.collect()
}

#[test]
fn allocates_and_frees() {
    let mut m = KvBlockManager::new(4, 16, false);
    let mut a = SeqBlocks::new();
    assert!(m.allocate(&mut a, &PrefixHit::none(), 33));
    assert_eq!(a.table(), &[0, 1, 2]);
    assert!(
        m.allocate(&mut a, &PrefixHit::none(), 48),
        "no growth needed"
    );
    assert_eq!(a.len(), 3);
    let mut b = SeqBlocks::new();
    assert!(
        !m.allocate(&mut b, &PrefixHit::none(), 17),
        "only one block left"
    );
    assert!(b.is_empty());
    assert_eq!(m.num_free(), 1);
    assert!(m.allocate(&mut b, &PrefixHit::none(), 16));
    assert_eq!(m.num_free(), 0);
    assert_eq!(m.usage(), 1.0);
    m.release(&mut a);
    assert_eq!(m.num_free(), 3);
    assert!(a.is_empty());
    assert!(m.allocate(&mut b, &PrefixHit::none(), 64));
    assert_eq!(b.len(), 4);
    m.check_invariants();
    m.release(&mut b);
    assert_eq!(m.usage(), 0.0);
    m.check_invariants();
}

#[test]
fn exhaustion_changes_nothing() {
    let mut m = KvBlockManager::new(4, 4, true);
    let p = toks(0..12);
    let mut a = SeqBlocks::new();
    assert_eq!(admit(&mut m, &mut a, &p, 100), Some(0));
    commit(&mut m, &mut a, &p, 12);
    let free_before = m.free_queue();
    let mut b = SeqBlocks::new();
    // Hits 2 blocks (cap: 11 tokens → 2 blocks), needs 2 more; only 1 free.
    let q: Vec<u32> = toks(0..8).into_iter().chain(100..110).collect();
    assert_eq!(admit(&mut m, &mut b, &q, 100), None);
    assert!(b.is_empty());
    assert_eq!(m.free_queue(), free_before);
    assert_eq!(
        m.prefix_cache_stats().requests,
        1,
        "failed admission not counted"
    );
    m.check_invariants();
    // Growing a running sequence past the pool also fails cleanly.
    assert!(!m.allocate(&mut a, &PrefixHit::none(), 100));
    assert_eq!(a.len(), 3);
    assert_eq!(m.free_queue(), free_before);
    m.check_invariants();
}

#[test]
fn prefix_hit_on_second_sequence_only_full_blocks() {
    let mut m = KvBlockManager::new(16, 4, true);
    let p = toks(0..10); // 2 full blocks + 2 tokens
    let mut a = SeqBlocks::new();
    assert_eq!(admit(&mut m, &mut a, &p, 100), Some(0));
    commit(&mut m, &mut a, &p, 10);
    assert_eq!(m.num_cached_blocks(), 2, "the partial block is not cached");
    // Same 10 tokens, then more.
    let q: Vec<u32> = toks(0..10).into_iter().chain([50, 51, 52]).collect();
    let mut b = SeqBlocks::new();
    let hit = find(&m, &mut b, &q);
    assert_eq!(hit.num_tokens, 8);
    assert_eq!(hit.blocks, a.table()[..2].to_vec());
    assert!(m.allocate(&mut b, &hit, q.len()));
    assert_eq!(b.len(), 4);
    assert_eq!(&b.table()[..2], &a.table()[..2]);
    assert_ne!(b.table()[2], a.table()[2], "partial block is never shared");
    let s = m.prefix_cache_stats();
    assert_eq!((s.requests, s.queries, s.hits), (2, 23, 8));
    assert!((s.hit_rate() - 8.0 / 23.0).abs() < 1e-12);
    m.check_invariants();
}

#[test]
fn chained_hashes_do_not_hit_after_different_prefix() {
    let mut m = KvBlockManager::new(16, 4, true);
    let p = vec![1, 2, 3, 4, 9, 9, 9, 9, 0];
    let mut a = SeqBlocks::new();
    admit(&mut m, &mut a, &p, 100).unwrap();
    commit(&mut m, &mut a, &p, p.len());
    // Second block has the same content, first differs.
    let q = vec![5, 6, 7, 8, 9, 9, 9, 9, 0];
    let mut b = SeqBlocks::new();
    assert_eq!(find(&m, &mut b, &q).num_tokens, 0);
    // The hash function is deterministic and depends on the parent.
    assert_eq!(hash_block(None, &[1, 2]), hash_block(None, &[1, 2]));
    assert_ne!(hash_block(Some(1), &[1, 2]), hash_block(Some(2), &[1, 2]));
    assert_ne!(hash_block(None, &[1, 2]), hash_block(None, &[2, 1]));
}

#[test]
fn hit_is_capped_below_the_prompt_length() {
    let mut m = KvBlockManager::new(16, 4, true);
    let p = toks(0..8); // exactly 2 blocks
    let mut a = SeqBlocks::new();
    admit(&mut m, &mut a, &p, 100).unwrap();
    commit(&mut m, &mut a, &p, 8);
    assert_eq!(m.num_cached_blocks(), 2);
    let mut b = SeqBlocks::new();
    let hit = find(&m, &mut b, &p);
    assert_eq!(
        hit.num_tokens, 4,
        "≤ len−1 = 7, rounded down to whole blocks"
    );
    let mut c = SeqBlocks::new();
    assert_eq!(find(&m, &mut c, &toks(0..9)).num_tokens, 8);
    let mut d = SeqBlocks::new();
    assert_eq!(find(&m, &mut d, &toks(0..1)).num_tokens, 0);
}

#[test]
fn lru_eviction_order() {
    let mut m = KvBlockManager::new(8, 2, true);
    let pa = vec![1, 1, 2, 2, 3, 3];
    let pb = vec![7, 7, 8, 8, 9];
    let mut a = SeqBlocks::new();
    let mut b = SeqBlocks::new();
    admit(&mut m, &mut a, &pa, 100).unwrap();
    commit(&mut m, &mut a, &pa, 6);
    admit(&mut m, &mut b, &pb, 100).unwrap();
    commit(&mut m, &mut b, &pb, 5);
    assert_eq!(a.table(), &[0, 1, 2]);
    assert_eq!(b.table(), &[3, 4, 5]);
    m.release(&mut a); // cached: 2, 1, 0 to the tail
    m.release(&mut b); // 5 is partial (uncached) → head; 4, 3 to the tail
    assert_eq!(m.free_queue(), vec![5, 6, 7, 2, 1, 0, 4, 3]);
    m.check_invariants();
    // Allocate 5 blocks: 5, 6, 7 (nothing cached), then evict a's tail blocks 2, 1.
    let mut c = SeqBlocks::new();
    assert!(m.allocate(&mut c, &PrefixHit::none(), 10));
    assert_eq!(c.table(), &[5, 6, 7, 2, 1]);
    assert_eq!(m.num_cached_blocks(), 3, "hashes of 2 and 1 evicted");
    // a's first block is still hittable; its second is gone.
    let mut a2 = SeqBlocks::new();
    let hit = find(&m, &mut a2, &pa);
    assert_eq!(hit.blocks, vec![0]);
    // b's blocks are both still there; hitting takes them out of the queue.
    let mut b2 = SeqBlocks::new();
    let hit = find(&m, &mut b2, &pb);
    assert_eq!(hit.blocks, vec![3, 4]);
    assert!(m.allocate(&mut b2, &hit, 5));
    assert_eq!(
        b2.table(),
        &[3, 4, 0],
        "third block evicts a's last cached block"
    );
    assert_eq!(m.num_free(), 0);
    m.check_invariants();
}

#[test]
fn shared_prefix_ref_counts() {
    let mut m = KvBlockManager::new(8, 4, true);
    let p = toks(0..9);
    let mut a = SeqBlocks::new();
    admit(&mut m, &mut a, &p, 100).unwrap();
    commit(&mut m, &mut a, &p, 9);
    let mut b = SeqBlocks::new();
    assert_eq!(admit(&mut m, &mut b, &p, 100), Some(8));
    assert_eq!(m.pool.ref_counts()[a.table()[0] as usize], 2);
    assert_eq!(m.pool.ref_counts()[a.table()[1] as usize], 2);
    assert_eq!(m.num_free(), 4, "2 shared + 2 partial blocks in use");
    m.release(&mut a);
    assert_eq!(m.num_free(), 5, "only a's partial block was freed");
    assert_eq!(m.pool.ref_counts()[b.table()[0] as usize], 1);
    m.check_invariants();
    // b keeps decoding into its own partial block, then finishes.
    let mut q = p.clone();
    q.extend([100, 101, 102, 103]);
    assert!(m.allocate(&mut b, &PrefixHit::none(), 13));
    commit(&mut m, &mut b, &q, 12);
    assert_eq!(m.num_cached_blocks(), 3);
    m.release(&mut b);
    assert_eq!(m.num_free(), 8);
    m.check_invariants();
    // A preempted-and-readmitted sequence re-finds its own blocks via its kept hashes.
    let hit = find(&m, &mut b, &q);
    assert_eq!(hit.num_tokens, 12);
    assert!(m.reset_prefix_cache());
    assert_eq!(m.num_cached_blocks(), 0);
    assert_eq!(find(&m, &mut b, &q).num_tokens, 0);
    m.check_invariants();
}

#[test]
fn reset_refused_while_blocks_in_use() {
    let mut m = KvBlockManager::new(4, 4, true);
    let mut a = SeqBlocks::new();
    assert!(m.allocate(&mut a, &PrefixHit::none(), 4));
    assert!(!m.reset_prefix_cache());
}

#[test]
fn disabled_caching_is_pure_allocation() {
    let mut m = KvBlockManager::new(8, 4, false);
    let p = toks(0..9);
    let mut a = SeqBlocks::new();
    assert_eq!(admit(&mut m, &mut a, &p, 100), Some(0));
    commit(&mut m, &mut a, &p, 9);
    let mut b = SeqBlocks::new();
    assert_eq!(admit(&mut m, &mut b, &p, 100), Some(0));
    assert_eq!(m.num_cached_blocks(), 0);
    assert_eq!(m.prefix_cache_stats(), PrefixCacheStats::default());
    assert!(a.table().iter().all(|x| !b.table().contains(x)));
    m.check_invariants();
}

#[test]
fn duplicate_content_stays_uncached() {
    let mut m = KvBlockManager::new(8, 4, true);
    let p = toks(0..5);
    // Two sequences admitted before either commits: both compute the same block.
    let mut a = SeqBlocks::new();
    let mut b = SeqBlocks::new();
    admit(&mut m, &mut a, &p, 100).unwrap();
    admit(&mut m, &mut b, &p, 100).unwrap();
    commit(&mut m, &mut a, &p, 5);
    commit(&mut m, &mut b, &p, 5);
    assert_eq!(m.num_cached_blocks(), 1);
    let bt = b.table().to_vec();
    assert_eq!(bt, vec![2, 3]);
    m.release(&mut b);
    assert_eq!(
        m.free_queue()[..2],
        [2, 3],
        "uncached blocks are reused first"
    );
    m.check_invariants();
}

/// Tiny deterministic RNG for the stress test.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct ModelSeq {
    kv: SeqBlocks,
    tokens: Vec<u32>,
    num_computed: usize,
    running: bool,
}

#[test]
fn randomized_against_a_model() {
    for (seed, caching) in [(1u64, true), (2, true), (3, false), (4, true)] {
        let mut rng = XorShift(0x1234_5678 ^ seed.wrapping_mul(0x9e37_79b9));
        let tpb = 1 + rng.below(4);
        let nb = 8 + rng.below(40);
        let mut m = KvBlockManager::new(nb, tpb, caching);
        // What each block holds: the full token prefix up to its end, once computed.
        let mut content: Vec<Option<Vec<u32>>> = vec![None; nb];
        let mut seqs: Vec<ModelSeq> = Vec::new();
        let prefixes: Vec<Vec<u32>> = (0..4)
            .map(|_| (0..rng.below(12)).map(|_| rng.below(3) as u32).collect())
            .collect();
        for _ in 0..4000 {
            match rng.below(10) {
                // New sequence: a shared prefix plus a random tail.
                0 | 1 if seqs.len() < 12 => {
                    let mut t = prefixes[rng.below(prefixes.len())].clone();
                    t.extend((0..1 + rng.below(10)).map(|_| rng.below(3) as u32));
                    seqs.push(ModelSeq {
                        kv: SeqBlocks::new(),
                        tokens: t,
                        num_computed: 0,
                        running: false,
                    });
                }
                // Schedule a step for one sequence (admission or continuation).
                2..=6 if !seqs.is_empty() => {
                    let i = rng.below(seqs.len());
                    let s = &mut seqs[i];
                    if !s.running {
                        let hit = find(&m, &mut s.kv, &s.tokens);
                        assert!(hit.num_tokens < s.tokens.len());
                        assert_eq!(hit.num_tokens % tpb, 0);
                        for (j, &b) in hit.blocks.iter().enumerate() {
                            assert_eq!(
                                content[b as usize].as_deref(),
                                Some(&s.tokens[..(j + 1) * tpb]),
                                "hit on a block with other content"
                            );
                        }
                        let free_before = m.num_free();
                        let n = 1 + rng.below(s.tokens.len() - hit.num_tokens);
                        if !m.allocate(&mut s.kv, &hit, hit.num_tokens + n) {
                            assert!(s.kv.is_empty());
                            assert_eq!(m.num_free(), free_before);
                            m.check_invariants();
                            continue;
                        }
                        s.running = true;
                        s.num_computed = hit.num_tokens;
                        for &b in &s.kv.table()[hit.blocks.len()..] {
                            content[b as usize] = None; // fresh: garbage until computed
                        }
                        s.num_computed += n;
                    } else {
                        if s.num_computed == s.tokens.len() {
                            s.tokens.push(rng.below(3) as u32); // "sampled"
                        }
                        let n = 1 + rng.below(s.tokens.len() - s.num_computed);
                        let old_len = s.kv.len();
                        if !m.allocate(&mut s.kv, &PrefixHit::none(), s.num_computed + n) {
                            assert_eq!(s.kv.len(), old_len);
                            m.check_invariants();
                            continue;
                        }
                        for &b in &s.kv.table()[old_len..] {
                            content[b as usize] = None;
                        }
                        s.num_computed += n;
                    }
                    assert!(s.kv.len() * tpb >= s.num_computed);
                    // The step ran: blocks that are full now hold their prefix.
                    for j in 0..s.num_computed / tpb {
                        let b = s.kv.table()[j] as usize;
                        let want = &s.tokens[..(j + 1) * tpb];
                        if let Some(c) = &content[b] {
                            assert_eq!(c.as_slice(), want, "shared block rewritten");
                        }
                        content[b] = Some(want.to_vec());
                    }
                    commit(&mut m, &mut s.kv, &s.tokens, s.num_computed);
                }
                // Preempt (keep the sequence) or finish (drop it).
                7 | 8 if !seqs.is_empty() => {
                    let i = rng.below(seqs.len());
                    m.release(&mut seqs[i].kv);
                    seqs[i].running = false;
                    seqs[i].num_computed = 0;
                    if rng.below(2) == 0 {
                        seqs.swap_remove(i);
                    }
                }
                // Finish by dropping the chain without a release: the manager takes the
                // blocks back on its next change.
                9 if !seqs.is_empty() => {
                    let i = rng.below(seqs.len());
                    seqs.swap_remove(i);
                    m.reclaim_dropped();
                }
                _ => {}
            }
            m.check_invariants();
            // Reference counts match the tables exactly.
            let mut refs = vec![0u32; nb];
            for s in &seqs {
                for &b in s.kv.table() {
                    refs[b as usize] += 1;
                }
            }
            assert_eq!(refs, m.pool.ref_counts());
            // Every cached block holds exactly the content its hash names.
            for (b, h) in m.pool.hashes().iter().enumerate() {
                if let Some(h) = h {
                    let c = content[b].as_ref().expect("cached block was computed");
                    let mut ph = None;
                    for blk in c.chunks(tpb) {
                        ph = Some(hash_block(ph, blk));
                    }
                    assert_eq!(ph, Some(*h));
                }
            }
        }
        if caching {
            assert!(m.hits() > 0, "stress test never hit the cache");
        }
        for s in &mut seqs {
            m.release(&mut s.kv);
        }
        assert_eq!(m.num_free(), nb);
        m.check_invariants();
    }
}

#[test]
fn dropped_chain_returns_its_blocks() {
    let mut m = KvBlockManager::new(6, 4, true);
    let p = toks(0..10);
    let mut a = SeqBlocks::new();
    assert_eq!(admit(&mut m, &mut a, &p, 100), Some(0));
    commit(&mut m, &mut a, &p, 10);
    assert_eq!(m.num_free(), 3);
    drop(a);
    // Taken back by the next change, as a release would: the full blocks stay hittable.
    let mut b = SeqBlocks::new();
    assert_eq!(admit(&mut m, &mut b, &p, 100), Some(8));
    assert_eq!(
        m.num_free(),
        3,
        "b re-took a's two cached blocks and one new one"
    );
    m.check_invariants();
    // A chain released first gives nothing back twice.
    m.release(&mut b);
    drop(b);
    m.reclaim_dropped();
    assert_eq!(m.num_free(), 6);
    m.check_invariants();
    // A chain that never held blocks has nothing to give back.
    drop(SeqBlocks::with_tokens(&p));
    m.reclaim_dropped();
    assert_eq!(m.num_free(), 6);
}

#[test]
fn chain_keeps_only_the_unfinished_block() {
    let mut m = KvBlockManager::new(4, 4, true);
    let mut a = SeqBlocks::new();
    for t in 0..11u32 {
        a.push_tokens(&[t]);
    }
    assert_eq!(a.num_tokens(), 11);
    let hit = m.find_cached_prefix(&mut a);
    assert!(m.allocate(&mut a, &hit, 11));
    m.commit_full_blocks(&mut a, 11);
    // Fed one token at a time or all at once, the chain hashes the same.
    let mut b = SeqBlocks::with_tokens(&toks(0..11));
    assert_eq!(m.find_cached_prefix(&mut b).num_tokens, 8);
    assert_eq!(a.hashes, b.hashes);
    assert!(a.unhashed_len() < 4);
}
