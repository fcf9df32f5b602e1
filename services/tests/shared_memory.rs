//! Shared memory between processes of one server, made and lent by one
//! daemon in this process: what a peer writes the owner reads and the
//! other way round, as the owner and the access rules allow, until the
//! daemon withdraws it.

use std::path::PathBuf;

use uniplane_services::client::{embedded, Client, Session, SharedAccess};
use uniplane_services::config::Config;
use uniplane_services::Daemon;

fn config_with(rules: &str) -> Config {
    let text = format!("[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n{rules}");
    Config::parse(&text, "test").unwrap()
}

/// A daemon in this process with `rules`, and two processes attached
/// to it: the owner and a peer.
async fn owner_and_peer(name: &str, rules: &str) -> (PathBuf, Daemon, Session, Session) {
    let dir = runtime(name);
    let (daemon, client) = embedded(config_with(rules), &dir).await.unwrap();
    let owner = client.attach("owner").await.unwrap();
    let peer = Client::connect(&dir)
        .await
        .unwrap()
        .attach("peer")
        .await
        .unwrap();
    (dir, daemon, owner, peer)
}

fn runtime(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uniplane-shared-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_writes_what_the_owner_reads_as_the_owner_lets_it_until_the_owner_leaves() {
    let (dir, _daemon, owner, peer) = owner_and_peer("lend", "").await;
    let rw = owner.share(0, 1 << 20, true).await.unwrap();
    let ro = owner.share(1, 4096, false).await.unwrap();
    assert!(rw.writable() && ro.writable(), "the owner writes its own");
    let dup = owner.share(0, 64, true).await.unwrap_err();
    assert!(dup.to_string().contains("shared already"), "{dup}");

    let theirs = peer.map_shared(owner.uid(), 0).await.unwrap();
    assert_eq!((theirs.len(), theirs.writable()), (1 << 20, true));
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(theirs.write(4096, &data), SharedAccess::Done);
    let mut seen = vec![0u8; data.len()];
    assert_eq!(rw.read(4096, &mut seen), SharedAccess::Done);
    assert!(seen == data, "the owner reads what the peer wrote");
    assert_eq!(rw.write(0, b"from the owner"), SharedAccess::Done);
    let mut back = [0u8; 14];
    assert_eq!(theirs.read(0, &mut back), SharedAccess::Done);
    assert_eq!(&back, b"from the owner");
    // Past the end nothing is touched.
    assert_eq!(
        theirs.write((1 << 20) - 2, b"abc"),
        SharedAccess::OutOfRange
    );

    // Read-only for peers: a write is refused, a read goes.
    let theirs_ro = peer.map_shared(owner.uid(), 1).await.unwrap();
    assert!(!theirs_ro.writable());
    assert_eq!(theirs_ro.write(0, b"x"), SharedAccess::OutOfRange);
    assert_eq!(theirs_ro.read(0, &mut back[..1]), SharedAccess::Done);
    // Not shared, on another server, or one's own: refused.
    let none = peer.map_shared(owner.uid(), 9).await.unwrap_err();
    assert!(none.to_string().contains("no region 9"), "{none}");
    let far = peer
        .map_shared("10.9.9.9:3".parse().unwrap(), 0)
        .await
        .unwrap_err();
    assert!(far.to_string().contains("another server"), "{far}");
    assert!(owner.map_shared(owner.uid(), 0).await.is_err());

    // The owner unshares region 1: its peer's mapping is withdrawn, the
    // owner's bytes stay.
    owner.unshare(1).await.unwrap();
    assert!(theirs_ro.is_withdrawn());
    assert_eq!(theirs_ro.read(0, &mut back[..1]), SharedAccess::Revoked);
    // The owner's session ends: region 0 is withdrawn from the peer.
    drop(rw);
    drop(ro);
    drop(owner);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !theirs.is_withdrawn() {
        assert!(
            std::time::Instant::now() < deadline,
            "the owner left and its memory stayed lent"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(theirs.write(0, b"late"), SharedAccess::Revoked);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_decide_who_maps_and_new_rules_withdraw_the_memory() {
    let (dir, daemon, owner, peer) = owner_and_peer("rules", "").await;
    let mine = owner.share(0, 8192, true).await.unwrap();
    let theirs = peer.map_shared(owner.uid(), 0).await.unwrap();
    assert_eq!(theirs.write(0, b"before"), SharedAccess::Done);

    // The operator denies the peer writes to the owner: the region is
    // withdrawn from everyone; the owner's bytes keep what came before.
    let rule = format!(
        "\n[[policy.rules]]\nsrc = \"{}\"\ndst = \"{}\"\ntypes = [\"WRTE\"]\naction = \"deny\"\n",
        peer.uid(),
        owner.uid()
    );
    let mut reloaded = config_with(&rule);
    reloaded.runtime_dir = Some(dir.clone());
    daemon.reload(&reloaded).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !theirs.is_withdrawn() {
        assert!(std::time::Instant::now() < deadline, "not withdrawn");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(mine.is_withdrawn());
    let mut seen = [0u8; 6];
    mine.memory().unwrap().read(0, &mut seen);
    assert_eq!(&seen, b"before");
    assert_eq!(theirs.write(0, b"after!"), SharedAccess::Revoked);
    // Shared again, the peer maps it read-only now.
    let _again = owner.share(0, 8192, true).await.unwrap();
    let ro = peer.map_shared(owner.uid(), 0).await.unwrap();
    assert!(!ro.writable());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_bounds_the_shared_memory_a_process_makes() {
    let dir = runtime("limits");
    let limits = "\n[limits]\nshared_per_resource = 2\nshared_mib = 1\n";
    let (_daemon, client) = embedded(config_with(limits), &dir).await.unwrap();
    let owner = client.attach("owner").await.unwrap();
    let big = owner.share(0, 2 << 20, true).await.unwrap_err();
    assert!(big.to_string().contains("limit"), "{big}");
    let zero = owner.share(0, 0, true).await.unwrap_err();
    assert!(zero.to_string().contains("at least one byte"), "{zero}");
    owner.share(0, 4096, true).await.unwrap();
    owner.share(1, 4096, true).await.unwrap();
    let third = owner.share(2, 4096, true).await.unwrap_err();
    assert!(third.to_string().contains("limit"), "{third}");
    let _ = std::fs::remove_dir_all(&dir);
}
