//! Models named by Hugging Face repo ids, resolved from a hub cache built from the
//! fixtures (tests/hub/cache_layout.rs) and from a stand-in hub on 127.0.0.1
//! (tests/hub/fake_hub.rs): by id and by revision, a GGUF file selector, the fallback to
//! the cache when the hub cannot be reached, downloads in the hub's layout, the engine
//! started offline, and the error of a model that is nowhere. No test reaches the network.

#[path = "hub/cache_layout.rs"]
mod cache_layout;
mod common;
#[path = "hub/fake_hub.rs"]
mod fake_hub;

use std::path::{Path, PathBuf};

use cache_layout::{folder_files, FakeCache, COMMIT_A, COMMIT_B};
use common::*;
use dcpserve::hub::{resolve_hub_model, resolve_model, HubModelId, HubSettings, ModelSpec};
use dcpserve::{Engine, Prompt};
use dcpserve_model::ModelFiles;

fn id(repo: &str, file: Option<&str>) -> HubModelId {
    HubModelId {
        repo: repo.into(),
        file: file.map(str::to_string),
    }
}

fn offline(cache: &Path) -> HubSettings {
    HubSettings {
        cache_dir: cache.to_path_buf(),
        revision: "main".into(),
        gguf_file: None,
        offline: true,
        token: None,
        endpoint: None,
    }
}

/// tiny-llama at commit A (`main`), tiny-qwen3 at commit B (`v2`).
fn two_revisions(tag: &str) -> FakeCache {
    let cache = FakeCache::new(tag);
    cache.add_snapshot(
        "test-org/tiny",
        COMMIT_A,
        &folder_files(&fixture("tiny-llama")),
        &["main"],
    );
    cache.add_snapshot(
        "test-org/tiny",
        COMMIT_B,
        &folder_files(&fixture("tiny-qwen3")),
        &["v2"],
    );
    cache
}

fn architecture(path: &Path) -> String {
    format!("{:?}", ModelFiles::read_config(path).unwrap().architecture)
}

#[test]
fn a_cached_model_resolves_by_id_and_by_revision() {
    let cache = two_revisions("revisions");
    let mut s = offline(&cache.root);
    let main = resolve_hub_model(&id("test-org/tiny", None), &s).unwrap();
    assert_eq!(
        main,
        cache
            .repo_dir("test-org/tiny")
            .join("snapshots")
            .join(COMMIT_A)
    );
    assert_eq!(architecture(&main), architecture(&fixture("tiny-llama")));
    s.revision = "v2".into();
    let v2 = resolve_hub_model(&id("test-org/tiny", None), &s).unwrap();
    assert_eq!(architecture(&v2), architecture(&fixture("tiny-qwen3")));
    assert_ne!(architecture(&v2), architecture(&main));
    // A commit needs no ref.
    s.revision = COMMIT_B.into();
    assert_eq!(
        resolve_hub_model(&id("test-org/tiny", None), &s).unwrap(),
        v2
    );
    s.revision = "v3".into();
    let e = resolve_hub_model(&id("test-org/tiny", None), &s)
        .unwrap_err()
        .to_string();
    assert!(e.contains("revision v3") && e.contains("refs/v3"), "{e}");
    // The weights open from the snapshot's links into blobs/.
    ModelFiles::open(&main).unwrap();
}

#[test]
fn a_gguf_repo_takes_a_file_selector() {
    let cache = FakeCache::new("gguf");
    let repo = "test-org/tiny-deepseek-GGUF";
    cache.add_snapshot(
        repo,
        COMMIT_A,
        &[
            (
                "tiny-deepseek-F32.gguf",
                fixture("tiny-deepseek/model.gguf"),
            ),
            (
                "tiny-deepseek-noq-F32.gguf",
                fixture("tiny-deepseek-noq/model.gguf"),
            ),
        ],
        &["main"],
    );
    let mut s = offline(&cache.root);
    let q_lora = |p: &Path| ModelFiles::read_config(p).unwrap().mla.unwrap().q_lora_rank;
    // By file name after the colon, and by --gguf-file.
    let noq = resolve_hub_model(&id(repo, Some("tiny-deepseek-noq-F32.gguf")), &s).unwrap();
    assert!(
        noq.ends_with("tiny-deepseek-noq-F32.gguf"),
        "{}",
        noq.display()
    );
    assert_eq!(
        q_lora(&noq),
        None,
        "tiny-deepseek-noq has no query compression"
    );
    s.gguf_file = Some("tiny-deepseek-F32.gguf".into());
    let q = resolve_hub_model(&id(repo, None), &s).unwrap();
    assert!(q_lora(&q).is_some(), "tiny-deepseek compresses its queries");
    // The colon and the flag naming different files is refused.
    let e = resolve_hub_model(&id(repo, Some("tiny-deepseek-noq-F32.gguf")), &s).unwrap_err();
    assert!(e.to_string().contains("give one"), "{e}");
    s.gguf_file = None;
    // A quantization both files end with, one neither has, and none at all.
    let e = resolve_hub_model(&id(repo, Some("F32")), &s)
        .unwrap_err()
        .to_string();
    assert!(e.contains("several .gguf files match `F32`"), "{e}");
    let e = resolve_hub_model(&id(repo, Some("Q4_K_M")), &s)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no .gguf file matches `Q4_K_M`"), "{e}");
    let e = resolve_hub_model(&id(repo, None), &s)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--gguf-file") && e.contains("tiny-deepseek-noq-F32.gguf"),
        "{e}"
    );
    // `repo:FILE` as one argument, as on the command line.
    let spec = format!("{repo}:tiny-deepseek-noq-F32.gguf");
    assert_eq!(
        ModelSpec::parse(Path::new(&spec)),
        ModelSpec::Hub(id(repo, Some("tiny-deepseek-noq-F32.gguf")))
    );
}

#[test]
fn a_missing_model_says_which_repo_files_and_cache_were_searched() {
    let cache = FakeCache::new("missing");
    let s = offline(&cache.root);
    let e = resolve_hub_model(&id("test-org/absent", None), &s)
        .unwrap_err()
        .to_string();
    for needle in [
        "`test-org/absent`",
        "revision main",
        &cache.root.display().to_string(),
        "models--test-org--absent",
        "HF_HUB_OFFLINE",
        "config.json",
        "safetensors",
    ] {
        assert!(e.contains(needle), "{needle} missing from: {e}");
    }
    let e = resolve_hub_model(&id("test-org/absent", Some("Q8_0")), &s)
        .unwrap_err()
        .to_string();
    assert!(e.contains("matching `Q8_0`"), "{e}");
    // A snapshot without its tokenizer is no model either.
    let partial: Vec<_> = folder_files(&fixture("tiny-llama"))
        .into_iter()
        .filter(|(name, _)| *name != "tokenizer.json")
        .collect();
    cache.add_snapshot("test-org/partial", COMMIT_A, &partial, &["main"]);
    let e = resolve_hub_model(&id("test-org/partial", None), &s)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer.json") && e.contains(COMMIT_A), "{e}");
}

#[test]
fn a_local_path_wins_over_an_id() {
    // Tests run in the package folder, where `fixtures/tiny-llama` is both a folder and
    // of an id's form.
    let local = Path::new("fixtures/tiny-llama");
    assert!(local.is_dir());
    assert_eq!(
        ModelSpec::parse(local),
        ModelSpec::Local(local.to_path_buf())
    );
    let flags = dcpserve::ModelSourceFlags {
        download_dir: Some(PathBuf::from("/nonexistent-hf-cache")),
        ..Default::default()
    };
    assert_eq!(resolve_model(local, &flags).unwrap(), local);
    let e = resolve_model(Path::new("no/such.gguf"), &flags)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "Model path no/such.gguf does not exist.");
}

/// A port on 127.0.0.1 where nothing listens.
fn closed_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

#[test]
fn an_unreachable_hub_falls_back_to_the_cache() {
    let cache = two_revisions("unreachable");
    let mut s = offline(&cache.root);
    s.offline = false;
    s.endpoint = Some(closed_port());
    let got = resolve_hub_model(&id("test-org/tiny", None), &s).unwrap();
    assert_eq!(
        got,
        cache
            .repo_dir("test-org/tiny")
            .join("snapshots")
            .join(COMMIT_A)
    );
    let e = resolve_hub_model(&id("test-org/absent", None), &s)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot be reached") && e.contains("test-org/absent"),
        "{e}"
    );
}

#[test]
fn a_reachable_hub_downloads_into_the_cache_in_its_layout() {
    let files: Vec<(String, Vec<u8>)> = folder_files(&fixture("tiny-llama"))
        .into_iter()
        .map(|(name, path)| (name.to_string(), std::fs::read(path).unwrap()))
        .chain([("README.md".to_string(), b"# tiny".to_vec())])
        .collect();
    let hub = fake_hub::FakeHub::start("test-org/tiny", COMMIT_B, files.clone());
    let cache = FakeCache::new("download");
    let mut s = offline(&cache.root);
    s.offline = false;
    s.endpoint = Some(hub.endpoint());
    s.token = Some("hf_test".into());
    let got = resolve_hub_model(&id("test-org/tiny", None), &s).unwrap();
    let repo = cache.repo_dir("test-org/tiny");
    assert_eq!(got, repo.join("snapshots").join(COMMIT_B));
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main"))
            .unwrap()
            .trim(),
        COMMIT_B
    );
    for (name, bytes) in &files {
        let file = got.join(name);
        if name == "README.md" {
            assert!(!file.exists(), "only the model's files are fetched");
            continue;
        }
        assert!(file.is_symlink(), "{name} links into blobs/");
        assert_eq!(&std::fs::read(&file).unwrap(), bytes, "{name}");
        assert!(std::fs::canonicalize(&file)
            .unwrap()
            .starts_with(std::fs::canonicalize(repo.join("blobs")).unwrap()));
    }
    let seen = hub.seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .all(|r| r.authorization.as_deref() == Some("Bearer hf_test")),
        "{seen:?}"
    );
    let fetched = hub.downloads().len();
    // Complete in the cache: asked again, the hub is asked for the commit only.
    assert_eq!(
        resolve_hub_model(&id("test-org/tiny", None), &s).unwrap(),
        got
    );
    assert_eq!(hub.downloads().len(), fetched, "nothing downloaded twice");
    // And offline, the cache alone gives the same folder.
    s.offline = true;
    assert_eq!(
        resolve_hub_model(&id("test-org/tiny", None), &s).unwrap(),
        got
    );
    ModelFiles::open(&got).unwrap();
    // A repo the hub does not have is an error, not a fallback.
    s.offline = false;
    let e = resolve_hub_model(&id("test-org/absent", None), &s)
        .unwrap_err()
        .to_string();
    assert!(e.contains("HTTP 404") && e.contains("HF_TOKEN"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_builder_starts_offline_from_the_cache() {
    // The only test of this file that reads the process's environment: the builder
    // takes the hub settings from it, as the command line does.
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let cache = two_revisions("builder");
    let from_hub = Engine::builder("test-org/tiny")
        .download_dir(&cache.root)
        .config(f32_config())
        .build()
        .await
        .unwrap();
    assert_eq!(
        from_hub.name(),
        "test-org/tiny",
        "served under its id, as vLLM"
    );
    let v2 = Engine::builder("test-org/tiny")
        .download_dir(&cache.root)
        .revision("v2")
        .config(f32_config())
        .build()
        .await
        .unwrap();
    let from_folder = |name: &str| Engine::builder(fixture(name)).config(f32_config()).build();
    let prompt = || Prompt::Tokens(vec![5, 17, 42, 99]);
    for (engine, folder) in [(&from_hub, "tiny-llama"), (&v2, "tiny-qwen3")] {
        let want = from_folder(folder)
            .await
            .unwrap()
            .complete(prompt(), greedy(6))
            .await
            .unwrap();
        let got = engine.complete(prompt(), greedy(6)).await.unwrap();
        assert_eq!(got.token_ids, want.token_ids, "{folder}");
    }
    let e = Engine::builder("test-org/absent")
        .download_dir(&cache.root)
        .build()
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("test-org/absent") && e.contains("HF_HUB_OFFLINE"),
        "{e}"
    );
}
