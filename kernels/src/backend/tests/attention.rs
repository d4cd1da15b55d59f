//! Attention ops through the [`Backend`] trait on every backend: paged GQA attention and
//! MLA latent attention on caches of every [`KvCacheDType`], and the LSE merge of shards.

use super::*;

/// A softmax over `scores` (f64) averaging `values`; `(out, lse)`.
fn naive_attention(scores: &[f64], values: &[&[f32]], dim: usize) -> (Vec<f64>, f64) {
    if scores.is_empty() {
        return (vec![0.0; dim], f64::NEG_INFINITY);
    }
    let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = scores.iter().map(|s| (s - mx).exp()).sum();
    let mut out = vec![0.0; dim];
    for (s, v) in scores.iter().zip(values) {
        let p = (s - mx).exp() / z;
        for (o, &x) in out.iter_mut().zip(v.iter()) {
            *o += p * x as f64;
        }
    }
    (out, mx + z.ln())
}

/// Random block tables over a shuffled cache: `(tables, n_blocks)`.
fn block_tables(lens: &[usize], bs: usize, seed: u64) -> (Vec<Vec<u32>>, usize) {
    let per: Vec<usize> = lens.iter().map(|l| l.div_ceil(bs)).collect();
    let n_blocks = per.iter().sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
    let mut rng = Lcg(seed);
    for i in (1..ids.len()).rev() {
        let j = ((rng.next() + 1.0) / 2.0 * (i + 1) as f32) as usize % (i + 1);
        ids.swap(i, j);
    }
    let mut tables = Vec::new();
    let mut next = 0;
    for p in per {
        tables.push(ids[next..next + p].to_vec());
        next += p;
    }
    (tables, n_blocks)
}

/// GQA paged attention after `write_kv` (with a skipped slot), decode tokens long
/// enough to split the keys across threads, and a token without keys; with caches of
/// every [`KvCacheDType`], against the reference on the values the cache holds (as
/// tight as f32: the kernels convert elements exactly), and the stored values within
/// the type's rounding of what was written. K/V head rows span magnitudes 1 to 2⁻²⁰
/// (FP8 at a fixed scale of 1 would flush the small ones to zero; scaled per row, each
/// keeps the type's relative precision).
fn paged_attention_matches_reference<B: Backend>(dev: &B) {
    for dt in KvCacheDType::ALL {
        paged_attention_with_cache::<B>(dev, dt);
    }
}

fn paged_attention_with_cache<B: Backend>(dev: &B, dt: KvCacheDType) {
    let (nq, nkv, hd, bs) = (4, 2, 16, 4);
    let lens = [600usize, 45];
    let (tables, n_blocks) = block_tables(&lens, bs, 7);
    let row = nkv * hd;
    let mut rng = Lcg(8);
    let mut kc = dev.kv_zeros(dt, n_blocks * bs * row, hd).unwrap();
    let mut vc = dev.kv_zeros(dt, n_blocks * bs * row, hd).unwrap();
    let mut keys = Vec::new(); // per sequence, host copies of the K/V rows
    for (s, &len) in lens.iter().enumerate() {
        let (k, v) = (rng.vec((len + 1) * row), rng.vec((len + 1) * row));
        let (k, v) = (spread_rows(k, hd), spread_rows(v, hd));
        let mut slots: Vec<usize> = (0..len)
            .map(|j| tables[s][j / bs] as usize * bs + j % bs)
            .collect();
        slots.push(usize::MAX); // a token another rank stores
        let (kb, vb) = (dev.upload(&k).unwrap(), dev.upload(&v).unwrap());
        let (kv, vv) = (kv_all_mut(dev, &mut kc), kv_all_mut(dev, &mut vc));
        dev.write_kv(kv, vv, nkv, hd, &slots, all(dev, &kb), all(dev, &vb))
            .unwrap();
        keys.push((k, v, slots));
    }
    // What the caches hold, per sequence in token order; within rounding of the input
    // (half a unit in the last place, or half the smallest subnormal step of FP8 at the
    // row's scale, which is at most max|row| / 224 (E4M3) or / 28672 (E5M2)).
    let (kh, vh) = (kv_host(dev, &kc), kv_host(dev, &vc));
    let floor = match dt {
        KvCacheDType::Fp8E4M3 => 2f32.powi(-10) / 224.0,
        KvCacheDType::Fp8E5M2 => 2f32.powi(-17) / 28672.0,
        _ => 0.0,
    };
    let keys: Vec<(Vec<f32>, Vec<f32>)> = keys
        .into_iter()
        .map(|(k, v, slots)| {
            let held = |cache: &[f32], written: &[f32]| -> Vec<f32> {
                let mut out = Vec::new();
                for (t, &slot) in slots.iter().enumerate().filter(|(_, &s)| s != usize::MAX) {
                    for i in 0..row {
                        let (x, y) = (written[t * row + i], cache[slot * row + i]);
                        let head = t * row + i / hd * hd;
                        let max = written[head..head + hd]
                            .iter()
                            .fold(0.0f32, |m, x| m.max(x.abs()));
                        let err = (x - y).abs();
                        assert!(
                            err <= dt.relative_precision() * x.abs() + floor * max,
                            "{dt}: stored {y} for {x}"
                        );
                        out.push(y);
                    }
                }
                out
            };
            (held(&kh, &k), held(&vh, &v))
        })
        .collect();
    let token_seq = [0u32, 0, 1, 1];
    let token_kv_len = [599u32, 600, 45, 0];
    let q = rng.vec(token_seq.len() * nq * hd);
    let qb = dev.upload(&q).unwrap();
    let bt: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
    let p = PagedAttentionParams {
        n_q_heads: nq,
        n_kv_heads: nkv,
        head_dim: hd,
        scale: 0.25,
        batch: PagedBatch {
            block_size: bs,
            token_seq: &token_seq,
            token_kv_len: &token_kv_len,
            block_tables: &bt,
        },
    };
    let mut out = dev.zeros(q.len()).unwrap();
    let mut lse = dev.zeros(token_seq.len() * nq).unwrap();
    let (ov, lv) = (all_mut(dev, &mut out), all_mut(dev, &mut lse));
    dev.paged_attention(
        all(dev, &qb),
        &p,
        kv_all(dev, &kc),
        kv_all(dev, &vc),
        ov,
        lv,
    )
    .unwrap();
    let (mut want_out, mut want_lse) = (Vec::new(), Vec::new());
    for (t, (&s, &len)) in token_seq.iter().zip(&token_kv_len).enumerate() {
        let (k, v) = &keys[s as usize];
        for h in 0..nq {
            let g = h / (nq / nkv);
            let qh = &q[(t * nq + h) * hd..(t * nq + h + 1) * hd];
            let ks: Vec<&[f32]> = (0..len as usize)
                .map(|j| &k[j * row + g * hd..j * row + (g + 1) * hd])
                .collect();
            let vs: Vec<&[f32]> = (0..len as usize)
                .map(|j| &v[j * row + g * hd..j * row + (g + 1) * hd])
                .collect();
            let sc: Vec<f64> = ks
                .iter()
                .map(|kr| 0.25 * qh.iter().zip(*kr).map(|(a, b)| (a * b) as f64).sum::<f64>())
                .collect();
            let (o, l) = naive_attention(&sc, &vs, hd);
            want_out.extend(o);
            want_lse.push(l);
        }
    }
    assert_close(
        &format!("{dt} paged out"),
        &host(dev, &out),
        &want_out,
        1e-4,
    );
    assert_close(
        &format!("{dt} paged lse"),
        &host(dev, &lse),
        &want_lse,
        1e-5,
    );
}

/// Rows of `width` values of `x` scaled by 2⁻ᵏ, k cycling through 0..=20 (row
/// magnitudes FP8 holds only with a scale per row).
fn spread_rows(mut x: Vec<f32>, width: usize) -> Vec<f32> {
    for (i, row) in x.chunks_exact_mut(width).enumerate() {
        let f = 2f32.powi(-((i * 5 % 21) as i32));
        row.iter_mut().for_each(|v| *v *= f);
    }
    x
}

/// MLA latent attention (values are the key rows' prefix), with split keys, on latent
/// caches of every [`KvCacheDType`] against the reference on the values they hold
/// (latent rows of magnitudes 1 to 2⁻²⁰, each within the type's rounding).
fn latent_attention_matches_reference<B: Backend>(dev: &B) {
    for dt in KvCacheDType::ALL {
        latent_attention_with_cache::<B>(dev, dt);
    }
}

fn latent_attention_with_cache<B: Backend>(dev: &B, dt: KvCacheDType) {
    let (h, d, vd, bs) = (3, 12, 8, 4);
    let lens = [600usize, 30];
    let (tables, n_blocks) = block_tables(&lens, bs, 9);
    let mut rng = Lcg(10);
    let written = spread_rows(rng.vec(n_blocks * bs * d), d);
    let cache = kv_upload(dev, dt, &written, d);
    let cache_host = kv_host(dev, &cache);
    for (w, c) in written.chunks_exact(d).zip(cache_host.chunks_exact(d)) {
        let max = w.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        for (&x, &y) in w.iter().zip(c) {
            // Relative rounding, and half the smallest subnormal step at the row's scale.
            let floor = max * 2f32.powi(-17);
            assert!(
                (x - y).abs() <= dt.relative_precision() * x.abs() + floor,
                "{dt}: stored {y} for {x}"
            );
        }
    }
    let token_seq = [0u32, 1, 1];
    let token_kv_len = [600u32, 30, 0];
    let q = rng.vec(token_seq.len() * h * d);
    let qb = dev.upload(&q).unwrap();
    let bt: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
    let p = LatentAttentionParams {
        n_heads: h,
        dim: d,
        v_dim: vd,
        scale: 0.7,
        batch: PagedBatch {
            block_size: bs,
            token_seq: &token_seq,
            token_kv_len: &token_kv_len,
            block_tables: &bt,
        },
    };
    let mut out = dev.zeros(token_seq.len() * h * vd).unwrap();
    let mut lse = dev.zeros(token_seq.len() * h).unwrap();
    let (ov, lv) = (all_mut(dev, &mut out), all_mut(dev, &mut lse));
    dev.latent_attention(all(dev, &qb), &p, kv_all(dev, &cache), ov, lv)
        .unwrap();
    let (mut want_out, mut want_lse) = (Vec::new(), Vec::new());
    for (t, (&s, &len)) in token_seq.iter().zip(&token_kv_len).enumerate() {
        let rows: Vec<&[f32]> = (0..len as usize)
            .map(|j| {
                let slot = tables[s as usize][j / bs] as usize * bs + j % bs;
                &cache_host[slot * d..(slot + 1) * d]
            })
            .collect();
        for hh in 0..h {
            let qh = &q[(t * h + hh) * d..(t * h + hh + 1) * d];
            let sc: Vec<f64> = rows
                .iter()
                .map(|r| 0.7 * qh.iter().zip(*r).map(|(a, b)| (a * b) as f64).sum::<f64>())
                .collect();
            let vals: Vec<&[f32]> = rows.iter().map(|r| &r[..vd]).collect();
            let (o, l) = naive_attention(&sc, &vals, vd);
            want_out.extend(o);
            want_lse.push(l);
        }
    }
    assert_close(
        &format!("{dt} latent out"),
        &host(dev, &out),
        &want_out,
        1e-4,
    );
    assert_close(
        &format!("{dt} latent lse"),
        &host(dev, &lse),
        &want_lse,
        1e-5,
    );
}

/// Attention over three KV shards (one empty), merged by LSE, equals attention over
/// the whole range.
fn merge_lse_of_shards<B: Backend>(dev: &B) {
    let (h, d, bs) = (2, 8, 4);
    let n_keys = 300;
    let (tables, n_blocks) = block_tables(&[n_keys], bs, 11);
    let mut rng = Lcg(12);
    let cache = kv_upload(dev, KvCacheDType::F32, &rng.vec(n_blocks * bs * d), d);
    let qb = dev.upload(&rng.vec(h * d)).unwrap();
    let attend = |table: &[u32], len: u32| {
        let bt = [table];
        let p = LatentAttentionParams {
            n_heads: h,
            dim: d,
            v_dim: d,
            scale: 0.5,
            batch: PagedBatch {
                block_size: bs,
                token_seq: &[0],
                token_kv_len: &[len],
                block_tables: &bt,
            },
        };
        let (mut out, mut lse) = (dev.zeros(h * d).unwrap(), dev.zeros(h).unwrap());
        let (ov, lv) = (all_mut(dev, &mut out), all_mut(dev, &mut lse));
        dev.latent_attention(all(dev, &qb), &p, kv_all(dev, &cache), ov, lv)
            .unwrap();
        (out, lse)
    };
    let whole = attend(&tables[0], n_keys as u32);
    let first = attend(&tables[0], 128); // keys 0..128 = blocks 0..32
    let rest = attend(&tables[0][32..], n_keys as u32 - 128);
    let empty = attend(&tables[0], 0);
    let outs = [all(dev, &first.0), all(dev, &rest.0), all(dev, &empty.0)];
    let lses = [all(dev, &first.1), all(dev, &rest.1), all(dev, &empty.1)];
    let (mut out, mut lse) = (dev.zeros(h * d).unwrap(), dev.zeros(h).unwrap());
    let (ov, lv) = (all_mut(dev, &mut out), all_mut(dev, &mut lse));
    dev.merge_lse(&outs, &lses, h, d, ov, lv).unwrap();
    let f64s = |v: Vec<f32>| v.into_iter().map(|x| x as f64).collect::<Vec<_>>();
    assert_close(
        "merged out",
        &host(dev, &out),
        &f64s(host(dev, &whole.0)),
        1e-5,
    );
    assert_close(
        "merged lse",
        &host(dev, &lse),
        &f64s(host(dev, &whole.1)),
        1e-6,
    );
    assert!(host(dev, &empty.1).iter().all(|&l| l == f32::NEG_INFINITY));

    // The reduce-scatter form: each shard's partial scaled by its share of the merged
    // LSE; the scaled partials sum to the same merged output.
    let parts = [&first, &rest, &empty];
    let all_lse: Vec<f32> = parts.iter().flat_map(|p| host(dev, &p.1)).collect();
    let all_lse = dev.upload(&all_lse).unwrap();
    let mut sum = dev.zeros(h * d).unwrap();
    for p in parts {
        let mut scaled = dev.upload(&host(dev, &p.0)).unwrap();
        let sv = all_mut(dev, &mut scaled);
        dev.scale_by_lse_share(sv, all(dev, &p.1), all(dev, &all_lse), 3, d)
            .unwrap();
        dev.add(all_mut(dev, &mut sum), all(dev, &scaled)).unwrap();
    }
    assert_close(
        "scaled partials' sum",
        &host(dev, &sum),
        &f64s(host(dev, &whole.0)),
        1e-5,
    );
}

test_on_every_backend!(
    paged_attention_matches_reference,
    latent_attention_matches_reference,
    merge_lse_of_shards,
);
