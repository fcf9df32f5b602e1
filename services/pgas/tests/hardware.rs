//! A hardware endpoint: a `pgas-target` kernel device of the daemon is
//! rank 2 of a group whose ranks 0 and 1 are software endpoints. Every
//! request crosses the engine and the kernel device's emulated PCIe path;
//! the kernel answers on the one connection each software rank dials it.
//! Every wait has a deadline.

mod common;

use std::net::Ipv4Addr;
use std::path::PathBuf;

use common::within;
use uniplane_dataplane::Uid;
use uniplane_pgas::wire::MAX_FRAME;
use uniplane_pgas::{
    AtomicOp, Call, Completion, Endpoint, Group, HardwareStats, Options, PgasError, Refusal, Shape,
    Width, STATS_BYTES, STATS_SEGMENT,
};
use uniplane_services::client::{embedded, Client};
use uniplane_services::config::Config;
use uniplane_services::Daemon;

/// The hardware rank.
const HW: usize = 2;
/// Its kernel device's number.
const DEVICE: u16 = 9;
/// Bytes of each of its segments.
const SEG: usize = 256 * 1024;

/// Segment 0 read-write, 1 read-only, 2 rank 0's only.
fn config() -> String {
    format!(
        "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n\n\
         [[devices]]\nname = \"halo\"\nkind = \"kernel\"\ndevice = {DEVICE}\n\
         backend = \"emulated\"\nfunction = \"pgas-target\"\n\
         params = {{ segments = 3, segment_bytes = {SEG}, acl = \"rw,ro,0\" }}\n"
    )
}

struct Setup {
    daemon: Daemon,
    dir: PathBuf,
    eps: Vec<Endpoint>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.eps.clear();
        self.daemon.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Two software endpoints joined with the kernel device as rank 2.
async fn setup(name: &str) -> Setup {
    let dir = std::env::temp_dir().join(format!("uniplane-pgas-hw-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (daemon, _client) = embedded(Config::parse(&config(), name).unwrap(), &dir)
        .await
        .unwrap();
    let mut eps = Vec::new();
    for i in 0..2 {
        let session = Client::connect(daemon.runtime_dir())
            .await
            .unwrap()
            .attach(&format!("rank{i}"))
            .await
            .unwrap();
        eps.push(Endpoint::bind(session, Options::default()).await.unwrap());
    }
    let kernel = Uid::new(Ipv4Addr::LOCALHOST, DEVICE);
    let group = Group::new(vec![eps[0].uid(), eps[1].uid(), kernel]).with_hardware([HW]);
    let joins = eps.iter().map(|e| e.join(group.clone()));
    for r in within("join", futures_util::future::join_all(joins)).await {
        r.unwrap();
    }
    Setup { daemon, dir, eps }
}

/// What the kernel counted, read from its statistics segment.
async fn stats(ep: &Endpoint) -> HardwareStats {
    let bytes = within("stats", ep.get(HW, STATS_SEGMENT, 0, STATS_BYTES))
        .await
        .unwrap();
    HardwareStats::decode(&bytes).unwrap()
}

/// A xorshift stream for shapes and bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// A random shape inside the segment and its payload's length: one in
/// three contiguous (every fourth of those over 64 KiB, several frames),
/// strided or vectored.
fn random_shape(rng: &mut Rng, i: usize) -> (Shape, usize) {
    match i % 3 {
        0 => {
            let len = if i.is_multiple_of(4) {
                MAX_FRAME + 1 + rng.below(3 * MAX_FRAME as u64) as usize
            } else {
                1 + rng.below(4096) as usize
            };
            let offset = rng.below((SEG - len) as u64 + 1);
            (Shape::Contiguous { offset }, len)
        }
        1 => {
            let block = 1 + rng.below(2000) as u32;
            let stride = u64::from(block) + rng.below(3000);
            let count = 1 + rng.below(60) as u32;
            let span = stride * u64::from(count - 1) + u64::from(block);
            let offset = rng.below(SEG as u64 - span + 1);
            let shape = Shape::Strided {
                offset,
                stride,
                block,
                count,
            };
            (shape, block as usize * count as usize)
        }
        _ => {
            let pieces: Vec<(u64, u32)> = (0..1 + rng.below(40))
                .map(|_| {
                    let len = 1 + rng.below(5000) as u32;
                    (rng.below((SEG - len as usize) as u64 + 1), len)
                })
                .collect();
            let total = pieces.iter().map(|p| p.1 as usize).sum();
            (Shape::Vectored(pieces), total)
        }
    }
}

/// What `shape` does to `image` with `payload` (pieces in order, a later
/// piece over an earlier one).
fn apply(image: &mut [u8], shape: &Shape, payload: &[u8]) {
    let total = payload.len() as u64;
    let mut at = 0usize;
    for p in 0..shape.pieces(total) {
        let (offset, len) = shape.piece(p, total);
        let (offset, len) = (offset as usize, len as usize);
        image[offset..offset + len].copy_from_slice(&payload[at..at + len]);
        at += len;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn puts_of_random_shapes_land_in_the_kernel_and_read_back_byte_exact() {
    let s = setup("shapes").await;
    let a = &s.eps[0];
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut image = vec![0u8; SEG];
    let puts = 48;
    let mut multi_frame = 0;
    for i in 0..puts {
        let (shape, len) = random_shape(&mut rng, i);
        multi_frame += usize::from(len > MAX_FRAME);
        let payload = rng.bytes(len);
        apply(&mut image, &shape, &payload);
        // Half wait for their reply, half go async (answered only if
        // refused); every one signals the kernel's counter.
        let completion = if i.is_multiple_of(2) {
            Completion::Reply
        } else {
            Completion::Async
        };
        within(
            "put",
            a.long_shaped(HW, 0, shape, &payload, Call::counter(1), completion),
        )
        .await
        .unwrap();
    }
    within("quiet", a.quiet()).await.unwrap();
    // The puts that asked for one, and the quiet's flush.
    assert_eq!(a.replies(), puts as u64 / 2 + 1);
    assert!(multi_frame >= 3, "{multi_frame} puts over one frame");
    let back = within("get", a.get(HW, 0, 0, SEG)).await.unwrap();
    assert!(back.as_ref() == image.as_slice(), "the segment differs");
    // The other rank reads the same bytes from the kernel.
    let part = within("get", s.eps[1].get(HW, 0, 1000, 70_000))
        .await
        .unwrap();
    assert!(part.as_ref() == &image[1000..71_000]);
    // Short and medium messages run the built-in counter too.
    within("short", a.short(HW, Call::counter(100), Completion::Reply))
        .await
        .unwrap();
    within(
        "medium",
        a.medium(HW, Call::counter(1000), &[5; 3000], Completion::Reply),
    )
    .await
    .unwrap();
    within("quiet", a.quiet()).await.unwrap();
    let st = stats(a).await;
    assert_eq!(st.counter, puts as u64 + 1100);
    assert_eq!(st.target.malformed + st.target.out_of_bounds, 0, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn atomics_at_the_kernel_are_exact_under_two_hammering_endpoints() {
    let s = setup("atomics").await;
    const N: u64 = 300;
    let hammer = |ep: &Endpoint| {
        let ep = ep.clone();
        async move {
            let mut olds = Vec::new();
            for _ in 0..N {
                olds.push(
                    ep.atomic(HW, 0, 64, Width::W64, AtomicOp::FetchAdd(1))
                        .await?,
                );
                ep.atomic(HW, 0, 4, Width::W32, AtomicOp::FetchAdd(3))
                    .await?;
            }
            Ok::<_, PgasError>(olds)
        }
    };
    let (x, y) = within("hammer", async {
        tokio::join!(
            tokio::spawn(hammer(&s.eps[0])),
            tokio::spawn(hammer(&s.eps[1]))
        )
    })
    .await;
    let mut olds: Vec<u64> = x.unwrap().unwrap();
    olds.extend(y.unwrap().unwrap());
    olds.sort_unstable();
    assert_eq!(olds, (0..2 * N).collect::<Vec<_>>(), "every old value once");
    let a = &s.eps[0];
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    let bytes = within("get", a.get(HW, 0, 0, 72)).await.unwrap();
    assert_eq!(word(&bytes[64..72]), 2 * N);
    assert_eq!(
        u32::from_le_bytes(bytes[4..8].try_into().unwrap()),
        6 * N as u32
    );
    let cas = |expected, new| AtomicOp::CompareSwap { expected, new };
    let at = |op| a.atomic(HW, 0, 64, Width::W64, op);
    assert_eq!(within("cas", at(cas(2 * N, 7))).await.unwrap(), 2 * N);
    assert_eq!(
        within("cas", at(cas(2 * N, 8))).await.unwrap(),
        7,
        "no swap"
    );
    assert_eq!(within("swap", at(AtomicOp::Swap(9))).await.unwrap(), 7);
    let bytes = within("get", a.get(HW, 0, 64, 8)).await.unwrap();
    assert_eq!(word(&bytes), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_are_typed_at_the_sender_counted_at_the_kernel_and_write_nothing() {
    let s = setup("refusals").await;
    let (a, b) = (&s.eps[0], &s.eps[1]);
    let refused = |r: Result<(), PgasError>| match r {
        Err(PgasError::Refused { rank: HW, refusal }) => refusal,
        other => panic!("not refused by the kernel: {other:?}"),
    };
    let put = |ep: &Endpoint, segment, offset, len: usize, call| {
        let ep = ep.clone();
        async move {
            ep.long(
                HW,
                segment,
                offset,
                &vec![0xaa; len],
                call,
                Completion::Reply,
            )
            .await?;
            ep.quiet().await
        }
    };
    // Out of bounds, one frame and many.
    let r = within("oob", put(b, 0, (SEG - 4) as u64, 8, Call::NONE)).await;
    assert_eq!(refused(r), Refusal::OutOfBounds);
    let r = within("oob", put(b, 0, 1, SEG, Call::NONE)).await;
    assert_eq!(refused(r), Refusal::OutOfBounds);
    let r = within("no segment", put(b, 7, 0, 8, Call::NONE)).await;
    assert_eq!(refused(r), Refusal::NoSegment);
    let r = within("handler", put(b, 0, 0, 8, Call::handler(20, 1))).await;
    assert_eq!(refused(r), Refusal::NoHandler);
    let short = async {
        b.short(HW, Call::handler(16, 0), Completion::Async).await?;
        b.quiet().await
    };
    assert_eq!(refused(within("handler", short).await), Refusal::NoHandler);
    // Read-only segment 1, rank 0's segment 2, the statistics segment.
    let r = within("ro", put(b, 1, 0, 8, Call::NONE)).await;
    assert_eq!(refused(r), Refusal::Denied);
    let r = within("ranks", put(b, 2, 0, 8, Call::NONE)).await;
    assert_eq!(refused(r), Refusal::Denied);
    let r = within("stats", put(b, STATS_SEGMENT, 0, 8, Call::NONE)).await;
    assert_eq!(refused(r), Refusal::Denied);
    let atomic = b.atomic(HW, 1, 0, Width::W64, AtomicOp::Swap(1));
    match within("atomic", atomic).await {
        Err(PgasError::Refused {
            refusal: Refusal::Denied,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    match within("get", b.get(HW, 2, 0, 8)).await {
        Err(PgasError::Refused {
            refusal: Refusal::Denied,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // A medium payload over what the kernel gathers.
    let big = async {
        b.medium(HW, Call::counter(1), &vec![1; 100_000], Completion::Reply)
            .await?;
        b.quiet().await
    };
    assert_eq!(refused(within("medium", big).await), Refusal::TooLarge);
    // Nothing was written: every segment rank 0 may read is zero, and
    // rank 0 may write its own segment.
    for seg in 0..3 {
        let bytes = within("get", a.get(HW, seg, 0, SEG)).await.unwrap();
        assert!(bytes.iter().all(|&x| x == 0), "segment {seg} changed");
    }
    within("own", put(a, 2, 0, 8, Call::NONE)).await.unwrap();
    let st = stats(a).await;
    let t = st.target;
    assert_eq!(
        (
            t.out_of_bounds,
            t.no_segment,
            t.no_handler,
            t.denied,
            t.too_large
        ),
        (2, 1, 2, 5, 1),
        "{st:?}"
    );
    assert_eq!(st.counter, 0, "no refused message ran the counter");
    // The software ranks still meet in a barrier (the kernel does not
    // take part), after which both see everything they sent done.
    let (x, y) = within("barrier", async { tokio::join!(a.barrier(), b.barrier()) }).await;
    x.unwrap();
    y.unwrap();
}

#[test]
fn a_bad_pgas_target_parameter_is_refused_when_the_file_is_read_naming_the_device() {
    let text = config().replace("acl = \"rw,ro,0\"", "acl = \"rw,ro\"");
    let e = Config::parse(&text, "bad.toml").unwrap_err().to_string();
    assert!(
        e.contains("device `halo`") && e.contains("2 entries for 3 segments"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_endpoint_outside_the_kernels_group_is_refused_and_writes_nothing() {
    let s = setup("impostor").await;
    let session = Client::connect(s.daemon.runtime_dir())
        .await
        .unwrap()
        .attach("impostor")
        .await
        .unwrap();
    let impostor = Endpoint::bind(session, Options::default()).await.unwrap();
    // The group with the impostor in rank 0's place: the kernel knows the
    // caller of each connection from the daemon, and the group it serves.
    let kernel = Uid::new(Ipv4Addr::LOCALHOST, DEVICE);
    let forged = Group::new(vec![impostor.uid(), s.eps[1].uid(), kernel]).with_hardware([HW]);
    let refused = within("the impostor's join", impostor.join(forged)).await;
    assert!(
        matches!(
            refused,
            Err(PgasError::Refused {
                rank: HW,
                refusal: Refusal::Denied
            })
        ),
        "{refused:?}"
    );
    // The members are still served, and nothing was written.
    let a = &s.eps[0];
    let seg = within("get", a.get(HW, 0, 0, 64)).await.unwrap();
    assert!(seg.iter().all(|&b| b == 0));
    assert_eq!(stats(a).await.target.denied, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_next_job_gets_the_kernel_once_the_last_ones_connections_closed() {
    let mut s = setup("next-job").await;
    let kernel = Uid::new(Ipv4Addr::LOCALHOST, DEVICE);
    s.eps[0]
        .long(HW, 0, 0, b"job one", Call::NONE, Completion::Reply)
        .await
        .unwrap();
    within("quiet", s.eps[0].quiet()).await.unwrap();
    // The first job ends: its connections close, and the daemon tells the
    // kernel so (a connection's Close), which then forgets the group.
    s.eps.clear();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let next = loop {
        let session = Client::connect(s.daemon.runtime_dir())
            .await
            .unwrap()
            .attach("job-two")
            .await
            .unwrap();
        let ep = Endpoint::bind(session, Options::default()).await.unwrap();
        let group = Group::new(vec![ep.uid(), kernel]).with_hardware([1]);
        match within("join", ep.join(group)).await {
            Ok(()) => break ep,
            Err(PgasError::Refused {
                refusal: Refusal::Denied,
                ..
            }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the next job was not admitted: {e}"),
        }
    };
    // The kernel's memory outlives the job, as a device's does.
    let got = within("get", next.get(1, 0, 0, 7)).await.unwrap();
    assert_eq!(&got[..], b"job one");
}
