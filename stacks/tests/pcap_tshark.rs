//! Captures open in tshark: the frames, their EtherType and lengths are
//! what the capture wrapper wrote.

use std::process::Command;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::channel;
use uniplane_dataplane::{Message, Uid};
use uniplane_stacks::pcap::{Capture, PcapWriter};

/// Whether tshark can run here; fails the test instead when the test
/// script demands every tool (UNIPLANE_REQUIRE_TOOLS=1).
fn tshark_available() -> bool {
    let found = Command::new("tshark").arg("--version").output().is_ok();
    uniplane_netns::require_tool("pcap_tshark", (!found).then_some("tshark"))
}

#[tokio::test]
async fn tshark_reads_every_captured_message() {
    if !tshark_available() {
        return;
    }
    let path = std::env::temp_dir().join(format!("uniplane-capture-{}.pcap", std::process::id()));
    let (a, mut b) = channel::pair(16);
    let mut cap = Capture::new(a, PcapWriter::create(&path).unwrap());
    let src: Uid = "10.0.0.7:3".parse().unwrap();
    let dst: Uid = "10.0.0.9:1".parse().unwrap();
    for i in 0..5usize {
        let m =
            Message::send(src.port(80), dst.port(443), Bytes::from(vec![0x5a; 10 * i])).unwrap();
        cap.send(m).await.unwrap();
    }
    let back = Message::write(dst, src.at(0x40), Bytes::from_static(b"pong")).unwrap();
    b.send(back).await.unwrap();
    cap.next().await.unwrap().unwrap();
    cap.close().await.unwrap();
    drop(cap);

    let out = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args([
            "-T",
            "fields",
            "-e",
            "eth.type",
            "-e",
            "frame.len",
            "-e",
            "eth.src",
        ])
        .output()
        .expect("tshark runs");
    std::fs::remove_file(&path).ok();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), 6, "{text}");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row[0], "0x88b5", "{text}");
        let expected = if i < 5 { 14 + 32 + 10 * i } else { 14 + 32 + 4 };
        assert_eq!(row[1], expected.to_string(), "{text}");
    }
    // Sender MAC: the source UID 10.0.0.7:3 with the local bit set.
    assert_eq!(rows[0][2], "0a:00:00:07:00:03");
    assert_eq!(rows[5][2], "0a:00:00:09:00:01");
}
