//! A thin actor around [`KvBlockManager`] for when block management should live outside
//! the scheduler: it answers one batched request per step (admissions, growth, commits,
//! releases, applied in order) over ractor RPC, keeping each sequence's [`SeqBlocks`] (its
//! table and block-hash chain; the token stream stays the scheduler's). The scheduler may equally own a `KvBlockManager` directly; both give the
//! same results (the actor is [`KvService`] behind a mailbox).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use dcpserve_actors::kv_manager_actor::{KvManagerActor, KvManagerArgs, KvManagerMsg, KvOp, KvReply};
//! let args = KvManagerArgs { num_blocks: 8, tokens_per_block: 4, enable_prefix_caching: true };
//! let (kv, handle) = ractor::Actor::spawn(None, KvManagerActor, args).await?;
//! let ops = vec![KvOp::Admit { seq: 1, tokens: (0..9).collect(), max_new_tokens: 512, use_prefix_cache: true }];
//! let replies = ractor::call!(kv, KvManagerMsg::Step, ops)?;
//! assert!(matches!(&replies[0], KvReply::Admitted { cached_tokens: 0, new_tokens: 9, .. }));
//! kv.stop(None);
//! handle.await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::block_manager::{KvBlockManager, PrefixCacheStats, PrefixHit, SeqBlocks};

/// How to build the manager.
#[derive(Debug, Clone)]
pub struct KvManagerArgs {
    pub num_blocks: usize,
    /// Virtual block size: per-rank block size × dcp.
    pub tokens_per_block: usize,
    pub enable_prefix_caching: bool,
}

/// One operation of a step's batch.
#[derive(Debug, Clone)]
pub enum KvOp {
    /// Admit (or re-admit) `seq` whose known tokens are `tokens`: take its cached prefix
    /// and allocate for up to `max_new_tokens` tokens after it.
    Admit {
        seq: u64,
        tokens: Vec<u32>,
        max_new_tokens: usize,
        /// Look the prefix up in the cache (off for requests that need every prompt
        /// position computed, e.g. for prompt log-probabilities).
        use_prefix_cache: bool,
    },
    /// Grow a running sequence's table to cover `num_tokens` tokens.
    Grow { seq: u64, num_tokens: usize },
    /// After a step: `append` are tokens sampled since the last op for `seq`, and
    /// `num_computed` tokens now have KV.
    Commit {
        seq: u64,
        append: Vec<u32>,
        num_computed: usize,
    },
    /// Return the blocks past the first `num_tokens` tokens (held for rejected drafts).
    Truncate { seq: u64, num_tokens: usize },
    /// Free the sequence's blocks; `forget` drops its chain too (finish/abort), otherwise
    /// the sequence stays known until it is re-admitted (preemption).
    Release { seq: u64, forget: bool },
}

/// The answer to each [`KvOp`], in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvReply {
    Admitted {
        /// Tokens already in the cache: the sequence starts computing here.
        cached_tokens: usize,
        /// Tokens after them that the blocks now cover (≤ `max_new_tokens`).
        new_tokens: usize,
        table: Vec<u32>,
    },
    Grown {
        table: Vec<u32>,
    },
    /// Not enough free blocks; nothing changed.
    NoSpace,
    Done,
    /// The operation named a sequence the service does not know.
    UnknownSeq,
}

/// Counters for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvStats {
    pub num_blocks: usize,
    pub num_free: usize,
    pub usage: f64,
    pub num_cached_blocks: usize,
    pub prefix_cache: PrefixCacheStats,
}

/// The actor's state: the manager plus every sequence's block chain.
pub struct KvService {
    mgr: KvBlockManager,
    seqs: HashMap<u64, SeqBlocks>,
}

impl KvService {
    pub fn new(args: &KvManagerArgs) -> Self {
        Self {
            mgr: KvBlockManager::new(
                args.num_blocks,
                args.tokens_per_block,
                args.enable_prefix_caching,
            ),
            seqs: HashMap::new(),
        }
    }

    pub fn manager(&self) -> &KvBlockManager {
        &self.mgr
    }

    pub fn apply(&mut self, op: KvOp) -> KvReply {
        match op {
            KvOp::Admit {
                seq,
                tokens,
                max_new_tokens,
                use_prefix_cache,
            } => {
                if let Some(mut old) = self.seqs.remove(&seq) {
                    // Admitting a sequence that still holds blocks: start over (it re-hits them).
                    self.mgr.release(&mut old);
                }
                // The chain is rebuilt from the tokens: its hashes are a pure function of
                // them, so a re-admitted (preempted) sequence re-finds its blocks.
                let st = self
                    .seqs
                    .entry(seq)
                    .or_insert(SeqBlocks::with_tokens(&tokens));
                let hit = if use_prefix_cache {
                    self.mgr.find_cached_prefix(st)
                } else {
                    PrefixHit::none()
                };
                let new_tokens = (tokens.len() - hit.num_tokens).min(max_new_tokens);
                if self.mgr.allocate(st, &hit, hit.num_tokens + new_tokens) {
                    KvReply::Admitted {
                        cached_tokens: hit.num_tokens,
                        new_tokens,
                        table: st.table().to_vec(),
                    }
                } else {
                    KvReply::NoSpace
                }
            }
            KvOp::Grow { seq, num_tokens } => {
                let Some(st) = self.seqs.get_mut(&seq) else {
                    return KvReply::UnknownSeq;
                };
                if self.mgr.allocate(st, &PrefixHit::none(), num_tokens) {
                    KvReply::Grown {
                        table: st.table().to_vec(),
                    }
                } else {
                    KvReply::NoSpace
                }
            }
            KvOp::Commit {
                seq,
                append,
                num_computed,
            } => {
                let Some(st) = self.seqs.get_mut(&seq) else {
                    return KvReply::UnknownSeq;
                };
                st.push_tokens(&append);
                self.mgr.commit_full_blocks(st, num_computed);
                KvReply::Done
            }
            KvOp::Truncate { seq, num_tokens } => {
                let Some(st) = self.seqs.get_mut(&seq) else {
                    return KvReply::UnknownSeq;
                };
                self.mgr.truncate(st, num_tokens);
                KvReply::Done
            }
            KvOp::Release { seq, forget } => {
                let Some(st) = self.seqs.get_mut(&seq) else {
                    return KvReply::UnknownSeq;
                };
                self.mgr.release(st);
                if forget {
                    self.seqs.remove(&seq);
                }
                KvReply::Done
            }
        }
    }

    pub fn stats(&self) -> KvStats {
        KvStats {
            num_blocks: self.mgr.num_blocks(),
            num_free: self.mgr.num_free(),
            usage: self.mgr.usage(),
            num_cached_blocks: self.mgr.num_cached_blocks(),
            prefix_cache: self.mgr.prefix_cache_stats(),
        }
    }

    /// Releases every sequence (keeping their tokens) and forgets the cache: the KV memory
    /// was lost.
    pub fn reset(&mut self) {
        for st in self.seqs.values_mut() {
            self.mgr.release(st);
        }
        let ok = self.mgr.reset_prefix_cache();
        debug_assert!(ok);
    }
}

/// Messages of [`KvManagerActor`].
pub enum KvManagerMsg {
    /// One step's operations, applied in order; one reply per operation.
    Step(Vec<KvOp>, RpcReplyPort<Vec<KvReply>>),
    Stats(RpcReplyPort<KvStats>),
    /// The rank group restarted: release everything and forget the cache.
    Reset(RpcReplyPort<()>),
}

pub struct KvManagerActor;

impl Actor for KvManagerActor {
    type Msg = KvManagerMsg;
    type State = KvService;
    type Arguments = KvManagerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<KvManagerMsg>,
        args: KvManagerArgs,
    ) -> Result<KvService, ActorProcessingErr> {
        if args.tokens_per_block == 0 {
            return Err("tokens_per_block must be positive".into());
        }
        Ok(KvService::new(&args))
    }

    async fn handle(
        &self,
        _myself: ActorRef<KvManagerMsg>,
        msg: KvManagerMsg,
        st: &mut KvService,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            KvManagerMsg::Step(ops, port) => {
                let replies = ops.into_iter().map(|op| st.apply(op)).collect();
                let _ = port.send(replies);
            }
            KvManagerMsg::Stats(port) => {
                let _ = port.send(st.stats());
            }
            KvManagerMsg::Reset(port) => {
                st.reset();
                let _ = port.send(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn block_manager_actor_batched_step() {
        let args = KvManagerArgs {
            num_blocks: 6,
            tokens_per_block: 4,
            enable_prefix_caching: true,
        };
        let (kv, handle) = Actor::spawn(None, KvManagerActor, args).await.unwrap();
        let prompt: Vec<u32> = (0..9).collect();
        let r = ractor::call!(
            kv,
            KvManagerMsg::Step,
            vec![KvOp::Admit {
                seq: 1,
                tokens: prompt.clone(),
                max_new_tokens: 100,
                use_prefix_cache: true
            }]
        )
        .unwrap();
        assert_eq!(
            r,
            vec![KvReply::Admitted {
                cached_tokens: 0,
                new_tokens: 9,
                table: vec![0, 1, 2]
            }]
        );
        // Step done: commit seq 1 (one sampled token), admit seq 2 with the same prompt,
        // grow seq 1 for its next token, all in one round trip.
        let r = ractor::call!(
            kv,
            KvManagerMsg::Step,
            vec![
                KvOp::Commit {
                    seq: 1,
                    append: vec![42],
                    num_computed: 9
                },
                KvOp::Admit {
                    seq: 2,
                    tokens: prompt.clone(),
                    max_new_tokens: 100,
                    use_prefix_cache: true
                },
                KvOp::Grow {
                    seq: 1,
                    num_tokens: 10
                },
                KvOp::Grow {
                    seq: 7,
                    num_tokens: 1
                },
            ]
        )
        .unwrap();
        assert_eq!(r[0], KvReply::Done);
        assert_eq!(
            r[1],
            KvReply::Admitted {
                cached_tokens: 8,
                new_tokens: 1,
                table: vec![0, 1, 3]
            }
        );
        assert_eq!(
            r[2],
            KvReply::Grown {
                table: vec![0, 1, 2]
            }
        );
        assert_eq!(r[3], KvReply::UnknownSeq);
        let s = ractor::call!(kv, KvManagerMsg::Stats).unwrap();
        assert_eq!((s.num_free, s.num_cached_blocks), (2, 2));
        assert_eq!((s.prefix_cache.queries, s.prefix_cache.hits), (18, 8));
        // Preempt seq 2, finish seq 1, re-admit seq 2: its blocks are still cached.
        let r = ractor::call!(
            kv,
            KvManagerMsg::Step,
            vec![
                KvOp::Release {
                    seq: 2,
                    forget: false
                },
                KvOp::Release {
                    seq: 1,
                    forget: true
                },
                KvOp::Admit {
                    seq: 2,
                    tokens: prompt,
                    max_new_tokens: 1,
                    use_prefix_cache: true
                },
            ]
        )
        .unwrap();
        assert!(matches!(
            r[2],
            KvReply::Admitted {
                cached_tokens: 8,
                new_tokens: 1,
                ..
            }
        ));
        ractor::call!(kv, KvManagerMsg::Reset).unwrap();
        let s = ractor::call!(kv, KvManagerMsg::Stats).unwrap();
        assert_eq!((s.num_free, s.num_cached_blocks), (6, 0));
        kv.stop(None);
        handle.await.unwrap();
    }
}
